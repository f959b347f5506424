#!/usr/bin/env bash
# One GPU session, everything the CUDA path has to show, in order of importance; each step
# is time-boxed and writes its own file under $OUT, so a cut-short session still reports.
#   OUT=/tmp/out bash benchmarks/gpu_session.sh      (wheels of fastllm, fastllm-kernels, fastllm-templates, pydantic & co. in .whl/)
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/latency.txt"
FASTLLM="python3 -m fastllm.entrypoints.cli.main"
MODEL=${MODEL:-llama-3-8b}
COMMON="--model $MODEL --load-format dummy --dtype bfloat16"

step() {  # step NAME SECONDS COMMAND...: run, keep the output's tail
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/$name.txt"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$OUT/$name.txt" 2>&1
  echo "== rc=$? in $((SECONDS - start))s" | tee -a "$OUT/$name.txt"
  tail -25 "$OUT/$name.txt"
}

step latency 100 $FASTLLM bench latency $COMMON --batch-size 1 16 --input-len 128 --output-len 256 \
  --num-iters 2 --max-num-seqs 16 --output-json "$OUT/latency.json"
# the same batch-1 run with each step read before the next is queued: what async scheduling gains
step latency_sync 60 $FASTLLM bench latency $COMMON --batch-size 1 --input-len 128 --output-len 256 \
  --num-iters 1 --max-num-seqs 16 --async-scheduling false
step throughput 220 $FASTLLM bench throughput $COMMON --num-prompts 1000 --input-len 1024 --output-len 256 \
  --range-ratio 0 --quiet --compare hf --hf-num-prompts 32 --output-json "$OUT/throughput.json"
step equality 80 sh -c "python3 benchmarks/backend_equality.py --model smollm2-135m --dtype float32 && \
  python3 benchmarks/backend_equality.py --model smollm2-135m --dtype bfloat16"
step tests 90 python3 -m pytest -q -x -p no:cacheprovider tests/attention tests/layers \
  tests/engine/test_cuda_graphs.py
