"""The batch-1 decode kernels compile for an H100 (sm_90) with the installed Triton, offline: the
interpreter that runs them on the CPU accepts code that a compile refuses (a ``None`` returned from
a ``@triton.jit`` helper; a warp count not a power of two), and the GPU is the only other place
that would tell. Runs ``benchmarks/decode_sass.py`` in a process of its own: this one's kernels
are the interpreter's."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_decode_kernels_compile_for_sm90_without_spilling():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_sass.py")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = dict(re.findall(r"^(\S.*?)\s{2,}(\d+ registers.*)$", run.stdout, re.M))
    assert len(rows) >= 25 and all(" 0 spill stores" in row for row in rows.values()), run.stdout
    # batch-1 attention loads its first value tile under the previous kernel, as its first key tile
    before = {name: int(re.search(r"(\d+) before the wait", row).group(1)) for name, row in rows.items()}
    assert before["decode split qwen3 d128 sparse"] > before["decode split qwen3 d128 full"]
