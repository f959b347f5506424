import sys, torch
sys.path.insert(0, "benchmarks")
import quant_gemm as qg
from fastllm_kernels.quant import weight_gemm as wg
from fastllm_kernels.quant.weight_gemm import Tiling
from fastllm_kernels.quant.int4_gemm import nf4_gemm, nf4_gemm_ref, pack_int4
orig = wg.plan
MODE = {"ptx": 2}
def plan(*a, **k):
    l = orig(*a, **k)
    c = dict(l.constexprs)
    if "PTX" in c:
        c["PTX"] = MODE["ptx"]
    return wg.Launch(l.kernel, l.grid, c)
wg.plan = plan
torch.manual_seed(0)
q = pack_int4(torch.randint(0, 16, (512, 4096), device="cuda"))
absmax = torch.rand(512, 64, device="cuda", dtype=torch.bfloat16) + 0.5
x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
ref = nf4_gemm_ref(x.float(), q, absmax.float(), 64)
for mode in (0, 1, 2, 3):
    MODE["ptx"] = mode
    y = nf4_gemm(x, q, absmax, 64).float()
    print("mode", mode, "max rel err", ((y - ref).abs().max() / ref.abs().max()).item(), flush=True)
tilings = [Tiling(4, 1024, 1, 1), Tiling(4, 1024, 1, 2), Tiling(8, 1024, 1, 2, 1)]
for mode in (0, 1, 2, 3):
    MODE["ptx"] = mode
    for layer, (n, k) in qg.SHAPES.items():
        w = qg.ColdWeights("nf4", n, k)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        print(f"mode={mode} {layer:<13}", "  ".join(f"{t.block_n}/{t.num_stages}/{t.split_k}: {w.us_per_call(x, t, 64, 10):6.2f}" for t in tilings), flush=True)
        del w
