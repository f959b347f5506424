"""Copy-engine sums on two real GPUs: prefill steps of up to 4096 tokens sum every layer's partials
by DMA copies into the peers' symmetric buffers, and greedy tokens equal transformers' (a missing
stream wait, a barrier short or a buffer reused early shows up as other tokens)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from fastllm import LLM, SamplingParams
from fastllm.platforms.copy_engine_sums import CopyEngineSums
from fastllm.testing.models import save_tiny_checkpoint
from tests.conftest import TINY_LLAMA, hf_greedy

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

# float32 rows of 1024: steps of more than 1024 tokens (4 MiB) sum by copy engine, in row chunks
SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=1024, max_position_embeddings=2048)
TINY_SHAPE = {key: value for key, value in TINY_LLAMA.items() if key not in ("architectures", "model_type")}
LENGTHS = [900, 400, 1300, 640, 770, 200]
PROMPTS = [[(7 * i + 3 * j) % 1000 + 5 for j in range(length)] for i, length in enumerate(LENGTHS + [100] * 8)]


@pytest.mark.parametrize("config_cls, sequence_parallel", [(LlamaConfig, "1"), (LlamaConfig, "0"), (Qwen2Config, "1")])
def test_copy_engine_sums_match_transformers(tmp_path, monkeypatch, config_cls, sequence_parallel):
    """Sequence parallel (the default for a dense model): the norms reduce-scatter, normalise their
    rank's rows and gather them under the next GEMM (Qwen2: with the query/key/value biases); "0":
    every rank sums and normalises all rows."""
    monkeypatch.setenv("FASTLLM_SEQUENCE_PARALLEL_SUMS", sequence_parallel)
    calls = []  # rank 0's runner is in this process
    method = "reduce_scatter" if sequence_parallel == "1" else "exchange"
    original = getattr(CopyEngineSums, method)
    monkeypatch.setattr(CopyEngineSums, method, lambda self, x: calls.append(x.shape[0]) or original(self, x))
    path = save_tiny_checkpoint(config_cls(**{**TINY_SHAPE, **SHAPE}), str(tmp_path))
    llm = LLM(path, tensor_parallel_size=2, dtype="float32", max_num_batched_tokens=4096, enforce_eager=True,
              num_gpu_blocks_override=400, block_size=16)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        outputs = [output for batch in (PROMPTS[:len(LENGTHS)], PROMPTS[len(LENGTHS):])
                   for output in llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)]
    finally:
        llm.shutdown()
    assert max(calls, default=0) > 1024, f"no step summed by copy engine's {method}"
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert [o.outputs.token_ids for o in outputs] == [hf_greedy(hf, p, 16) for p in PROMPTS]
