"""Copies between host and device that never make the host wait for the device.

A CUDA copy from pageable host memory first waits for the stream to drain, and reading a
device tensor on the host waits for every kernel queued before it. Either would stall the
host behind the step that is running, so step inputs go up through pinned memory and results
come back into pinned memory, with an event to wait on only when the host needs them.
"""

from __future__ import annotations

from typing import Sequence

import torch


def to_device(values: Sequence[int | float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, queued behind the stream's work instead of waiting for it."""
    host = host_tensor(values, dtype, device)
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


def host_tensor(values: Sequence[int | float] | bytes, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (or raw bytes of ``dtype``) in host memory that a copy to ``device`` reads without
    making the host wait: pinned, unless ``device`` is the CPU."""
    pin = device.type != "cpu"
    if not isinstance(values, bytes):
        return torch.tensor(values, dtype=dtype, pin_memory=pin)
    plain = torch.frombuffer(bytearray(values), dtype=dtype)
    return torch.empty_like(plain, pin_memory=True).copy_(plain) if pin else plain


class HostCopy:
    """Device tensors on their way to the host; ``wait()`` returns them once they have arrived."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self._event = None
        if tensors and tensors[0].device.type == "cuda":
            self._tensors = [t.to("cpu", non_blocking=True) for t in tensors]
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._tensors = [t.cpu() for t in tensors]

    def wait(self) -> list[torch.Tensor]:
        if self._event is not None:
            self._event.synchronize()
        return self._tensors
