"""Model conformance: greedy output equal to HF transformers, token for token, on tiny random weights."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch

from fastllm.llm import LLM
from fastllm.sampling_params import SamplingParams


def save_tiny_checkpoint(hf_config: Any, directory: str, seed: int = 0, tokenizer: Any = None) -> str:
    """Build transformers' own model for ``hf_config`` with seeded random float32 weights and save
    it (safetensors, plus ``tokenizer`` when given) in ``directory``; return the directory.
    ``hf_config.architectures``, when set, names the class fastllm builds (a plugin's own)."""
    from transformers import AutoModelForCausalLM

    architectures = list(getattr(hf_config, "architectures", None) or [])  # save_pretrained overwrites it
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    if architectures:
        hf_config.architectures = architectures
        path = os.path.join(directory, "config.json")
        with open(path) as f:
            saved = json.load(f)
        with open(path, "w") as f:
            json.dump({**saved, "architectures": architectures}, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


def hf_greedy(model: Any, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """HF transformers' greedy continuation of one prompt (no padding, no sampling)."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def assert_greedy_matches_hf(model_dir: str, prompts: list[list[int]], max_new_tokens: int = 8,
                             hf_model: Optional[Any] = None, llm: Optional[LLM] = None,
                             **llm_kwargs: Any) -> LLM:
    """fastllm's greedy tokens for ``prompts`` (token ids, one batch) equal HF's for each prompt.

    ``hf_model`` defaults to ``AutoModelForCausalLM.from_pretrained(model_dir)`` in float32;
    ``llm_kwargs`` (e.g. ``max_num_batched_tokens``, ``num_gpu_blocks_override``,
    ``enable_prefix_caching``, ``tensor_parallel_size``) pick the engine path to check.
    Returns the engine, so a caller can check more (e.g. that every KV block came back).
    """
    if hf_model is None:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = [hf_greedy(hf_model, ids, max_new_tokens) for ids in prompts]
    if llm is None:
        llm = LLM(os.fspath(model_dir), **{"dtype": "float32", **llm_kwargs})
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    for index, (output, want) in enumerate(zip(outputs, expected)):
        assert output.error_code == 200, f"prompt {index}: {output.error_msg}"
        assert output.outputs.token_ids == want, (
            f"prompt {index} diverged from HF: {output.outputs.token_ids} vs {want}")
    return llm
