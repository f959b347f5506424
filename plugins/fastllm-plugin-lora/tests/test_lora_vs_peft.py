"""Greedy output equal to HF transformers + PEFT, token for token, in one batch that mixes adapters
of different ranks and targets with base-model requests; through chunked prefill, more adapters
than device slots and host copies, and the prefix cache."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from fastllm import LLM, LoRARequest, SamplingParams

from lora_helpers import ADAPTERS, peft_greedy, write_adapter

MAX_TOKENS = 6
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    # Two device slots and two host copies for three adapters; a 48-token step budget chunks prompts.
    return LLM(smollm2_path, enable_lora=True, max_loras=2, max_cpu_loras=2, max_lora_rank=16,
               enable_prefix_caching=True, block_size=16, max_num_batched_tokens=48, max_model_len=512,
               num_gpu_blocks_override=96, max_num_seqs=16)


@pytest.fixture(scope="module")
def requests(adapter_paths) -> dict[str, LoRARequest]:
    return {name: LoRARequest(name, i + 1, adapter_paths[name]) for i, name in enumerate(ADAPTERS)}


def test_mixed_batch_matches_peft(llm, requests, peft_model, hf_smollm2):
    tokenizer = hf_smollm2[1]
    cases = [(prompt, adapter) for prompt in PROMPTS for adapter in [None, *ADAPTERS]]
    outputs = llm.generate([prompt for prompt, _ in cases], SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
                           lora_request=[requests[a] if a else None for _, a in cases], use_tqdm=False)

    got = {case: out.completions[0].token_ids for case, out in zip(cases, outputs)}
    for (prompt, adapter), tokens in got.items():
        ids = tokenizer(prompt)["input_ids"]
        assert tokens == peft_greedy(peft_model, adapter, ids, MAX_TOKENS), (prompt, adapter)
    for prompt in PROMPTS:  # the adapters do change the output
        assert len({tuple(got[(prompt, a)]) for a in [None, *ADAPTERS]}) > 2


def test_prefix_cache_is_shared_by_one_adapter_only(llm, requests, hf_smollm2):
    prompt = "A prompt long enough to fill two cache blocks of sixteen tokens each, " * 3
    full_blocks = (len(hf_smollm2[1](prompt)["input_ids"]) - 1) // 16
    params = SamplingParams(max_tokens=2, temperature=0)
    qv8, all16 = requests["qv8"], requests["all16"]

    first = llm.generate(prompt, params, lora_request=qv8, use_tqdm=False)[0]
    other = llm.generate(prompt, params, lora_request=all16, use_tqdm=False)[0]
    base = llm.generate(prompt, params, use_tqdm=False)[0]
    again = llm.generate(prompt, params, lora_request=qv8, use_tqdm=False)[0]

    assert first.num_cached_tokens == other.num_cached_tokens == base.num_cached_tokens == 0
    assert full_blocks >= 2 and again.num_cached_tokens == 16 * full_blocks
    assert again.completions[0].token_ids == first.completions[0].token_ids


def _broken(path, hf_config, kind: str) -> str:
    """An adapter that must be refused: rank over the limit, an unknown module, a wrong shape."""
    write_adapter(path, hf_config, 32 if kind == "rank" else 4, ["q_proj"], seed=9, layers=1)
    if kind != "rank":
        tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
        prefix = "base_model.model.model.layers.0."
        if kind == "module":
            tensors[prefix + "mlp.fc1.lora_A.weight"] = torch.zeros(4, 8)
            tensors[prefix + "mlp.fc1.lora_B.weight"] = torch.zeros(8, 4)
        else:
            tensors[prefix + "self_attn.q_proj.lora_A.weight"] = torch.zeros(4, 7)
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    return path


def test_a_bad_adapter_fails_only_its_request(llm, requests, tmp_path, hf_smollm2):
    config = hf_smollm2[0].config
    bad = {"missing": str(tmp_path / "nowhere"), **{kind: _broken(str(tmp_path / kind), config, kind)
                                                    for kind in ("rank", "module", "shape")}}
    lora = [requests["qv8"]] + [LoRARequest(kind, 100 + i, path) for i, (kind, path) in enumerate(bad.items())]
    lora.append(LoRARequest("impostor", requests["qv8"].lora_int_id, bad["rank"]))

    outputs = llm.generate(["Hello"] * len(lora), SamplingParams(max_tokens=2, temperature=0),
                           lora_request=lora, use_tqdm=False)

    messages = [out.error_msg for out in outputs[1:]]
    assert [out.error_code for out in outputs] == [200] + [400] * 5
    for message, expected in zip(messages, ["not found", "exceeds max_lora_rank=16", "unknown target module",
                                            "expected (4, 576)", "already names adapter 'qv8'"]):
        assert expected in message
    assert len(outputs[0].completions[0].token_ids) == 2
