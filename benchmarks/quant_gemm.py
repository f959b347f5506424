"""Dequantize-GEMM kernels vs the bf16 matmul on Llama-3-8B's linear shapes (decode-sized batches).

Decode is memory-bound: the table shows each kernel's time and the weight bytes it streams per
second. Prints a table and writes the numbers as JSON (``--out``). Needs a CUDA GPU and the
``fastllm-kernels`` and ``fastllm-plugin-quant`` distributions installed.

    python benchmarks/quant_gemm.py --out quant_gemm.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton

from fastllm_kernels.quant.int4_gemm import int4_gemm, nf4_gemm, pack_int4
from fastllm_kernels.quant.int8_gemm import int8_gemm
from fastllm_quant.fp8 import fp8_gemm, quantize_fp8_rows

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}


def kernels(n: int, k: int, device: str) -> dict[str, tuple[callable, int]]:
    """name -> (fn(x), weight bytes read); fresh random weights for every shape."""
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
    q8 = torch.randint(-127, 128, (n, k), device=device, dtype=torch.int8)
    s8 = torch.rand(n, device=device, dtype=torch.bfloat16) * 1e-3
    q4 = pack_int4(torch.randint(0, 16, (n, k), device=device))
    s4 = torch.rand(n, k // 128, device=device, dtype=torch.bfloat16) * 1e-2
    z4 = torch.randint(0, 16, (n, k // 128), device=device).to(torch.bfloat16)
    a4 = torch.rand(n, k // 64, device=device, dtype=torch.bfloat16) * 1e-2
    w8, ws8 = quantize_fp8_rows(w)
    return {
        "bf16": (lambda x: F.linear(x, w), 2 * n * k),
        "int8": (lambda x: int8_gemm(x, q8, s8), n * k + 2 * n),
        "int4": (lambda x: int4_gemm(x, q4, s4, z4, 128), n * k // 2 + 4 * n * k // 128),
        "nf4": (lambda x: nf4_gemm(x, q4, a4, 64), n * k // 2 + 2 * n * k // 64),
        "fp8": (lambda x: fp8_gemm(x, w8, ws8.squeeze(1)), n * k + 4 * n),
    }


SWEEP = {  # kernel -> launch settings tried by --sweep
    "int8": [dict(block_n=bn, block_k=bk, num_stages=st) for bn in (16, 32, 64) for bk in (128, 256) for st in (3, 5)],
    "int4": [dict(block_n=bn, num_warps=w, num_stages=st) for bn in (16, 32, 64) for w in (4, 8) for st in (3, 5)],
    "nf4": [dict(block_n=bn, num_warps=w, num_stages=st) for bn in (16, 32, 64) for w in (4, 8) for st in (3, 5)],
}


def sweep(batches: list[int]) -> list[dict]:
    """Time every launch setting of SWEEP on every shape: the data behind the kernels' defaults."""
    rows = []
    for layer, (n, k) in SHAPES.items():
        q8 = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
        s8 = torch.rand(n, device="cuda", dtype=torch.bfloat16)
        q4 = pack_int4(torch.randint(0, 16, (n, k), device="cuda"))
        s4 = torch.rand(n, k // 128, device="cuda", dtype=torch.bfloat16)
        a4 = torch.rand(n, k // 64, device="cuda", dtype=torch.bfloat16)
        fns = {"int8": lambda x, c: int8_gemm(x, q8, s8, **c), "int4": lambda x, c: int4_gemm(x, q4, s4, s4, 128, **c),
               "nf4": lambda x, c: nf4_gemm(x, q4, a4, 64, **c)}
        for m in batches:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for name, configs in SWEEP.items():
                for config in configs:
                    us = triton.testing.do_bench(lambda: fns[name](x, config), warmup=10, rep=50,
                                                 return_mode="median") * 1e3
                    rows.append(dict(layer=layer, m=m, kernel=name, config=config, us=round(us, 2)))
    for layer in SHAPES:
        for m in batches:
            for name in SWEEP:
                cells = sorted((r for r in rows if (r["layer"], r["m"], r["kernel"]) == (layer, m, name)),
                               key=lambda r: r["us"])
                print(f"{layer:<13}{m:>4} {name:<5} best {cells[0]['us']:>7.1f} us {cells[0]['config']}  "
                      f"worst {cells[-1]['us']:>7.1f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--out", default="quant_gemm.json")
    parser.add_argument("--sweep", action="store_true", help="time the launch settings instead")
    args = parser.parse_args()
    if args.sweep:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "sweep": sweep(args.batch)}, f, indent=1)
        return
    rows = []
    for layer, (n, k) in SHAPES.items():
        fns = kernels(n, k, "cuda")
        for m in args.batch:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = fns["bf16"][0](x).float()
            for name, (fn, nbytes) in fns.items():
                err = ((fn(x).float() - ref).norm() / ref.norm()).item() if name in ("bf16", "fp8") else None
                us = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=200, return_mode="median") * 1e3
                rows.append(dict(layer=layer, n=n, k=k, m=m, kernel=name, us=round(us, 2),
                                 weight_gb_per_s=round(nbytes / us / 1e3, 1), rel_err_vs_bf16=err))
    print(f"{'layer':<13}{'M':>4} " + "".join(f"{name:>16}" for name in fns) + "   (us, weight GB/s)")
    for layer in SHAPES:
        for m in args.batch:
            cells = [r for r in rows if r["layer"] == layer and r["m"] == m]
            print(f"{layer:<13}{m:>4} " + "".join(f"{r['us']:>8.1f}/{r['weight_gb_per_s']:>6.0f} " for r in cells))
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
