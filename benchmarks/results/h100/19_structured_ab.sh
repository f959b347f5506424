set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_old .whl_old/*.whl
nvidia-smi --query-gpu=name --format=csv,noheader
B="python3 -P benchmarks/structured_output.py --load-format dummy --dtype bfloat16 --tokenizer .gguf/smollm2-tokenizer --max-tokens 128 --max-model-len 1024 --num-prompts 64"
for round in 1 2; do
for v in old new; do
  if [ $v = old ]; then PP=/tmp/site_old:/tmp/site; else PP=/tmp/site; fi
  echo "=== 8B $v round $round"
  PROF=""; [ $v = new ] && [ $round = 2 ] && PROF=--profile
  PYTHONPATH=$PP timeout 150 $B --model llama-3-8b --repeats 2 $PROF --output-json $OUT/s8b_${v}_$round.json 2>&1 | grep -v Warning | grep -E -A5 "^(structured|mode|ms per|profile)" | grep -v "^--$" | grep -v nvjet
done
done
for v in old new; do
  if [ $v = old ]; then PP=/tmp/site_old:/tmp/site; else PP=/tmp/site; fi
  echo "=== smollm2-135m dummy $v"
  PYTHONPATH=$PP timeout 100 $B --model smollm2-135m --repeats 2 --output-json $OUT/s135m_$v.json 2>&1 | grep -E -A4 "^(structured|mode|ms per)"
done
