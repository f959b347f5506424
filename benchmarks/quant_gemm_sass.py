"""SASS instructions per weight of the weight-only GEMM kernels, compiled offline for an H100.

No GPU needed: each kernel is compiled for sm_90 with the launch settings ``weight_gemm`` would
use on Llama-3-8B's gate_up_proj (every integer argument a multiple of 16, as there), and the
SASS (``cuobjdump``, shipped with Triton) of one K iteration is counted: the loop body, or, where
the loop is unrolled, the growth from 2 to 6 iterations. Instructions per weight bound the
speed a kernel can reach: at batch 1 an H100 issues 128 thread-instructions per clock per SM and
has to retire ~16 int4 weights per clock per SM to reach 1.9 TB/s. The code depends on the
Triton version (its layout choices most): count with the one the GPU runs (3.6 there:
``pip install --target DIR triton==3.6.0`` and put DIR first on PYTHONPATH). The launch settings
are planned for the CPU, so nf4 is its register code-book kernel, not the pair-table one a GPU
runs. Prints a table, writes JSON.

    python benchmarks/quant_gemm_sass.py --out quant_gemm_sass.json
"""

from __future__ import annotations

import argparse
import collections
import json
import re

import torch
import triton

from decode_sass import cubin_listing, instructions  # siblings: the offline compile, the timing benchmark's formats
from fastllm_kernels.quant.weight_gemm import plan
from quant_gemm import FORMATS
N, K = 28672, 4096
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def signature(kernel: triton.runtime.JITFunction, name: str, m: int, dtype: torch.dtype) -> dict[str, str]:
    """Argument types as ``weight_gemm`` passes them: x's dtype for activations, scales and output."""
    words = "*i32" if m == 1 else ("*i8" if name == "int8" else "*u8")
    types = {"x_ptr": "*" + TRITON_TYPES[dtype], "q_ptr": "*u8" if name == "fp8" else words, "code_ptr": "*fp32",
             "ws_ptr": "*fp32", "lock_ptr": "*i32"}
    return {arg: types.get(arg, "*" + TRITON_TYPES[dtype] if arg.endswith("_ptr") else "i32")
            for arg in kernel.arg_names}


def compiled_sass(name: str, m: int, dtype: torch.dtype, iters: int) -> tuple[str, int, int]:
    """(SASS listing, registers a thread, weights a thread and iteration) of one compile."""
    launch = plan(m, N, K, FORMATS[name], None, dtype, torch.device("cpu"))  # splits: outside the K loop
    constexprs = dict(launch.constexprs, ITERS=iters)
    options = {key: constexprs.pop(key) for key in ("num_warps", "num_stages")}
    listing, usage = cubin_listing(launch.kernel, signature(launch.kernel, name, m, dtype), constexprs, options)
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    return listing, registers, constexprs["BLOCK_N"] * constexprs["BLOCK_K"] // (32 * options["num_warps"])


def iteration_counts(name: str, m: int, dtype: torch.dtype) -> tuple[collections.Counter, int, int]:
    """Opcodes of one K iteration, registers, weights a thread and iteration."""
    listing, registers, weights = compiled_sass(name, m, dtype, 6)
    code = instructions(listing)
    branches = [(int(target, 16), address) for address, opcode, operands in code if opcode == "BRA"
                for target in re.findall(r"0x([0-9a-f]+)", operands) if int(target, 16) < address]
    if branches:
        start, end = max(branches, key=lambda span: span[1] - span[0])
        return collections.Counter(op for address, op, _ in code if start <= address <= end), registers, weights
    unrolled = collections.Counter(op for _, op, _ in code)
    unrolled.subtract(op for _, op, _ in instructions(compiled_sass(name, m, dtype, 2)[0]))
    return collections.Counter({op: count / 4 for op, count in unrolled.items() if count > 0}), registers, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--out", default="quant_gemm_sass.json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"Triton {triton.__version__}, sm_90, {args.dtype}, {N}x{K}")
    rows = []
    for m in args.batch:
        for name in FORMATS:
            counts, registers, weights = iteration_counts(name, m, dtype)
            per_weight = {op: round(count / weights, 3) for op, count in counts.most_common()}
            rows.append(dict(kernel=name, m=m, registers=registers, per_weight=round(sum(counts.values()) / weights, 2),
                             opcodes=per_weight))
            top = "  ".join(f"{op} {count:.2f}" for op, count in list(per_weight.items())[:8])
            print(f"{name:<5} M={m:<3} {rows[-1]['per_weight']:>5.2f} instructions/weight  "
                  f"{registers:>3} registers  {top}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"target": "sm_90", "triton": triton.__version__, "dtype": args.dtype, "shape": [N, K], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
