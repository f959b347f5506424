#!/usr/bin/env bash
# What the CUDA path has to show, in phases that each fit one 10-minute call, most important
# first; each step is time-boxed and writes its own file under $OUT, so a cut-short call
# still reports.
#   OUT=/tmp/out bash benchmarks/gpu_session.sh PHASE...
#   (engine, features, quant, quantdecode, quantsweep, serve, stash, smollm2, gputests, structured8b, equality,
#   moe, moedecode, moeprofile, moetiles, moecheck, b1, expertgemv, moegemv, moequant, moethroughput, multimodal, parallel,
#   tpspeed, pair2, lamport2, tpoffline2, tpprofile2, dpep2, dpgraph2, ep2, big4, lanes4, warmcheck, ernieoffline)
# .whl/ holds wheels of what the GPU machine lacks (pydantic, xgrammar, fastapi, openai, ...) and
# of fastllm's own distributions (benchmarks/device_wheels.sh builds them from HEAD); python runs
# with -P, so fastllm comes from those wheels, not from the working tree beside them. .gguf/ may
# hold the SmolLM2 GGUF in parts (smollm2.part_*), joined on the machine once all have arrived.
set -u
PHASES=${*:-engine}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
# SITE_FIRST: a target of other wheels (an older build's fastllm) put ahead of .whl's, for A/B runs
[ -n "${SITE_FIRST:-}" ] && export PYTHONPATH=$SITE_FIRST:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
GGUF=/root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /root/smollm2
cp .gguf/smollm2.part_* /root/smollm2/ 2>/dev/null
if [ ! -f "$GGUF" ] && [ -f /root/smollm2/smollm2.part_a ] && [ -f /root/smollm2/smollm2.part_b ]; then
  cat /root/smollm2/smollm2.part_a /root/smollm2/smollm2.part_b > "$GGUF"
fi
SMOLLM2=smollm2-135m; SMOLLM2_FORMAT=dummy
if [ -f "$GGUF" ]; then SMOLLM2=$GGUF; SMOLLM2_FORMAT=gguf; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
echo "phases $PHASES, SmolLM2: $SMOLLM2 ($SMOLLM2_FORMAT)" | tee -a "$OUT/device.txt"
PY="python3 -P"
FASTLLM="$PY -m fastllm.entrypoints.cli.main"
MODEL=${MODEL:-llama-3-8b}
COMMON="--model $MODEL --load-format dummy --dtype bfloat16"

# The 4-GPU phases (big4, lanes4) keep each step's log and JSON in $GATHERED and gather them all
# into $FINAL/results.json and $FINAL/summary.txt after every step: a call brings back few files,
# and one cut short still returns what ran. Send the call's output back unfiltered (a pipe into
# tail prints nothing when the call's limit kills it). Their steps' limits add up to about 240 s
# (big4) and 260 s (lanes4): give a call of both 560 s.
FINAL=$OUT; GATHERED=/tmp/gathered; mkdir -p $GATHERED
BIG="--model llama-3-70b --load-format dummy --dtype bfloat16 -tp 4"
collect() {
  $PY -c "import glob, json, os, sys; json.dump({os.path.basename(p)[:-5]: json.load(open(p)) for p in
    sorted(glob.glob(sys.argv[1] + '/*.json'))}, open(sys.argv[2], 'w'), indent=1)" "$GATHERED" "$FINAL/results.json"
  for f in $GATHERED/*.txt; do tail -40 "$f"; done > "$FINAL/summary.txt"
}
lane() { step "$@"; collect; }

step() {  # step NAME SECONDS COMMAND...: run, keep the output's tail
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/$name.txt"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$OUT/$name.txt" 2>&1
  echo "== rc=$? in $((SECONDS - start))s" | tee -a "$OUT/$name.txt"
  tail -${TAIL:-25} "$OUT/$name.txt"
}

for PHASE in $PHASES; do
case $PHASE in
engine)
  step latency 150 $FASTLLM bench latency $COMMON --batch-size 1 16 --input-len 128 --output-len 256 \
    --num-iters 2 --max-num-seqs 16 --output-json "$OUT/latency.json"
  # the same batch-1 run with each step read before the next is queued: what async scheduling gains
  step latency_sync 70 $FASTLLM bench latency $COMMON --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters 1 --max-num-seqs 16 --async-scheduling false
  step throughput 230 $FASTLLM bench throughput $COMMON --num-prompts 1000 --input-len 1024 --output-len 256 \
    --range-ratio 0 --quiet --compare hf --hf-num-prompts 32 --output-json "$OUT/throughput.json"
  TAIL=8 step tests 110 $PY -m pytest -q -x -p no:cacheprovider tests/attention tests/layers \
    tests/engine/test_cuda_graphs.py tests/engine/test_dependent_launch.py kernels/tests
  ;;
features)
  step equality 100 sh -c "$PY benchmarks/backend_equality.py --model $SMOLLM2 --load-format $SMOLLM2_FORMAT \
    --dtype float32 && $PY benchmarks/backend_equality.py --model $SMOLLM2 --load-format $SMOLLM2_FORMAT --dtype bfloat16"
    if [ "$SMOLLM2_FORMAT" = gguf ]; then
    step lookahead 120 $PY benchmarks/lookahead.py --model "$SMOLLM2" --dtype bfloat16 --num-prompts 4 \
      --output-json "$OUT/lookahead.json"
    step structured 90 $PY benchmarks/structured_output.py --model "$SMOLLM2" --num-prompts 64 \
      --max-tokens 128 --repeats 2 --output-json "$OUT/structured_output.json"
  fi
  ;;
serve)
  # random Llama-3-8B-shaped weights over SmolLM2's vocabulary, so that the text has real tokens;
  # offline first, then the server on the same engine settings: rate inf on the same 500 prompts,
  # then the serving table at 4, 8 and 16 req/s on RATE_PROMPTS prompts each
  SERVE_ENGINE="$COMMON --tokenizer .gguf/smollm2-tokenizer --hf-overrides {\"vocab_size\":49152} --max-model-len 2048 \
    --max-num-batched-tokens 8192"
  for RUN in $(seq ${OFFLINE_RUNS:-1}); do  # 2 on a fresh machine: the first run compiles Triton while timed
    step offline 150 $FASTLLM bench throughput $SERVE_ENGINE --num-prompts 500 --input-len 1024 --output-len 256 \
      --range-ratio 0 --quiet --output-json "$OUT/offline.json"
  done
  $FASTLLM serve $SERVE_ENGINE --port 8011 --disable-log-requests >"$OUT/server.txt" 2>&1 &
  for _ in $(seq 120); do curl -sf localhost:8011/health >/dev/null && break; sleep 2; done
  for RATE in inf ${RATES:-4 8 16}; do
    PROMPTS=${RATE_PROMPTS:-100}; [ "$RATE" = inf ] && PROMPTS=500
    step serve_$RATE 240 $FASTLLM bench serve --base-url http://127.0.0.1:8011 --tokenizer .gguf/smollm2-tokenizer \
      --num-prompts $PROMPTS --random-input-len 1024 --random-output-len 256 --ignore-eos --request-rate $RATE \
      --save-result --result-dir "$OUT" --result-filename serve_$RATE.json
  done
  curl -s localhost:8011/metrics | grep -E "^fastllm:(num_requests|kv_cache_usage)" | tee -a "$OUT/serve_inf.txt"
  kill %1
  ;;
stash)  # nothing but the copy of a GGUF part above: the next call, on the warm machine, brings the other
  ;;
smollm2)  # the SmolLM2 benchmarks of features, most wanted first, for a short lease (equality: its own phase)
  if [ "$SMOLLM2_FORMAT" = gguf ]; then
    step lookahead 100 $PY benchmarks/lookahead.py --model "$SMOLLM2" --dtype bfloat16 --num-prompts 4 \
      --warmup 1 --no-check-float32 --output-json "$OUT/lookahead.json"
    step structured 50 $PY benchmarks/structured_output.py --model "$SMOLLM2" --num-prompts 64 \
      --max-tokens 128 --repeats 2 --output-json "$OUT/structured_output.json"
  fi
  ;;
gputests)  # every test that runs on CUDA, no time box short of the call's
  TAIL=15 step tests 560 $PY -m pytest -q -p no:cacheprovider --durations=5 tests/attention tests/layers \
    tests/engine/test_cuda_graphs.py tests/engine/test_dependent_launch.py kernels/tests
  ;;
structured8b)  # an 8B-sized step over SmolLM2's vocabulary: what grammars cost a model worth guiding
  TAIL=45 step structured_8b 300 $PY benchmarks/structured_output.py $COMMON --tokenizer .gguf/smollm2-tokenizer \
    --num-prompts 64 --max-tokens 128 --repeats 2 --max-model-len 1024 --profile \
    --output-json "$OUT/structured_output_8b.json"
  ;;
equality)  # triton vs torch greedy on SmolLM2's real weights: chat questions in bf16 and float32
  # (EQUALITY_DTYPES), then bf16 on uniformly random tokens and on passages of a book
  for dtype in ${EQUALITY_DTYPES:-bfloat16 float32}; do
    step equality_$dtype 150 $PY benchmarks/backend_equality.py --model $SMOLLM2 --load-format $SMOLLM2_FORMAT \
      --dtype $dtype --num-prompts 64 --output-json "$OUT/equality_$dtype.json"
  done
  for prompts in random text; do
    step equality_bf16_$prompts 150 $PY benchmarks/backend_equality.py --model $SMOLLM2 \
      --load-format $SMOLLM2_FORMAT --dtype bfloat16 --prompts $prompts --output-json "$OUT/equality_bf16_$prompts.json"
  done
  ;;
quant)
  # Triton compiles every parametrised variant afresh on a new machine: about a minute of each box
  TAIL=5 step quant_tests 200 $PY -m pytest -q -x -p no:cacheprovider kernels/tests/quant
  step quant_gemm 150 $PY benchmarks/quant_gemm.py --out "$OUT/quant_gemm.json"
  step quant 150 $PY benchmarks/quant_decode.py --model $MODEL --load-format dummy --decode-tokens 128 \
    --num-prompts 256 --out "$OUT/quant_decode.json"
  ;;
quantdecode)  # batch-1 decode of each method, the LM head float and quantized
  step quant 240 $PY benchmarks/quant_decode.py --model $MODEL --load-format dummy --decode-tokens 128 \
    --num-prompts 256 --methods ${QUANT_METHODS:-bf16 weight_only_int8 fp8 nf4 weight_only_int4 fp8+lm_head \
    weight_only_int4+lm_head nf4+lm_head weight_only_int8+lm_head} --out "$OUT/quant_decode.json"
  ;;
moe)  # the MoE kernels at real sizes, tests and timings against the torch loop
  TAIL=5 step moe_tests 150 $PY -m pytest -q -x -p no:cacheprovider kernels/tests/test_fused_experts.py \
    kernels/tests/test_moe_routing.py tests/layers/test_fused_ops.py -k "not greedy"
  step moe_kernel 100 $PY kernels/bench_fused_moe.py --models qwen3-30b-a3b ernie-4.5-21b-a3b \
    --tokens 1 16 256 4096 --csv "$OUT/fused_moe.csv"
  ;;
moedecode)  # batch-1 decode of the two A3B MoE models against their active-weight roofline
  for M in ernie-4.5-21b-a3b qwen3-30b-a3b; do
    step "latency_$M" 90 $FASTLLM bench latency --model $M --load-format dummy --dtype bfloat16 --batch-size 1 \
      --input-len 128 --output-len 256 --num-iters 2 --max-num-seqs 16 --output-json "$OUT/latency_$M.json"
  done
  ;;
moeprofile)  # batch-1 decode of the A3B MoE models, bf16 and fp8, each with its kernel profile
  for M in qwen3-30b-a3b ernie-4.5-21b-a3b; do
    TAIL=70 step "profile_$M" 200 $PY benchmarks/quant_decode.py --model $M --methods bf16 fp8 --throughput-methods \
      --decode-repeats 2 --max-num-seqs 4 --profile --profile-rows 30 --out "$OUT/profile_$M.json"
  done
  ;;
moetiles)  # the MoE kernels' GPU tests (vLLM's case grid too), then Qwen3-30B-A3B's decode tiles (bf16, fp8) and
  # the layer at batch 1
  TAIL=5 step moe_tests 240 $PY -m pytest -q -x -p no:cacheprovider kernels/tests/test_fused_experts.py \
    kernels/tests/test_fused_experts_vllm_grid.py kernels/tests/test_moe_routing.py tests/layers/test_fused_ops.py \
    -k "not greedy"
  for fmt in model fp8; do
    TAIL=12 step "moe_sweep_$fmt" 90 $PY kernels/bench_fused_moe.py --sweep --experts $fmt --models qwen3-30b-a3b \
      --tokens 1 2
    step "moe_layer_$fmt" 60 $PY kernels/bench_fused_moe.py --experts $fmt --models qwen3-30b-a3b ernie-4.5-21b-a3b \
      --tokens 1 16 --csv "$OUT/fused_moe_$fmt.csv"
  done
  ;;
moecheck)  # the decode kernels' GPU tests, then the batch-1 figures of phase b1
  TAIL=5 step kernel_tests 240 $PY -m pytest -q -x -p no:cacheprovider kernels/tests/test_decode_attention.py \
    kernels/tests/test_rotary.py kernels/tests/test_kv_cache.py kernels/tests/test_fused_experts.py \
    kernels/tests/quant/test_weight_gemm.py
  ;&
b1)  # Qwen3-30B-A3B's batch-1 profile (bf16, fp8), Llama-3-8B batch 1
  TAIL=70 step profile_qwen3 200 $PY benchmarks/quant_decode.py --model qwen3-30b-a3b --methods bf16 fp8 \
    --throughput-methods --decode-repeats 2 --max-num-seqs 4 --profile --profile-rows 30 --out "$OUT/profile_qwen3.json"
  step decode_llama 120 $PY benchmarks/quant_decode.py --methods bf16 --throughput-methods --decode-repeats 3 \
    --max-num-seqs 4 --out "$OUT/decode_llama.json"
  ;;
expertgemv)  # batch-1 MoE experts on the one-row GEMV (#25): its tests, ERNIE-4.5-21B-A3B and Qwen3-30B-A3B bf16 /
  # fp8 against the grouped GEMMs (+grouped) in one run each, then the L2-cold layers; limits add up to 590 s
  TAIL=5 step expertgemv_tests 150 $PY -m pytest -q -x -p no:cacheprovider kernels/tests/test_expert_gemv.py \
    kernels/tests/test_fused_experts.py
  for model in ernie-4.5-21b-a3b qwen3-30b-a3b; do
    TAIL=8 step "expertgemv_$model" 150 $PY benchmarks/quant_decode.py --model $model --methods bf16 bf16+grouped fp8 \
      fp8+grouped --throughput-methods --decode-repeats 2 --max-num-seqs 4 --out "$OUT/expertgemv_$model.json"
  done
  TAIL=20 step expertgemv_cold 140 $PY kernels/bench_fused_moe.py --cold --models ernie-4.5-21b-a3b qwen3-30b-a3b \
    --experts model fp8 int4 nf4 --weight-sets 4 --variants default gemv --csv "$OUT/expertgemv_cold.csv"
  ;;
moegemv)  # batch-1 expert GEMMs (#25, helper moegemv): the fused-MoE kernel tests, batch-1 Qwen3-30B-A3B bf16 and
  # fp8 with the default decode tiles, then the L2-cold sweep of the one-pair-a-block tiles (bench_fused_moe.py --cold:
  # Qwen3-30B-A3B, then ERNIE-4.5-21B-A3B, bf16 and fp8, one token; its CSV grows row by row, so a cut keeps what
  # ran). $OUT: device.txt, summary.txt, results.json (the latency JSONs), moegemv_cold.csv. Limits add up to 370 s
  # (the tests took over 60 s on an H100).
  OUT=$GATHERED
  TAIL=5 lane moegemv_tests 150 $PY -m pytest -q -x -p no:cacheprovider kernels/tests/test_fused_experts.py
  for q in none fp8; do
    TAIL=8 lane moegemv_latency_$q 70 $FASTLLM bench latency --model qwen3-30b-a3b --load-format dummy \
      --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 --max-num-seqs 16 \
      $([ $q = none ] || echo --quantization $q) --output-json "$OUT/moegemv_latency_$q.json"
  done
  TAIL=70 lane moegemv_cold 80 $PY kernels/bench_fused_moe.py --cold --experts model fp8 --models qwen3-30b-a3b \
    ernie-4.5-21b-a3b --tokens 1 --weight-sets 4 --csv "$FINAL/moegemv_cold.csv"
  ;;
moequant)  # quantized experts: the kernel per format, then batch-1 decode of each beside bf16 in one call
  for fmt in fp8 int4 nf4; do
    step "moe_kernel_$fmt" 60 $PY kernels/bench_fused_moe.py --experts $fmt --models qwen3-30b-a3b \
      ernie-4.5-21b-a3b --tokens 1 16 128 --csv "$OUT/fused_moe_$fmt.csv"
  done
  for q in none fp8 weight_only_int4; do
    step "latency_qwen3_$q" 90 $FASTLLM bench latency --model qwen3-30b-a3b --load-format dummy --dtype bfloat16 \
      --batch-size 1 --input-len 128 --output-len 256 --num-iters 2 --max-num-seqs 16 \
      $([ $q = none ] || echo --quantization $q) --output-json "$OUT/latency_qwen3_$q.json"
  done
  step latency_qwen3_fp8_int8head 90 $FASTLLM bench latency --model qwen3-30b-a3b --load-format dummy \
    --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 256 --num-iters 2 --max-num-seqs 16 \
    --quantization fp8 --quantize-lm-head --output-json "$OUT/latency_qwen3_fp8_int8head.json"
  ;;
moethroughput)  # offline 1000 x (1024 in / 256 out) on the A3B MoE models, ERNIE beside HF generate
  # (the HF load and generate follow fastllm's 45-50 s run); Qwen3 with fp8 experts, whose KV room
  # is 37.6 GiB against bf16's 11.5 GiB
  step throughput_ernie 300 $FASTLLM bench throughput --model ernie-4.5-21b-a3b --load-format dummy \
    --dtype bfloat16 --num-prompts 1000 --input-len 1024 --output-len 256 --range-ratio 0 --quiet --compare hf \
    --hf-num-prompts 16 --max-num-seqs 512 --output-json "$OUT/throughput_ernie.json"
  step throughput_qwen3 240 $FASTLLM bench throughput --model qwen3-30b-a3b --load-format dummy \
    --dtype bfloat16 --quantization fp8 --num-prompts 1000 --input-len 1024 --output-len 256 --range-ratio 0 \
    --quiet --max-num-seqs 512 --output-json "$OUT/throughput_qwen3.json"
  ;;
quantsweep)  # launch settings per weight-only kernel: the data behind default_tiling
  step quant_sweep 420 $PY benchmarks/quant_gemm.py --sweep --out "$OUT/quant_gemm_sweep.json"
  ;;
multimodal)  # Qwen2.5-VL-7B: 500 one-image requests against HF's batched generate; ERNIE-4.5-VL-28B-A3B decode
  step mm_fastllm 200 $PY benchmarks/multimodal_bench.py --phase fastllm --model qwen2.5-vl-7b --num-prompts 500
  step mm_hf 120 $PY benchmarks/multimodal_bench.py --phase hf --model qwen2.5-vl-7b --num-prompts 32 --hf-batch 16
  step mm_ernie 150 $PY benchmarks/multimodal_bench.py --phase decode --model ernie-4.5-vl-28b-a3b --num-prompts 64 \
    --image-size 448 --decode-len 128
  ;;
parallel)  # two GPUs: TP=2 and DP=2 against TP=1 on the same machine (batch-1 decode, then offline)
  LAT="bench latency $COMMON --batch-size 1 --input-len 128 --output-len 256 --num-iters 2 --max-num-seqs 16"
  TPUT="bench throughput $COMMON --num-prompts ${PROMPTS:-500} --input-len 1024 --output-len 256 --range-ratio 0 --quiet"
  step latency_tp1 100 $FASTLLM $LAT
  step latency_tp2 110 $FASTLLM $LAT -tp 2
  TAIL=8 step parallel_tests 90 env PYTHONPATH="$PYTHONPATH:$PWD" $PY -m pytest -q -p no:cacheprovider \
    tests/distributed/test_tensor_parallel.py tests/distributed/test_pipeline_parallel.py -k "tp2_matches or 1-2"
  step throughput_tp2 90 $FASTLLM $TPUT -tp 2 --output-json "$OUT/throughput_tp2.json"
  step throughput_tp1 90 $FASTLLM $TPUT --output-json "$OUT/throughput_tp1.json"
  step throughput_dp2 90 $FASTLLM $TPUT -dp 2 --output-json "$OUT/throughput_dp2.json"
  step throughput_pp2 90 $FASTLLM $TPUT -pp 2 --output-json "$OUT/throughput_pp2.json"
  ;;
tpspeed)  # two GPUs in one short lease, most wanted first: all-reduce by size, batch-1 and offline TP=2
  # (graphs on, symmetric-memory all-reduce) against TP=1, an MoE at EP=2 and TP=2, then DP=2
  LAT="bench latency $COMMON --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 --max-num-seqs 16"
  TPUT="bench throughput $COMMON --num-prompts ${PROMPTS:-200} --input-len 1024 --output-len 256 --range-ratio 0 --quiet"
  MOE="bench latency --model ${MOE_MODEL:-qwen3-30b-a3b} --load-format dummy --dtype bfloat16 --batch-size 1 \
    --input-len 128 --output-len 128 --num-iters 2 --max-num-seqs 16 -tp 2 --tp-cuda-graphs"
  step all_reduce 40 $PY benchmarks/all_reduce.py --world-size 2 --output-json "$OUT/all_reduce.json"
  step latency_tp1 50 $FASTLLM $LAT --output-json "$OUT/latency_tp1.json"
  step latency_tp2 60 $FASTLLM $LAT -tp 2 --tp-cuda-graphs --output-json "$OUT/latency_tp2.json"
  step throughput_tp1 50 $FASTLLM $TPUT --output-json "$OUT/throughput_tp1.json"
  step throughput_tp2 55 $FASTLLM $TPUT -tp 2 --tp-cuda-graphs --output-json "$OUT/throughput_tp2.json"
  step moe_ep2 60 $FASTLLM $MOE --enable-expert-parallel --output-json "$OUT/moe_ep2.json"
  # EP=2 with the all-reduce at every size (no all-to-all): the default's prefill against it
  step moe_ep2_allreduce 60 env FASTLLM_EP_ALL_TO_ALL_MIN_TOKENS=1000000000 $FASTLLM $MOE --enable-expert-parallel \
    --output-json "$OUT/moe_ep2_allreduce.json"
  step moe_tp2 60 $FASTLLM $MOE --output-json "$OUT/moe_tp2.json"
  step throughput_dp2 60 $FASTLLM $TPUT -dp 2 --output-json "$OUT/throughput_dp2.json"
  step latency_tp2_nccl 60 env FASTLLM_SYMM_MEM_ALL_REDUCE=0 $FASTLLM $LAT -tp 2 --tp-cuda-graphs
  # greedy EP=2 = HF on CUDA: the symmetric all-reduce, the expert placement and the Triton experts together
  TAIL=6 step ep2_equality 60 env PYTHONPATH="$PYTHONPATH:$PWD" $PY -m pytest -q -x -p no:cacheprovider \
    tests/distributed/test_expert_parallel.py
  ;;
pair2)  # two GPUs, one short call: all-reduce by size, TP=1 and TP=2 batch-1 decode each with rank 0's
  # kernel profile, then Qwen3-30B-A3B at EP=2 (MOE_EP_ARGS: extra flags of the EP mode) and TP=2
  OUT=$GATHERED
  MOE="bench latency --model qwen3-30b-a3b --load-format dummy --dtype bfloat16 --batch-size 1 64 --input-len 128 \
    --output-len 128 --num-iters 1 --max-num-seqs 64 -tp 2"
  lane all_reduce 40 $PY benchmarks/all_reduce.py --world-size 2 --output-json "$OUT/all_reduce.json"
  for tp in 1 2; do
    TAIL=40 lane decode_tp$tp 100 $PY benchmarks/quant_decode.py --methods bf16 --throughput-methods --decode-repeats 2 \
      --profile --profile-rows 12 -tp $tp --out "$OUT/decode_tp$tp.json"
  done
  lane moe_ep2 130 $FASTLLM $MOE --enable-expert-parallel ${MOE_EP_ARGS:-} --output-json "$OUT/moe_ep2.json"
  lane moe_tp2 130 $FASTLLM $MOE --output-json "$OUT/moe_tp2.json"
  ;;
lamport2)  # two GPUs: the barrier-free all-reduce's GPU tests and latency by size, then Llama-3-8B batch 1
  # at TP=1, at TP=2 with it and (AB=1, the default) at TP=2 without it (FASTLLM_LAMPORT_ALL_REDUCE=0), rank 0's
  # profile each
  OUT=$GATHERED
  TAIL=12 lane lamport_tests 150 env PYTHONPATH=$PYTHONPATH:.:kernels/tests $PY -m pytest -q -x -p no:cacheprovider \
    kernels/tests/test_lamport_all_reduce.py tests/distributed/test_lamport_all_reduce_gpus.py
  lane all_reduce 80 $PY benchmarks/all_reduce.py --world-size 2 --output-json "$OUT/all_reduce.json"
  DECODE="benchmarks/quant_decode.py --methods bf16 --throughput-methods --decode-repeats 2 --max-num-seqs 4 --profile --profile-rows 14"
  TAIL=40 lane decode_tp2 100 $PY $DECODE -tp 2 --out "$OUT/decode_tp2.json"
  TAIL=40 lane decode_tp1 90 $PY $DECODE --out "$OUT/decode_tp1.json"
  [ "${AB:-1}" = 1 ] && TAIL=40 lane decode_tp2_barrier 100 env FASTLLM_LAMPORT_ALL_REDUCE=0 $PY $DECODE -tp 2 \
    --out "$OUT/decode_tp2_barrier.json"
  ;;
tpoffline2|tpprofile2)  # two GPUs: Llama-3-8B offline, the issue's 1000 x (1024 in / 256 out), TP=2 against TP=1,
  # each from an empty Triton cache (no run finds what the other compiled) under rank 0's step timeline;
  # tpprofile2 adds every rank's traces of the steps WINDOWS names (FASTLLM_TORCH_PROFILER_*), summed up by
  # trace_summary.py. EXTRA: more engine flags for both runs, named by SUFFIX (e.g. _s512); TPS: which runs
  # (e.g. `FASTLLM_LAMPORT_MAX_KIB=256 TPS=2 SUFFIX=_lamport256k`: the barrier-free all-reduce up to 256 KiB only)
  OUT=$GATHERED
  TPUT="bench throughput $COMMON --num-prompts ${PROMPTS:-1000} --input-len 1024 --output-len 256 --range-ratio 0 --quiet"
  for TP in ${TPS:-2 1}; do
    TAG=tp$TP${SUFFIX:-}; TRACES=""; [ $PHASE = tpprofile2 ] && TRACES=/tmp/traces/$TAG
    TRITON_CACHE_DIR=/tmp/triton_$TAG FASTLLM_TORCH_PROFILER_DIR=$TRACES \
      FASTLLM_TORCH_PROFILER_STEPS=${WINDOWS:-60:2,400:2} TAIL=16 lane offline_$TAG 200 \
      $PY benchmarks/step_timeline.py $TAG $GATHERED $TPUT -tp $TP ${EXTRA:-} --output-json "$OUT/offline_$TAG.json"
    [ -n "$TRACES" ] && $PY benchmarks/trace_summary.py $TRACES "$OUT/traces_$TAG.json" | tee "$OUT/traces_$TAG.txt"
    cp $GATHERED/steps_$TAG.csv "$FINAL/"; collect
  done
  [ $PHASE = tpprofile2 ] && tar czf "$FINAL/traces.tgz" -C /tmp traces
  ;;
dpep2)  # two GPUs: Qwen3-30B-A3B offline with data-parallel attention over expert-parallel MoE (-dp 2) against
  # EP=2 and TP=2 (the all-reduce at every size), then batch 1 at -dp 2
  OUT=$GATHERED
  Q3="--model qwen3-30b-a3b --load-format dummy --dtype bfloat16"
  TPUT="bench throughput $Q3 --num-prompts 200 --input-len 1024 --output-len 128 --range-ratio 0 --quiet"
  TAIL=30 lane dpep_throughput 150 $FASTLLM $TPUT -dp 2 --enable-expert-parallel --output-json "$OUT/dpep_throughput.json"
  TAIL=30 lane ep_throughput 120 $FASTLLM $TPUT -tp 2 --enable-expert-parallel --output-json "$OUT/ep_throughput.json"
  TAIL=30 lane tp_throughput 120 $FASTLLM $TPUT -tp 2 --output-json "$OUT/tp_throughput.json"
  TAIL=30 lane dpep_latency 110 $FASTLLM bench latency $Q3 --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 \
    --max-num-seqs 16 -dp 2 --enable-expert-parallel --output-json "$OUT/dpep_latency.json"
  ;;
dpgraph2)  # two GPUs: DP attention + EP with the lockstep replicas' decode graphs and async scheduling (branch
  # dpgraph): its GPU check against transformers, Qwen3-30B-A3B offline and batch 1 at -dp 2, then TP=2 offline
  # (step limits add up to 380 s; the test alone took about 80 s on two H100s)
  OUT=$GATHERED
  Q3="--model qwen3-30b-a3b --load-format dummy --dtype bfloat16"
  TPUT="bench throughput $Q3 --num-prompts 200 --input-len 1024 --output-len 128 --range-ratio 0 --quiet"
  TAIL=15 lane dpep_test 120 env PYTHONPATH=$PYTHONPATH:. $PY -m pytest -q -x -p no:cacheprovider \
    tests/distributed/test_expert_parallel.py -k "data_parallel_attention and True"
  TAIL=30 lane dpep_throughput 90 $FASTLLM $TPUT -dp 2 --enable-expert-parallel --output-json "$OUT/dpep_throughput.json"
  TAIL=30 lane dpep_latency 70 $FASTLLM bench latency $Q3 --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 \
    --max-num-seqs 16 -dp 2 --enable-expert-parallel --output-json "$OUT/dpep_latency.json"
  TAIL=30 lane tp_throughput 100 $FASTLLM $TPUT -tp 2 --output-json "$OUT/tp_throughput.json"
  ;;
ep2)  # two GPUs: expert parallelism's GPU tests, then Qwen3-30B-A3B offline at EP=2 with the all-to-all
  # dispatch for prefill-sized steps against the all-reduce at every size (whole logs kept)
  EP="bench throughput --model qwen3-30b-a3b --load-format dummy --dtype bfloat16 -tp 2 --enable-expert-parallel \
    --num-prompts 200 --input-len 1024 --output-len 128 --range-ratio 0"
  TAIL=30 step ep_tests 100 env PYTHONPATH=$PYTHONPATH:. $PY -m pytest -q -x -p no:cacheprovider tests/distributed/test_expert_dispatch.py \
    tests/distributed/test_expert_parallel.py
  TAIL=60 step ep_a2a 240 env FASTLLM_EP_ALL_TO_ALL_MIN_TOKENS=512 $FASTLLM $EP --output-json "$OUT/ep_a2a.json"
  TAIL=30 step ep_allreduce 130 $FASTLLM $EP --output-json "$OUT/ep_allreduce.json"
  ;;
big4)  # four GPUs: Llama-3-70B at TP=4, batch 1 against the four GPUs' bandwidth limit, then offline with MFU
  OUT=$GATHERED
  lane big_latency 110 $FASTLLM bench latency $BIG --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 \
    --max-num-seqs 16 --output-json "$OUT/big_latency.json"
  lane big_throughput 130 $FASTLLM bench throughput $BIG --num-prompts ${BIG_PROMPTS:-300} --input-len 1024 \
    --output-len 256 --range-ratio 0 --quiet --output-json "$OUT/big_throughput.json"
  ;;
lanes4)  # four GPUs, disjoint pairs at once: Llama-3-8B TP=1 / TP=2 batch 1, TP=1 / PP=2 / DP=2 offline,
  # Qwen3-30B-A3B at EP=2 and TP=2 (batch 1 and 64)
  OUT=$GATHERED
  LAT="bench latency $COMMON --batch-size 1 --input-len 128 --output-len 256 --num-iters 2 --max-num-seqs 16"
  TPUT="bench throughput $COMMON --num-prompts ${PROMPTS:-500} --input-len 1024 --output-len 256 --range-ratio 0 --quiet"
  MOE="bench latency --model qwen3-30b-a3b --load-format dummy --dtype bfloat16 --batch-size 1 64 --input-len 128 \
    --output-len 128 --num-iters 1 --max-num-seqs 64 -tp 2"
  (export CUDA_VISIBLE_DEVICES=0
   lane latency_tp1 50 $FASTLLM $LAT --output-json "$OUT/latency_tp1.json"
   lane throughput_tp1 65 $FASTLLM $TPUT --output-json "$OUT/throughput_tp1.json") &
  (export CUDA_VISIBLE_DEVICES=1,2
   lane latency_tp2 60 $FASTLLM $LAT -tp 2 --output-json "$OUT/latency_tp2.json"
   lane throughput_pp2 75 $FASTLLM $TPUT -pp 2 --output-json "$OUT/throughput_pp2.json") &
  wait
  (export CUDA_VISIBLE_DEVICES=0,1
   lane throughput_dp2 60 $FASTLLM $TPUT -dp 2 --output-json "$OUT/throughput_dp2.json"
   TAIL=6 lane pp_tests 40 env PYTHONPATH="$PYTHONPATH:$PWD" $PY -m pytest -q -x -p no:cacheprovider \
     tests/distributed/test_pipeline_parallel.py -k "micro_batches or split_step") &
  (export CUDA_VISIBLE_DEVICES=2,3
   lane moe_ep2 60 $FASTLLM $MOE --enable-expert-parallel --output-json "$OUT/moe_ep2.json"
   lane moe_ep2_a2a 60 env FASTLLM_EP_ALL_TO_ALL_MIN_TOKENS=0 $FASTLLM $MOE --enable-expert-parallel \
     --output-json "$OUT/moe_ep2_a2a.json"
   lane moe_tp2 60 $FASTLLM $MOE --output-json "$OUT/moe_tp2.json") &
  wait
  collect  # the lanes' last ones may have raced
  ;;
warmcheck)  # one H100 (#25): no kernel compiled mid-run with prompts of varied length (ERNIE-4.5-21B-A3B, the
  # warm-up to the step budget), then batch-1 Qwen3-30B-A3B bf16 / fp8 over 5 iterations (the 60% line);
  # the steps' limits add up to 340 s
  step warm_ernie 150 $PY benchmarks/step_timeline.py ernie "$OUT" bench throughput --model ernie-4.5-21b-a3b \
    --load-format dummy --dtype bfloat16 --num-prompts 300 --input-len 600 --output-len 64 --range-ratio 0.9 \
    --max-num-seqs 64 --quiet
  for q in none fp8; do
    TAIL=3 step "b1_qwen3_$q" 95 $FASTLLM bench latency --model qwen3-30b-a3b --load-format dummy --dtype bfloat16 \
      --batch-size 1 --input-len 128 --output-len 128 --num-iters 5 --max-num-seqs 16 \
      $([ $q = none ] || echo --quantization $q) --output-json "$OUT/b1_qwen3_$q.json"
  done
  ;;
ernieoffline)  # one H100 (#25): ERNIE-4.5-21B-A3B offline, the issue's 1000 x (1024 in / 256 out), under the step
  # timeline, with traces of the steps WINDOWS names (a mixed step of the first wave, a decode step at full batch)
  # (SUFFIX names the run's files: several runs, e.g. with SITE_FIRST, in one call)
  TAG=ernie_offline${SUFFIX:-}; TRACES=/tmp/traces/$TAG
  FASTLLM_TORCH_PROFILER_DIR=$TRACES FASTLLM_TORCH_PROFILER_STEPS=${WINDOWS:-290:1,450:1} step $TAG 240 \
    $PY benchmarks/step_timeline.py $TAG "$OUT" bench throughput --model ernie-4.5-21b-a3b --load-format dummy \
    --dtype bfloat16 --num-prompts 1000 --input-len 1024 --output-len 256 --range-ratio 0 --max-num-seqs 512 \
    ${EXTRA:-} --output-json "$OUT/$TAG.json"
  $PY benchmarks/trace_summary.py $TRACES "$OUT/traces_$TAG.json" 2>&1 | tail -4
  for f in $TRACES/*.json.gz; do cp "$f" "$OUT/${TAG}_$(basename "$f" | sed 's/.*-step/step/')"; done
  ;;
esac
done
