"""The plugin conformance kit: checks a plugin author calls from their own tests.

Each module serves one registry kind and asserts outcomes against a reference, never that a
call merely ran:

- ``fastllm.testing.models``: a model's greedy output equals HF transformers' on a tiny random
  checkpoint (``save_tiny_checkpoint`` + ``assert_greedy_matches_hf``).
- ``fastllm.testing.parsers``: a reasoning or tool parser's streaming result equals its one-shot
  parse for every way of cutting the text into chunks (``assert_streaming_matches_extract``).
- ``fastllm.testing.quantizers``: a quantizer's layer computes what the float layer computes,
  within a relative error bound (``assert_quantized_linear_close``).

The in-tree plugins and ``examples/fastllm-plugin-example`` test themselves with these.
"""
