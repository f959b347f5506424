"""torch.profiler traces of chosen steps, on every rank that holds a runner.

Where a multi-GPU step's time goes cannot be read off rank 0 alone: a worker that falls behind
shows up on rank 0 only as longer collectives. With ``FASTLLM_TORCH_PROFILER_DIR`` set, every
process that holds a model shard (rank 0 in the engine's process, tensor-parallel workers,
data-parallel replicas) records what runs between ``LLM.start_profile()`` and ``stop_profile()``,
and the windows of steps ``FASTLLM_TORCH_PROFILER_STEPS`` names ("first:count,...", counted from
the first step after start-up the same way on every rank, so a window holds the same steps
everywhere). Each recording goes to ``DIR/{host}-{device}-{pid}-{label}.json.gz`` (a Chrome trace:
CPU ops, device kernels, copies), beside the CUDA allocator's counters at its end
(``.memory.json``: cudaMalloc / cudaFree calls and retries, which synchronize). The directory is
the operator's, read from the environment, never a client's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any, Optional

import torch

logger = logging.getLogger("fastllm")

DIR_ENV = "FASTLLM_TORCH_PROFILER_DIR"
STEPS_ENV = "FASTLLM_TORCH_PROFILER_STEPS"
MEMORY_STATS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                "reserved_bytes.all.current", "reserved_bytes.all.peak", "allocated_bytes.all.peak")


def profile_directory() -> str:
    """Where profiles go; starting one without it is a clear error, not a silent no-op."""
    directory = os.environ.get(DIR_ENV, "")
    if not directory:
        raise RuntimeError(f"set {DIR_ENV} to the directory the profiles go to before starting one")
    return directory


def parse_windows(spec: str) -> list[tuple[int, int]]:
    """``"100:3,900:2"`` -> ``[(100, 3), (900, 2)]``: (first step, steps), ordered, not overlapping."""
    windows = []
    for part in filter(None, (piece.strip() for piece in spec.split(","))):
        first, _, count = part.partition(":")
        try:
            window = (int(first), int(count or 1))
        except ValueError:
            raise ValueError(f"{STEPS_ENV}={spec!r}: expected first:count[,first:count...]") from None
        if window[0] < 0 or window[1] < 1 or (windows and window[0] < sum(windows[-1])):
            raise ValueError(f"{STEPS_ENV}={spec!r}: windows must start at 0 or later, hold a step "
                             "and follow each other without overlap")
        windows.append(window)
    return windows


class StepProfiler:
    """``step()`` once before each step's work; records the configured windows of steps, and
    whatever runs between ``start()`` and ``stop()`` (``LLM.start_profile`` / ``stop_profile``)."""

    def __init__(self, device: torch.device, directory: Optional[str] = None, windows: Optional[str] = None):
        self.directory = directory if directory is not None else os.environ.get(DIR_ENV, "")
        self.windows = parse_windows(windows or os.environ.get(STEPS_ENV, "")) if self.directory else []
        self.device = device
        self.steps = 0
        self.active: Optional[Any] = None
        self.label = ""

    @property
    def enabled(self) -> bool:
        return bool(self.windows) or self.active is not None

    def step(self) -> None:
        """Close a window that has seen its steps, then open one that starts at this step."""
        if not self.enabled:
            return
        if self.active is not None and self.windows and self.steps == sum(self.windows[0]):
            self.windows.pop(0)
            self._stop()
        if self.active is None and self.windows and self.steps == self.windows[0][0]:
            self._start(f"step{self.steps}")
        self.steps += 1

    def start(self, directory: Optional[str] = None) -> None:
        """Record from now until ``stop``, in place of any step window still to come; into
        ``directory`` where given (rank 0's, for ranks on nodes without the variable)."""
        self.directory = directory or self.directory or profile_directory()
        if self.active is None:
            self.windows = []
            self._start(f"start{self.steps}")

    def stop(self) -> None:
        if self.active is not None:
            self._stop()

    def switch(self, on: bool, directory: Optional[str] = None) -> None:
        """``start`` (into ``directory``) or ``stop``: what the executors pass on to every rank."""
        if on:
            self.start(directory)
        else:
            self.stop()

    def _start(self, label: str) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.active, self.label = profile(activities=activities), label
        self.active.__enter__()

    def _stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        profile, self.active = self.active, None
        profile.__exit__(None, None, None)
        os.makedirs(self.directory, exist_ok=True)
        name = f"{socket.gethostname()}-{self.device.type}{self.device.index or 0}-{os.getpid()}-{self.label}.json.gz"
        path = os.path.join(self.directory, name)
        profile.export_chrome_trace(path)
        if self.device.type == "cuda":  # allocator retries free cached blocks with a device-wide sync
            stats = {key: value for key, value in torch.cuda.memory_stats(self.device).items()
                     if key in MEMORY_STATS}
            with open(path.replace(".json.gz", ".memory.json"), "w") as f:
                json.dump(stats, f)
        logger.info("profile %s written to %s", self.label, path)
