"""Weight-only GEMM kernels vs the bf16 matmul on Llama-3-8B's linear shapes, decode-sized batches.

Decode is memory-bound: the table shows each kernel's median time (``triton.testing.do_bench``)
and the weight bytes it streams per second (an H100 copies ~3,000 GB/s). ``fp8`` is the W8A16
kernel decode uses, ``fp8_w8a8`` the per-token activation quantization + ``torch._scaled_mm``
of large batches. ``--sweep`` times a few launch settings per kernel instead (the data behind
``default_tiling``). Prints a table and writes JSON (``--out``); needs a CUDA GPU.

    python benchmarks/quant_gemm.py --out quant_gemm.json
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
import torch.nn.functional as F
import triton

from fastllm_kernels.quant.fp8_gemm import fp8_gemm
from fastllm_kernels.quant.int4_gemm import int4_gemm, nf4_gemm, pack_int4
from fastllm_kernels.quant.int8_gemm import int8_gemm
from fastllm_kernels.quant.weight_gemm import Tiling
from fastllm_quant.fp8 import quantize_fp8_rows

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
Kernel = Callable[[torch.Tensor, "Tiling | None"], torch.Tensor]


def kernels(n: int, k: int) -> dict[str, tuple[Kernel, int]]:
    """name -> (fn(x, tiling), weight bytes read); fresh random weights for every shape."""
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    q8 = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
    s8 = torch.rand(n, device="cuda", dtype=torch.bfloat16) * 1e-3
    q4 = pack_int4(torch.randint(0, 16, (n, k), device="cuda"))
    s4 = torch.rand(n, k // 128, device="cuda", dtype=torch.bfloat16) * 1e-2
    z4 = torch.randint(0, 16, (n, k // 128), device="cuda").to(torch.bfloat16)
    a4 = torch.rand(n, k // 64, device="cuda", dtype=torch.bfloat16) * 1e-2
    w8, ws8 = quantize_fp8_rows(w)
    ws8 = ws8.squeeze(1).contiguous()

    def w8a8(x: torch.Tensor, tiling: Tiling | None) -> torch.Tensor:
        x_fp8, x_scale = quantize_fp8_rows(x)
        return torch._scaled_mm(x_fp8, w8.t(), scale_a=x_scale, scale_b=ws8[None, :], out_dtype=x.dtype)

    return {
        "bf16": (lambda x, t: F.linear(x, w), 2 * n * k),
        "int8": (lambda x, t: int8_gemm(x, q8, s8, t), n * k + 2 * n),
        "fp8": (lambda x, t: fp8_gemm(x, w8, ws8, t), n * k + 4 * n),
        "int4": (lambda x, t: int4_gemm(x, q4, s4, z4, 128, t), n * k // 2 + 4 * n * k // 128),
        "nf4": (lambda x, t: nf4_gemm(x, q4, a4, 64, t), n * k // 2 + 2 * n * k // 64),
        "fp8_w8a8": (w8a8, n * k + 4 * n),
    }


def median_us(fn: Callable[[], torch.Tensor]) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


SWEEP = {  # M -> launch settings tried by --sweep (split_k None: the heuristic's)
    1: [Tiling(bn, bk, w, 3, sk) for bn, bk in ((8, 512), (16, 512), (16, 256), (32, 256))
        for w in (2, 4) for sk in (None, 1)],
    16: [Tiling(bn, bk, 4, st, sk) for bn in (32, 64) for bk in (64, 128) for st in (3, 5) for sk in (None, 1)],
}


def sweep(out: str) -> None:
    rows = []
    for layer, (n, k) in SHAPES.items():
        fns = kernels(n, k)
        for m, configs in SWEEP.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for name in ("int8", "fp8", "int4", "nf4"):
                fn = fns[name][0]
                timed = sorted(((median_us(lambda: fn(x, t)), t) for t in configs), key=lambda row: row[0])
                rows += [dict(layer=layer, m=m, kernel=name, tiling=str(t), us=round(us, 2)) for us, t in timed]
                print(f"{layer:<13}{m:>4} {name:<5} best {timed[0][0]:>7.1f} us {timed[0][1]}  "
                      f"default {median_us(lambda: fn(x, None)):>7.1f}  worst {timed[-1][0]:>7.1f}", flush=True)
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "sweep": rows}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--out", default="quant_gemm.json")
    parser.add_argument("--sweep", action="store_true", help="time launch settings instead")
    args = parser.parse_args()
    if args.sweep:
        return sweep(args.out)
    rows = []
    for layer, (n, k) in SHAPES.items():
        fns = kernels(n, k)
        for m in args.batch:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = fns["bf16"][0](x, None).float()
            for name, (fn, nbytes) in fns.items():
                err = ((fn(x, None).float() - ref).norm() / ref.norm()).item()
                us = median_us(lambda: fn(x, None))
                rows.append(dict(layer=layer, n=n, k=k, m=m, kernel=name, us=round(us, 2),
                                 weight_gb_per_s=round(nbytes / us / 1e3, 1), rel_err_vs_bf16=round(err, 4)))
    print(f"{'layer':<13}{'M':>4} " + "".join(f"{name:>16}" for name in fns) + "   (us / weight GB/s)")
    for layer in SHAPES:
        for m in args.batch:
            cells = [r for r in rows if r["layer"] == layer and r["m"] == m]
            print(f"{layer:<13}{m:>4} " + "".join(f"{r['us']:>8.1f}/{r['weight_gb_per_s']:>6.0f} " for r in cells))
    print("relative error vs bf16 (random codes are not bf16's weights: only bf16 and fp8 compare):",
          {r["kernel"]: r["rel_err_vs_bf16"] for r in rows if r["kernel"] in ("fp8", "fp8_w8a8")})
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
