"""Exact weight values from packed codes, without integer-to-float conversions.

A weight-only GEMV at batch 1 does a few instructions per weight and nothing else, so the
unpacking decides whether it keeps up with HBM. The GEMV reads 32-bit words of 8 int4 or 4 int8
codes, code ``p`` at bits ``p * BITS``. Instead of shift, mask, convert (I2F runs at a quarter
of the FP32 rate or less), a code is OR-ed into the mantissa of a power of two and the power of
two is subtracted: with the code at bit ``pos`` of the word and the exponent of ``2^(23 - pos)``,
the float is ``2^(23 - pos) + code``, exactly. One LOP3 (mask and exponent) and one FADD per
code; fields ending above bit 20 come down with one shift a word (by 12 or 16: a field moved
to bit 0 would be a two-instruction bit-field extract). Signed int8 flips each byte's sign bit
first (one XOR a word): the byte then reads as ``code + 128``.

The exponent bits come in as ``magic`` (``MAGIC``, a run-time argument): from a constant, ptxas
puts the exponent in the instruction and re-materializes each field mask in a register (~0.8
instructions a weight more); from a register, the masks are the immediates.

The x values that pair with code ``p`` of each word are a strided column of x; ``columns``
splits an in-register ``[..., CODES]`` tile of x into them (register renaming, no shuffles),
so the codes are never interleaved back into K order. The tensor-core kernel does interleave
(bytes: two codes a byte, adjacent in K) and uses the 16-bit form, ``small_code_value``.
"""

from __future__ import annotations

import triton
import triton.language as tl

MAGIC = 0x4B000000  # fp32 bits of 2^23: its mantissa's last bit weighs 1
# QLoRA's NormalFloat4: quantiles of N(0, 1) scaled to [-1, 1], with an exact zero.
NF4_CODES = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)


@triton.jit
def code_value(words, P: tl.constexpr, BITS: tl.constexpr, magic):
    """Code ``P`` of each uint32 word (``BITS`` 4: 0..15, 8: signed, words XOR-ed with
    0x80808080 by the caller) as an exact float32."""
    HIGH: tl.constexpr = P * BITS + BITS > 20  # fields must end below the exponent (bit 23)
    SHIFT: tl.constexpr = (12 if BITS == 4 else 16) if HIGH else 0  # not to bit 0: a field there is a bfe (2 ops)
    POS: tl.constexpr = P * BITS - SHIFT
    OFFSET: tl.constexpr = 2.0 ** (23 - POS) + (128.0 if BITS == 8 else 0.0)
    field = words if SHIFT == 0 else words >> SHIFT
    bits = (field & (((1 << BITS) - 1) << POS)) | (magic - (POS << 23))
    return bits.to(tl.float32, bitcast=True) - OFFSET


@triton.jit
def nf4_value(book, words, P: tl.constexpr):
    """NF4 value of code ``P`` of each uint32 word, from the 16-entry code book in registers: in
    a one-warp program ``tl.gather`` is one warp shuffle a weight and exact (no arithmetic).
    The index is a 4-bit field extract (SHF + SGXT; the gather's own lane mask lets LLVM see
    through any byte-wise repacking)."""
    index = ((words >> (4 * P)) & 0xF).to(tl.int32)
    return tl.reshape(tl.gather(book, tl.reshape(index, (index.numel,)), 0), index.shape)


@triton.jit
def _halves(x):
    """``[..., 2n]`` -> (elements at even positions, at odd positions) of the last dim."""
    return tl.split(tl.reshape(x, x.shape[:-1] + (x.shape[-1] // 2, 2)))


@triton.jit
def _columns8(x):
    """``[..., 8]`` -> the 8 tensors ``x[..., j]``."""
    even, odd = _halves(x)
    e04, e26 = _halves(even)
    e15, e37 = _halves(odd)
    e0, e4 = tl.split(e04)
    e2, e6 = tl.split(e26)
    e1, e5 = tl.split(e15)
    e3, e7 = tl.split(e37)
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def columns(x, N: tl.constexpr):
    """``[..., N]`` (N 2, 4, 8 or 16, in registers) -> tuple of N tensors ``[...]``: entry ``j`` is
    ``x[..., j]``. Splits of in-register dims: register renaming, no instructions."""
    if N == 2:
        out = tl.split(x)
    elif N == 4:
        even, odd = _halves(x)
        e0, e2 = tl.split(even)
        e1, e3 = tl.split(odd)
        out = (e0, e1, e2, e3)
    elif N == 8:
        out = _columns8(x)
    else:
        even, odd = _halves(x)
        e = _columns8(even)
        o = _columns8(odd)
        out = (e[0], o[0], e[1], o[1], e[2], o[2], e[3], o[3], e[4], o[4], e[5], o[5], e[6], o[6], e[7], o[7])
    return out


@triton.jit
def small_code_value(codes, dtype: tl.constexpr):
    """uint8 codes 0..15 -> exact values in ``dtype``, the magic number in the dtype's own width:
    fp16 ``0x6400 | code`` is 1024 + code, bf16 ``0x4300 | code`` 128 + code (7 mantissa bits
    hold 0..127), so no conversion follows. Constants, not ``magic``: a value from outside the
    loop stops Triton from running these ops in the dot-operand layout."""
    if dtype == tl.float32:
        values = (codes.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    elif dtype == tl.float16:
        values = (codes.to(tl.int16) | 0x6400).to(tl.float16, bitcast=True) - 1024.0
    else:
        values = (codes.to(tl.int16) | 0x4300).to(tl.bfloat16, bitcast=True) - 128.0
    return values
