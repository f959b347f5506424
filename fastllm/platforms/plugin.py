"""Registers fastllm's built-in platforms."""

from fastllm.platforms.cpu import CpuPlatform
from fastllm.platforms.cuda import CudaPlatform
from fastllm.registry import hookimpl


@hookimpl
def register_platforms():
    return {"cpu": CpuPlatform, "cuda": CudaPlatform}
