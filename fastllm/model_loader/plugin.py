"""Registers fastllm's built-in weight formats."""

from fastllm.model_loader.dummy_loader import DummyLoader
from fastllm.model_loader.gguf_loader import GGUFLoader
from fastllm.model_loader.safetensors_loader import SafetensorsLoader
from fastllm.registry import hookimpl


@hookimpl
def register_load_formats():
    return {"gguf": GGUFLoader, "safetensors": SafetensorsLoader, "dummy": DummyLoader}
