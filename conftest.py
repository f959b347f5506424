"""Suite-wide fixtures (tests/, kernels/tests and the plugins' tests all sit below this file)."""

from __future__ import annotations

import functools
import os
from typing import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def gguf_tensors_read_once() -> Iterator[None]:
    """Dequantizing a GGUF file's tensors takes seconds in Python, and the suite builds dozens of
    engines on the embedded SmolLM2: each test process does it once per file. Loaders only copy
    from the tensors they are given, so every engine still gets the file's exact values.
    (Imported here, not at the top: tests/conftest.py picks the Triton mode before fastllm loads.)"""
    from fastllm.model_loader import gguf_loader

    read = gguf_loader.read_tensors

    @functools.lru_cache(maxsize=1)  # one file's float32 tensors held at a time
    def tensors_of(path: str, size: int, mtime_ns: int) -> list[tuple[str, object]]:
        return list(read(path))

    def read_tensors(path: str) -> Iterator[tuple[str, object]]:
        stat = os.stat(path)
        yield from tensors_of(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)

    patch = pytest.MonkeyPatch()
    patch.setattr(gguf_loader, "read_tensors", read_tensors)
    yield
    patch.undo()
