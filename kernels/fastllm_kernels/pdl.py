"""Programmatic dependent launch (Hopper and later): a kernel's programs start while the kernel
before it in the stream, or in the CUDA graph, is still running.

A batch-1 decode step is a chain of ~10 kernels a layer, each a few microseconds long, and each
used to pay for its own launch and for its first loads' round trip to memory. A kernel launched
dependent calls ``wait_for_inputs`` before it reads anything an earlier kernel wrote and before
its first store; what it loads before that must be data no kernel of the step writes (parameters:
a GEMV's weights and scales, norm weights, the router's bias; step inputs copied in before the step:
positions, cache slots, decode attention's lengths and block tables; cache entries of earlier steps),
so those loads run under the previous kernel. ``wait_for_inputs`` waits for the previous kernel to
finish (which waited for its own predecessor, and so on), then lets the next kernel launch; the
RMSNorm lets it launch first, so that two GEMVs with a norm between them overlap.

``FASTLLM_PDL=0`` launches every kernel the ordinary way.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from fastllm_kernels.device import compiled_nvidia

try:
    from triton.backends.nvidia.compiler import CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _TRITON_HAS_PDL = "launch_pdl" in CUDAOptions.__dataclass_fields__
except ImportError:  # a Triton without grid dependency control: kernels launch the ordinary way
    _TRITON_HAS_PDL = False
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def wait_for_inputs(PDL: tl.constexpr, RELEASE_FIRST: tl.constexpr = False):
    """Wait until the kernel before has finished and its writes are visible, and let the kernel
    after this one start launching: after the wait, or, with ``RELEASE_FIRST``, before it. Call
    it in every program, unconditionally.

    ``RELEASE_FIRST`` is the RMSNorm's: between two GEMVs (o_proj or down_proj, then qkv_proj
    or gate_up_proj), one program a token, so the second GEMV launches while the first is in
    its last wave and loads its first weights into the SMs that wave frees. Only the norm
    releases first: a kernel launched early beside a split-K GEMV or the attention slows both.
    A GEMV releases after its wait: its successor launches once its last wave has started,
    never taking an SM from one of its waves. Correctness does not depend on when: every kernel
    waits before it reads an earlier kernel's output or stores, and completes only after its
    wait. Measured effects: ``benchmarks/RESULTS.md``."""
    if PDL:
        if RELEASE_FIRST:
            gdc_launch_dependents()
        gdc_wait()
        if not RELEASE_FIRST:
            gdc_launch_dependents()


@triton.jit
def wait_for_inputs_held(PDL: tl.constexpr):
    """Wait as ``wait_for_inputs`` does but do not let the next kernel launch: it launches when
    every program has called ``release_dependents`` or exited. For a kernel whose last program
    finishes the work alone (an arrival counter): the next kernel's programs, launched early,
    would sit in the SMs' places waiting on it, and a second stream's kernels could not start."""
    if PDL:
        gdc_wait()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """Let the next kernel launch (after ``wait_for_inputs_held``)."""
    if PDL:
        gdc_launch_dependents()


@functools.lru_cache(maxsize=None)
def _enabled(device: torch.device) -> bool:
    if not _TRITON_HAS_PDL or not compiled_nvidia(device):
        return False
    if os.environ.get("FASTLLM_PDL", "1") == "0":
        return False
    runtime = tuple(int(part) for part in (torch.version.cuda or "0.0").split(".")[:2])
    # CUDA graphs keep dependent launches from CUDA 12.3 on
    return runtime >= (12, 3) and torch.cuda.get_device_capability(device)[0] >= 9


def pdl_launch(device: torch.device) -> dict[str, bool]:
    """Keyword arguments for a launch of a kernel that takes a ``PDL`` constexpr and calls
    ``wait_for_inputs(PDL)``: dependent on CUDA devices of compute capability 9.0 or later."""
    if _enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
