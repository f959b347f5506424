"""Suite-wide fixtures (tests/, kernels/tests and the plugins' tests all sit below this file)."""

from __future__ import annotations

import functools
import os
from typing import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs a worker a core), each worker's torch takes its share
    of the cores: more OpenMP threads than cores spin against each other and slow every worker."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


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


# The CPU platform's default KV budget (cpu_kv_cache_gib=2.0) is sized for serving: a 2-layer test
# model gets 131,072 blocks, and zeroing them and building their pool cost seconds per engine.
# Under test an engine that leaves cpu_kv_cache_gib unset gets this, still 11,000 SmolLM2 tokens
# (more than its context); a test that sizes its cache itself keeps its own figure.
TEST_CPU_KV_CACHE_GIB = 0.5


@pytest.fixture(scope="session", autouse=True)
def cpu_kv_cache_sized_for_tests() -> Iterator[None]:
    from fastllm.platforms.cpu import CpuPlatform

    serving_budget = CpuPlatform.kv_cache_budget

    def kv_cache_budget(self, profile_peak, engine_config) -> int:
        if "cpu_kv_cache_gib" in engine_config.model_fields_set:
            return serving_budget(self, profile_peak, engine_config)
        return int(TEST_CPU_KV_CACHE_GIB * 2**30)

    patch = pytest.MonkeyPatch()
    patch.setattr(CpuPlatform, "kv_cache_budget", kv_cache_budget)
    yield
    patch.undo()
