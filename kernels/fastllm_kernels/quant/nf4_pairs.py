"""NF4 values two codes at a time, from a table of value pairs in shared memory (CUDA only).

A code-book format cannot be unpacked with arithmetic: every weight is a lookup. Looked up
one code at a time from registers (a warp shuffle a weight), the batch-1 GEMV is bound by
the L1/shared-memory pipe, which moves one wavefront a clock per SM: a shuffle is one
wavefront for 32 weights. Here one byte (two codes, adjacent in K) indexes a 256-entry table
of float16 pairs: one 4-byte shared-memory load (one wavefront) gives 64 weights a warp, and
the address is one byte permute and one multiply-add. float16 holds every NF4 value to 2^-12
(the tensor-core path rounds them to the activations' dtype, bf16 included).

The table holds 32 copies interleaved, so lane ``l`` reads copy ``l`` from bank ``l``:
random codes never conflict. It takes 32 KiB, filled once a program with values known when
the kernel compiles (``NF4_CODES`` in float16): 16 stores a thread and no loads.

Triton has no shared-memory gather, so the table is a ``.shared`` array declared in inline
PTX (``fill_table`` must run exactly once a kernel, before ``pair_values``); ptxas reserves
it beside Triton's own shared memory. The interpreter cannot run PTX: there the kernels use
the register code book (``dequant.nf4_value``) instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.quant.dequant import NF4_CODES

COPIES = 32
_FILL_UNITS = tl.constexpr(256 * COPIES * 4 // 16 // 16)  # a unit: 16-byte stores, one a high nibble
_DECLARE = tl.constexpr(f".shared .align 16 .b8 nf4_pairs[{256 * COPIES * 4}];\nmov.u32 $0, 0;")
_HALF_BITS = [int(bits) & 0xFFFF for bits in torch.tensor(NF4_CODES).half().view(torch.int16)]
_LOW = tl.constexpr(tuple(_HALF_BITS))  # a pair's low half: the even input's code
_HIGH = tl.constexpr(tuple(bits << 16 if bits < 0x8000 else (bits << 16) - (1 << 32)  # as int32
                           for bits in _HALF_BITS))


@triton.jit
def fill_table(anchor, like):
    """Declare the table, fill it and wait for every thread of the program; returns this lane's
    copy's address, shaped as ``like``. ``anchor``: any scalar (one PTX declaration). Unit ``u``
    of the fill stores entries ``16 * high + u / 8`` of copies ``4 * (u % 8)`` to ``+ 3``, one
    store for each high nibble, so that a warp's stores cover 512 contiguous bytes (no bank
    conflicts). The values are constants: no loads, so nothing delays the weight loads issued
    before the fill."""
    tl.inline_asm_elementwise(_DECLARE, "=r,r", [anchor], dtype=tl.int32, is_pure=False, pack=1)
    unit = tl.arange(0, _FILL_UNITS)
    half = tl.full(unit.shape, _LOW[0], tl.int32)
    for low in tl.static_range(1, 16):
        half = tl.where(unit >> 3 == low, _LOW[low], half)
    for high in tl.static_range(16):
        tl.inline_asm_elementwise(
            "{ .reg .u32 a; mov.u32 a, nf4_pairs; mad.lo.u32 a, $1, 16, a; st.shared.v4.b32 [a], {$2, $2, $2, $2};"
            " mov.u32 $0, 0; }",
            "=r,r,r", [unit + high * _FILL_UNITS, half | _HIGH[high]], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()
    return tl.inline_asm_elementwise(
        "{ .reg .u32 l, b; mov.u32 l, %laneid; mov.u32 b, nf4_pairs; mad.lo.u32 $0, l, 4, b; }",
        "=r,r", [tl.zeros_like(like).to(tl.int32)], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def pair_values(words, lane_table):
    """The 8 NF4 code-book values of each uint32 word, in code order (code ``p`` at bits ``4p``),
    as float32: byte ``j`` (codes 2j, 2j + 1) is entry ``j`` of ``lane_table``'s copy, 128 bytes
    apart."""
    return tl.inline_asm_elementwise(
        """{ .reg .u32 t, a, v; .reg .b16 l, h;
        prmt.b32 t, $8, 0, 0x4440; mad.lo.u32 a, t, 128, $9; ld.shared.b32 v, [a]; mov.b32 {l, h}, v;
        cvt.f32.f16 $0, l; cvt.f32.f16 $1, h;
        prmt.b32 t, $8, 0, 0x4441; mad.lo.u32 a, t, 128, $9; ld.shared.b32 v, [a]; mov.b32 {l, h}, v;
        cvt.f32.f16 $2, l; cvt.f32.f16 $3, h;
        prmt.b32 t, $8, 0, 0x4442; mad.lo.u32 a, t, 128, $9; ld.shared.b32 v, [a]; mov.b32 {l, h}, v;
        cvt.f32.f16 $4, l; cvt.f32.f16 $5, h;
        prmt.b32 t, $8, 0, 0x4443; mad.lo.u32 a, t, 128, $9; ld.shared.b32 v, [a]; mov.b32 {l, h}, v;
        cvt.f32.f16 $6, l; cvt.f32.f16 $7, h; }""",
        "=f,=f,=f,=f,=f,=f,=f,=f,r,r", [words, lane_table], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
