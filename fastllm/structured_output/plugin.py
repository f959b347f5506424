"""Registers ``auto``, the router over whichever structured-output backends are installed."""

from typing import Any

from fastllm.registry import hookimpl
from fastllm.structured_output.router import auto_backend


@hookimpl
def register_structured_output_backends() -> dict[str, Any]:
    return {"auto": auto_backend}
