"""Adapters in captured decode graphs: each token's slot is a static graph input, placed like its
token id, and loading an adapter overwrites the slot tensors the graphs read, never replaces them.

CPUs have no CUDA graphs: the root suite's stand-in replays the captured forward eagerly over the
static buffers (``tests/engine/test_cuda_graphs.py``), which checks everything around the capture.
"""

from __future__ import annotations

from fastllm import LLM, LoRARequest, SamplingParams
from tests.engine.test_cuda_graphs import _eager_graphs

from lora_helpers import ADAPTERS, peft_greedy

MAX_TOKENS = 5
PROMPT = "The capital of France is"


def test_decode_graphs_replay_each_tokens_adapter(smollm2_path, adapter_paths, peft_model, hf_smollm2):
    # Two slots for three adapters: the last prompts load over the first ones' slots.
    llm = LLM(smollm2_path, enable_lora=True, max_loras=2, max_cpu_loras=3, max_lora_rank=16, block_size=16,
              max_model_len=128, num_gpu_blocks_override=64, max_num_seqs=3)
    runner = llm.engine.runner.runner
    graphs = _eager_graphs(runner, 3)
    wrappers = [wrapper for wrapper, _ in runner.adapters.layers.values()]
    addresses = [(w.lora_a.data_ptr(), w.lora_b.data_ptr(), w.scale.data_ptr()) for w in wrappers]
    replayed = []
    run = graphs.run
    graphs.run = lambda ids, pos, meta, batch: replayed.append(batch is not None) or run(ids, pos, meta, batch)

    adapters = [None, "qv8", "all16", "mlp4"]
    requests = [LoRARequest(name, i + 1, adapter_paths[name]) if name else None for i, name in enumerate(adapters)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    got = [out.completions[0].token_ids for out in llm.generate([PROMPT] * 4, params, lora_request=requests,
                                                              use_tqdm=False)]

    ids = hf_smollm2[1](PROMPT)["input_ids"]
    assert got == [peft_greedy(peft_model, name, ids, MAX_TOKENS) for name in adapters]
    assert len(set(map(tuple, got))) > 2  # the adapters do change the output
    assert any(replayed) and set(ADAPTERS) <= set(adapters)
    assert addresses == [(w.lora_a.data_ptr(), w.lora_b.data_ptr(), w.scale.data_ptr()) for w in wrappers]
