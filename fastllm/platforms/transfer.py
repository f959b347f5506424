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
    return to_device_with_host(values, dtype, device)[1]


def to_device_with_host(values: Sequence[int | float], dtype: torch.dtype,
                        device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Like ``to_device``, and the host tensor it was copied from (on the CPU, the same tensor),
    which the host may read without waiting for the device."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type != "cpu")
    return host, host if device.type == "cpu" else host.to(device, non_blocking=True)


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
