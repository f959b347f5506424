"""Registers multi-LoRA serving on fastllm's ``adapter_managers`` hook."""

from __future__ import annotations

from fastllm.registry import hookimpl


@hookimpl
def register_adapter_managers():
    from fastllm_lora.manager import LoRAManager

    return {"lora": LoRAManager}
