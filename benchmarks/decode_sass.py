"""Registers, spills and loads before the dependent-launch wait of the batch-1 decode kernels,
compiled offline for an H100 / H200.

No GPU needed: each kernel (attention, routing, norms, rotary, the one-row and expert GEMVs) is
compiled for sm_90 at the decode shapes of Qwen3-30B-A3B and ERNIE-4.5-21B-A3B (bf16 activations,
dependent launches on) and its SASS (``cuobjdump``, shipped with Triton)
is read: registers a thread, spill stores (``STL``), and global loads (``LDG``) before and after
the first ``ACQBULK`` (the grid-dependency wait: loads before it run under the previous kernel).
The code depends on the Triton version, and what one version compiles another may refuse (a
``None`` returned from a ``@triton.jit`` helper compiles on 3.9, not on 3.6): check with the one the
GPU runs (3.6 there: ``pip install --target DIR triton==3.6.0``, DIR first on PYTHONPATH) before a
device call. Exits 1 if any kernel fails to compile.

    PYTHONPATH=DIR:kernels python benchmarks/decode_sass.py [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import torch

from fastllm_kernels import decode_attention, kv_cache, moe_routing
from fastllm_kernels.linear import DENSE
from fastllm_kernels.quant.fp8_gemm import FP8_WEIGHTS
from fastllm_kernels.quant.weight_gemm import EXPERT_TILING, WIDE_EXPERT_TILING, WeightFormat, plan
from fastllm_kernels.rms_norm import _rms_norm_kernel, norm_warps  # the package's ``rms_norm`` is a function

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
FLOATS = ("eps", "scale_log2e", "norm_min")


def cubin_listing(kernel: triton.runtime.JITFunction, signature: dict[str, str], constexprs: dict,
                  options: dict) -> tuple[str, str]:
    """(SASS listing, resource usage) of ``kernel`` compiled for sm_90, every pointer and integer
    argument a multiple of 16, as Triton specialises them at real shapes."""
    signature = dict(signature, **{name: "constexpr" for name in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature)
             if signature[name] not in ("constexpr", "fp32")}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=TARGET, options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        listing = subprocess.run([CUOBJDUMP, "-sass", cubin.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", cubin.name], capture_output=True,
                               text=True).stdout
    return listing, usage


def instructions(listing: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each SASS instruction, predicates and opcode modifiers dropped."""
    found = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[.A-Z0-9_]*\s*([^;]*);", listing)
    return [(int(address, 16), opcode, operands) for address, opcode, operands in found]


@dataclass
class Case:
    """One launch: its kernel, argument types other than the defaults (16-bit pointers, 32-bit
    integers, float32 scale-like scalars), compile-time arguments and launch options."""

    name: str
    kernel: triton.runtime.JITFunction
    constexprs: dict
    num_warps: int
    num_stages: int = 3
    types: dict[str, str] = field(default_factory=dict)

    def signature(self) -> dict[str, str]:
        def default(name: str) -> str:
            return "*bf16" if name.endswith("_ptr") else "fp32" if name in FLOATS else "i32"
        return {name: self.types.get(name, default(name)) for name in self.kernel.arg_names}


def decode_cases() -> list[Case]:
    """The decode step's small kernels at Qwen3-30B-A3B's and ERNIE-4.5-21B-A3B's shapes (Qwen3: 32
    query / 4 kv heads, 128 experts, top 8, head norms; ERNIE: 20 / 4 heads, a float32 router of 64
    experts, top 6, with a score-correction bias), in the tiles the host code picks at batch 1."""
    cases = []
    attention_types = {"block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "split_out_ptr": "*fp32",
                       "split_lse_ptr": "*fp32"}
    for model, group in (("qwen3", 8), ("ernie", 5)):
        for head_dim, sparse in ((128, True), (128, False), (256, True)):
            tiling = decode_attention.default_decode_tiling(head_dim, sparse)
            kind = "sparse" if sparse else "full"
            cases.append(Case(
                f"decode split {model} d{head_dim} {kind}", decode_attention._decode_split_kernel,
                dict(GROUP=group, GROUP_PAD=16, HEAD_DIM=head_dim, BLOCK_SIZE=64, BLOCK_N=tiling.block_n, SPLIT=True,
                     PRECISION="tf32", PDL=True, PRELOAD_VALUES=tiling.preload_values),
                tiling.num_warps, tiling.num_stages, attention_types))
    cases.append(Case("decode merge", decode_attention._decode_merge_kernel,
                      dict(SPLITS_PAD=8, HEAD_DIM=128, BLOCK_N=64, PDL=True), 4,
                      types={"split_out_ptr": "*fp32", "split_lse_ptr": "*fp32", "seq_lens_ptr": "*i32"}))
    routing_types = {"logits_ptr": "*fp32", "lock_ptr": "*i32", "weights_ptr": "*fp32", "ids_ptr": "*i64",
                     "bias_ptr": "*fp32"}
    for model, experts, features, weight_bytes, top_k, bias in (("qwen3", 128, 2048, 2, 8, False),
                                                                ("ernie", 64, 2560, 4, 6, True)):
        rows, block_k, warps = moe_routing.router_tiling(experts, features, weight_bytes)
        cases.append(Case(f"router_topk {model}", moe_routing._router_topk_kernel,
                          dict(ROWS=rows, BLOCK_K=block_k, ROUND=weight_bytes == 2, TOP_K=top_k, SLOTS=8,
                               EXPERTS=experts, HAS_BIAS=bias, RENORMALIZE=True, PDL=True), warps,
                          types=dict(routing_types, w_ptr="*bf16" if weight_bytes == 2 else "*fp32")))
    for bias in (False, True):
        cases.append(Case(f"topk_softmax bias={bias}", moe_routing._topk_softmax_kernel,
                          dict(TOP_K=8, SLOTS=8, EXPERTS=128, TERMS=1, HAS_BIAS=bias, RENORMALIZE=True, PDL=True), 1,
                          types=routing_types))
    for block, summands in ((2048, 8), (4096, 1)):  # Qwen3's eight expert rows; ERNIE's 2560 after attention
        cases.append(Case(f"rms_norm {block} x{summands}", _rms_norm_kernel,
                          dict(BLOCK=block, SUMMANDS=summands, HAS_RESIDUAL=True, PDL=True),
                          norm_warps(block, summands), types={"x_ptr": "*fp32"} if summands > 1 else {}))
    rotary_types = {"positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "slot_mapping_ptr": "*i64"}
    for model, heads, norm in (("qwen3", 32, True), ("ernie", 32, False)):
        cases.append(Case(f"rotary write {model}", kv_cache._rotary_write_kernel,
                          dict(Q_HEADS_PAD=heads, KV_HEADS_PAD=4, ROT_HALF=64, HALF_PAD=64, IS_NEOX=True, NORM=norm,
                               HEAD_DIM=128, SATURATE=0, PDL=True), 4, types=rotary_types))
    return cases


def gemv_case(name: str, n: int, k: int, fmt: WeightFormat, tiling=None, pairs: int = 1, **expert) -> Case:
    """The one-row GEMV as ``weight_gemm`` (or, with ``expert`` settings, ``expert_gemv``) plans it;
    planned for the CPU (no GPU to ask for its SM count: the K splits may differ), launched dependent."""
    launch = plan(1, n, k, fmt, tiling, torch.bfloat16, torch.device("cpu"), pairs, expert.get("GATED", False))
    constexprs = dict(launch.constexprs, **expert, PDL=True)
    options = {key: constexprs.pop(key) for key in ("num_warps", "num_stages")}
    q = "*u8" if fmt.fp8 else "*bf16" if fmt.dense else "*i32"
    types = {"q_ptr": q, "code_ptr": "*fp32", "ws_ptr": "*fp32", "lock_ptr": "*i32", "ids_ptr": "*i64",
             "route_ptr": "*fp32", "s_ptr": "*fp32" if fmt.fp8 else "*bf16"}
    return Case(name, launch.kernel, constexprs, options["num_warps"], options["num_stages"], types)


def gemv_cases() -> list[Case]:
    """Qwen3-30B-A3B's attention projections and routed experts (8 pairs of 768 x 2048) at one row,
    bf16 and e4m3; ERNIE-4.5-21B-A3B's gate/up in the wide expert tile (6 pairs of 3072 x 2560)."""
    gated = dict(EXPERTS=True, IDS_READY=False, ROWS_PER_X=8, SUM_PAIRS=1, WEIGHTED=False, GATED=True, HAS_ADDEND=False)
    down = dict(gated, IDS_READY=True, ROWS_PER_X=1, WEIGHTED=True, GATED=False)
    cases = []
    for label, fmt in (("bf16", DENSE), ("e4m3", FP8_WEIGHTS)):
        cases += [gemv_case(f"gemv qkv qwen3 {label}", 5120, 2048, fmt),
                  gemv_case(f"gemv o_proj qwen3 {label}", 2048, 4096, fmt),
                  gemv_case(f"expert gate/up qwen3 {label}", 1536, 2048, fmt, EXPERT_TILING, 8, **gated),
                  gemv_case(f"expert down qwen3 {label}", 2048, 768, fmt, EXPERT_TILING, 8, **down),
                  gemv_case(f"expert gate/up ernie {label} wide", 3072, 2560, fmt, WIDE_EXPERT_TILING, 6,
                            **dict(gated, ROWS_PER_X=6))]
    return cases


def report(case: Case) -> dict:
    listing, usage = cubin_listing(case.kernel, case.signature(), case.constexprs,
                                   {"num_warps": case.num_warps, "num_stages": case.num_stages, "launch_pdl": True})
    opcodes = [opcode for _, opcode, _ in instructions(listing)]
    wait = opcodes.index("ACQBULK") if "ACQBULK" in opcodes else len(opcodes)
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "spill_stores": sum(op == "STL" for op in opcodes),
            "loads_before_wait": sum(op == "LDG" for op in opcodes[:wait]),
            "loads_after_wait": sum(op == "LDG" for op in opcodes[wait:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="cases whose name contains this")
    args = parser.parse_args()
    print(f"Triton {triton.__version__}, sm_90")
    failed = 0
    for case in decode_cases() + gemv_cases():
        if args.only not in case.name:
            continue
        try:
            row = report(case)
        except Exception as error:  # a compile error is the finding
            failed += 1
            cause = error.__cause__ or error  # a CompilationError's own text is the source excerpt
            print(f"{case.name:<34} FAILED: {type(cause).__name__}: {str(cause).splitlines()[-1][:120]}", flush=True)
            continue
        print(f"{case.name:<34} {row['registers']:>3} registers  {row['spill_stores']:>2} spill stores  "
              f"loads {row['loads_before_wait']:>3} before the wait, {row['loads_after_wait']:>3} after", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
