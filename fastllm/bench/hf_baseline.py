"""HF transformers ``generate`` on the same prompts and weights, for side-by-side throughput."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from fastllm.bench.datasets import BenchRequest


def load_hf_model(model: str, load_format: str, dtype: torch.dtype, device: torch.device, hf_config: Any):
    from transformers import AutoModelForCausalLM

    if load_format == "gguf":
        import os
        hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(model)),
                                                  gguf_file=os.path.basename(model), dtype=dtype)
    elif load_format == "dummy":
        with torch.device(device):  # random init where the model runs: minutes faster for 8B on a GPU
            hf = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    else:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    return hf.to(device).eval()


@torch.inference_mode()
def hf_generate_throughput(hf_model: Any, requests: list[BenchRequest], batch_size: int,
                           pad_token_id: int, synchronize: Callable[[], None]) -> tuple[float, int]:
    """(seconds, output tokens) for batched greedy ``generate`` with left padding, eos ignored;
    ``synchronize``: the platform's, so the clock stops when the device is done.

    The tokens counted are the ones the requests asked for, as vLLM counts them: a batch runs to its
    longest request, and the extra tokens its shorter rows compute are HF's cost, not output.
    """
    device = next(hf_model.parameters()).device
    total_out, start = 0, time.perf_counter()
    for i in range(0, len(requests), batch_size):
        chunk = requests[i:i + batch_size]
        width = max(len(r.prompt_token_ids) for r in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(chunk):
            ids[row, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
            mask[row, width - len(r.prompt_token_ids):] = 1
        new_tokens = max(r.output_len for r in chunk)
        hf_model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                          max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_token_id)
        total_out += sum(r.output_len for r in chunk)
    synchronize()
    return time.perf_counter() - start, total_out
