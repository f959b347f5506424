"""Fixtures: the embedded SmolLM2, HF transformers on its weights, and random PEFT adapters."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lora_helpers import ADAPTERS, write_adapter
from tests.conftest import hf_smollm2, smollm2_path  # noqa: F401 (the root suite's fixtures)


@pytest.fixture(scope="session")
def adapter_paths(tmp_path_factory, hf_smollm2) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: write_adapter(str(root / name), hf_smollm2[0].config, rank, targets, seed=i, alpha=alpha,
                                use_rslora=rslora)
            for i, (name, (rank, targets, alpha, rslora)) in enumerate(ADAPTERS.items())}


@pytest.fixture(scope="session")
def peft_model(hf_smollm2, adapter_paths):
    """HF + PEFT with every adapter loaded (on a copy: PEFT rewrites the model it wraps)."""
    import copy

    from peft import PeftModel

    names = list(adapter_paths)
    model = PeftModel.from_pretrained(copy.deepcopy(hf_smollm2[0]), adapter_paths[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(adapter_paths[name], adapter_name=name)
    return model.eval()
