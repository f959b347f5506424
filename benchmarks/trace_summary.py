"""What each rank's device did in the step windows that ``FASTLLM_TORCH_PROFILER_DIR`` recorded.

    python benchmarks/trace_summary.py TRACE_DIR [OUT_JSON]

For every trace (one a process and window): the window's device span (first kernel start to
last kernel end), the time some kernel ran (busy), the idle gaps (the longest ones and where
the host was meanwhile), the CUDA runtime calls the host spent most time in (a cudaFree or a
synchronous copy stalls the host), and kernel time by kind (GEMM, attention, all-reduce and other
collectives, MoE, the rest) with the ten costliest kernels. A rank whose device idles while
its peer's collectives stretch is the one holding the step back.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

KINDS = (  # first match wins
    ("collective", re.compile(r"nccl|all_reduce|allreduce|lamport|one_shot|two_shot|multimem|broadcast", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|sm90_xmma|cutlass|cublas|_gemv|weight_gemm|matmul", re.I)),
    ("attention", re.compile(r"attention|attn|flash|fmha", re.I)),
    ("moe", re.compile(r"grouped_gemm|moe|expert|topk", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def summarize(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e),
                     key=lambda e: e["ts"])
    if not kernels:
        return {"trace": path.name, "kernels": 0}
    start, end = kernels[0]["ts"], max(e["ts"] + e["dur"] for e in kernels)
    busy, gaps, reach = 0.0, [], start
    for e in kernels:  # union of intervals over all streams
        if e["ts"] > reach:
            gaps.append((e["ts"] - reach, reach))
        busy += max(0.0, e["ts"] + e["dur"] - max(reach, e["ts"]))
        reach = max(reach, e["ts"] + e["dur"])
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_kind[kind_of(e["name"])] = by_kind.get(kind_of(e["name"]), 0.0) + e["dur"]
        entry = by_name.setdefault(e["name"][:90], [0, 0.0])
        entry[0] += 1
        entry[1] += e["dur"]
    host = [e for e in events if e.get("cat") in ("cpu_op", "python_function", "user_annotation") and "dur" in e]
    runtime: dict[str, float] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e:
            runtime[e["name"]] = runtime.get(e["name"], 0.0) + e["dur"]
    return {
        "trace": path.name,
        "span_ms": (end - start) / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": (end - start - busy) / 1e3,
        "idle_gaps_over_50us": sum(1 for gap, _ in gaps if gap > 50),
        "longest_gaps": [{"ms": gap / 1e3, "at_ms": (at - start) / 1e3, "host_ops": _host_at(host, at, at + gap)}
                         for gap, at in sorted(gaps, reverse=True)[:5]],
        "kernel_ms_by_kind": {kind: round(us / 1e3, 3) for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "host_runtime_ms": {name: round(us / 1e3, 3) for name, us in sorted(runtime.items(), key=lambda kv: -kv[1])[:6]},
        "top_kernels": [{"name": name, "calls": calls, "ms": round(us / 1e3, 3)}
                        for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:10]],
    }


def _host_at(host: list[dict], begin: float, end: float) -> list[str]:
    """The outermost host ops overlapping a device gap: what the process did while the device waited."""
    inside = [e for e in host if e["ts"] < end and e["ts"] + e["dur"] > begin]
    longest = sorted(inside, key=lambda e: -e["dur"])[:3]
    return [f"{e['name'][:60]} ({e['dur'] / 1e3:.2f} ms)" for e in longest]


def main(argv: list[str]) -> int:
    summaries = [summarize(path) for path in sorted(Path(argv[0]).glob("*.json.gz"))]
    text = json.dumps(summaries, indent=1)
    if len(argv) > 1:
        Path(argv[1]).write_text(text)
    for s in summaries:
        if s.get("kernels") == 0:
            print(f"{s['trace']}: no kernels")
            continue
        kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in s["kernel_ms_by_kind"].items())
        print(f"{s['trace']}: span {s['span_ms']:.1f} ms, busy {s['busy_ms']:.1f}, idle {s['idle_ms']:.1f} "
              f"({s['idle_gaps_over_50us']} gaps > 50 us); kernels ms: {kinds}; host runtime ms: "
              + ", ".join(f"{name} {ms:.1f}" for name, ms in s["host_runtime_ms"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
