"""Fixtures: the embedded SmolLM2, HF transformers on its weights, and random PEFT adapters."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fastllm.model_loader.resolve import embedded_model_path

from lora_helpers import write_adapter

# name -> (rank, targets, alpha, rsLoRA): different ranks, target sets and scalings.
ADAPTERS = {
    "qv8": (8, ["q_proj", "v_proj"], 16, False),
    "all16": (16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 32, True),
    "mlp4": (4, ["o_proj", "gate_proj", "up_proj", "down_proj"], 8, False),
}


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return embedded_model_path()


@pytest.fixture(scope="session")
def hf_base(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(smollm2_path), os.path.basename(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.fixture(scope="session")
def adapter_paths(tmp_path_factory, hf_base) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: write_adapter(str(root / name), hf_base[0].config, rank, targets, seed=i, alpha=alpha,
                                use_rslora=rslora)
            for i, (name, (rank, targets, alpha, rslora)) in enumerate(ADAPTERS.items())}


@pytest.fixture(scope="session")
def peft_model(hf_base, adapter_paths):
    """HF + PEFT with every adapter loaded (on a copy: PEFT rewrites the model it wraps)."""
    import copy

    from peft import PeftModel

    names = list(adapter_paths)
    model = PeftModel.from_pretrained(copy.deepcopy(hf_base[0]), adapter_paths[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(adapter_paths[name], adapter_name=name)
    return model.eval()


def peft_greedy(model, adapter: str | None, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """PEFT's greedy tokens with ``adapter`` active, or the base model's for None."""
    import contextlib

    if adapter is not None:
        model.set_adapter(adapter)
    with torch.inference_mode(), (model.disable_adapter() if adapter is None else contextlib.nullcontext()):
        out = model.generate(input_ids=torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=2)
    return out[0, len(prompt_ids):].tolist()
