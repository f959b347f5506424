"""LoRA under tensor parallelism: each rank holds its shards of A and B (gloo on the CPU), and the
greedy tokens are PEFT's. SmolLM2's 9 query and 3 key/value heads split over 3 ranks."""

from __future__ import annotations

from fastllm import LLM, LoRARequest, SamplingParams

from lora_helpers import peft_greedy

MAX_TOKENS = 4
PROMPT = "The capital of France is"


def test_tp3_mixed_batch_matches_peft(smollm2_path, adapter_paths, peft_model, hf_smollm2):
    adapters = [None, "all16", "qv8"]  # all16: every projection, row-parallel o/down included
    llm = LLM(smollm2_path, tensor_parallel_size=3, enable_lora=True, max_loras=2, max_lora_rank=16,
              block_size=16, max_model_len=128, num_gpu_blocks_override=32, max_num_seqs=4)
    try:
        requests = [LoRARequest(name, i + 1, adapter_paths[name]) if name else None for i, name in enumerate(adapters)]
        outputs = llm.generate([PROMPT] * 3, SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
                               lora_request=requests, use_tqdm=False)
    finally:
        llm.shutdown()
    ids = hf_smollm2[1](PROMPT)["input_ids"]
    got = [out.completions[0].token_ids for out in outputs]
    assert got == [peft_greedy(peft_model, name, ids, MAX_TOKENS) for name in adapters]
    assert got[1] != got[0]
