"""Registers multi-LoRA serving on fastllm's ``adapter_managers`` hook and ``fastllm merge-lora``."""

from __future__ import annotations

from fastllm.registry import hookimpl


@hookimpl
def register_adapter_managers():
    from fastllm_lora.manager import LoRAManager

    return {"lora": LoRAManager}


@hookimpl
def register_cli_commands():
    from fastllm_lora.merge import register

    return {"merge-lora": register}
