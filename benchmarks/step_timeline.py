"""Where an offline run's time goes, step by step: host time, time waiting for the device, and
device time between consecutive launches (CUDA events), for any ``fastllm`` command that steps
an ``LLMEngine`` (``bench throughput`` above all).

    python -P benchmarks/step_timeline.py TAG OUT_DIR bench throughput --model ... [args]

writes OUT_DIR/steps_TAG.csv (one row per overlapped step) and prints a summary per kind of
step (decode-only, or mixed with prefill chunks), Python's garbage collections during the run,
between its first and last step (count, total and longest pause per generation), and the Triton
kernels compiled after the first step (a variant compiled mid-run stalls its step), to stderr.
It patches the engine from outside, so one copy measures older commits too. A step whose host
time exceeds its device interval left the device idle: a stall of the loop (a full garbage
collection, a kernel compiled mid-run) rather than slow kernels.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

import fastllm.engine.llm_engine as llm_engine
from fastllm.platforms import transfer


class StepTimeline:
    """Rows of (start, host s, waiting s, sequences, tokens, CUDA event after the launch)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float, int, int, Any]] = []
        self.waited = 0.0
        self.preemptions = 0
        self.last_step_end = 0.0
        self.collecting_since = 0.0
        self.pauses: list[tuple[int, float, float]] = []  # generation, start, seconds
        self.cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
        self.compiled_before: Optional[set[Path]] = None

    def install(self) -> None:
        wait, step = transfer.HostCopy.wait, llm_engine.LLMEngine.step
        timeline = self

        def timed_wait(copy: Any) -> Any:
            start = time.perf_counter()
            try:
                return wait(copy)
            finally:
                timeline.waited += time.perf_counter() - start

        def timed_step(engine: Any) -> Any:
            timeline.waited = 0.0
            start = time.perf_counter()
            outputs = step(engine)
            timeline.last_step_end = time.perf_counter()
            timeline.record(engine, start, timeline.last_step_end - start)
            return outputs

        transfer.HostCopy.wait, llm_engine.LLMEngine.step = timed_wait, timed_step
        gc.callbacks.append(self.on_gc)

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.collecting_since = time.perf_counter()
        elif self.last_step_end:
            self.pauses.append((info["generation"], self.collecting_since,
                                time.perf_counter() - self.collecting_since))

    def compiled(self) -> set[Path]:
        """Kernels in Triton's cache (each compiled variant leaves a NAME.json beside its binary)."""
        return {path for path in self.cache.glob("*/*.json") if not path.name.startswith("__grp__")}

    def record(self, engine: Any, start: float, host: float) -> None:
        if self.compiled_before is None:
            self.compiled_before = self.compiled()
        self.preemptions = engine.scheduler.num_preemptions
        launched = engine.in_flight
        if launched is None or not torch.cuda.is_available():
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        tokens = [item.num_new_tokens for item in launched.scheduled]
        self.rows.append((start, host, self.waited, len(tokens), sum(tokens), event))

    def report(self, tag: str, out_dir: str) -> None:
        for generation in range(3):
            pauses = [seconds for g, start, seconds in self.pauses if g == generation and start < self.last_step_end]
            if pauses:
                print(f"{tag} gc generation {generation}: {len(pauses)} collections, {sum(pauses):.2f} s, "
                      f"longest {1e3 * max(pauses):.0f} ms", file=sys.stderr)
        if not self.rows:
            return
        torch.cuda.synchronize()
        kinds: dict[str, list[float]] = {}
        with open(f"{out_dir}/steps_{tag}.csv", "w") as f:
            f.write("t_s,host_ms,wait_ms,seqs,tokens,device_interval_ms\n")
            for i, (start, host, waited, seqs, tokens, event) in enumerate(self.rows):
                interval = self.rows[i - 1][5].elapsed_time(event) if i else 0.0
                f.write(f"{start - self.rows[0][0]:.4f},{host * 1e3:.3f},{waited * 1e3:.3f},{seqs},{tokens},"
                        f"{interval:.3f}\n")
                total = kinds.setdefault("decode" if tokens == seqs else "mixed", [0, 0.0, 0.0, 0.0])
                total[0] += 1
                total[1] += host - waited
                total[2] += waited
                total[3] += interval / 1e3
        for kind, (n, host, waited, device) in kinds.items():
            print(f"{tag} {kind}: {n} steps, host {host:.2f} s + waiting {waited:.2f} s, device intervals "
                  f"{device:.2f} s ({1e3 * device / n:.1f} ms a step)", file=sys.stderr)
        print(f"{tag}: {self.preemptions} preemptions", file=sys.stderr)
        late = sorted(path.stem for path in self.compiled() - (self.compiled_before or set()))
        print(f"{tag}: {len(late)} Triton kernels compiled after the first step: {', '.join(late)}", file=sys.stderr)


if __name__ == "__main__":
    from fastllm.entrypoints.cli.main import main

    timeline = StepTimeline()
    timeline.install()
    try:
        code = main(sys.argv[3:])
    finally:
        timeline.report(sys.argv[1], sys.argv[2])
    sys.exit(code)
