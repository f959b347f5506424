set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_old .whl_old/*.whl
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site python3 -P -c "import tokenizers, transformers; print('tokenizers', tokenizers.__version__, 'transformers', transformers.__version__)
from transformers import AutoTokenizer; from fastllm.engine.detokenizer import new_detokenizer
print(type(new_detokenizer(AutoTokenizer.from_pretrained('.gguf/smollm2-tokenizer'), [1, 2], True)).__name__)"
B="python3 -P benchmarks/structured_output.py --load-format dummy --dtype bfloat16 --tokenizer .gguf/smollm2-tokenizer --max-tokens 128 --max-model-len 1024 --num-prompts 64"
T="python3 -P -m fastllm.entrypoints.cli.main bench throughput --model smollm2-135m --load-format dummy --dtype bfloat16 --tokenizer .gguf/smollm2-tokenizer --num-prompts 1000 --input-len 128 --output-len 128 --range-ratio 0 --quiet --max-num-seqs 256"
R=0
for v in old new old new; do
  R=$((R + 1))
  if [ $v = old ]; then PP=/tmp/site_old:/tmp/site; else PP=/tmp/site; fi
  echo "=== structured smollm2-135m dummy $v"
  PYTHONPATH=$PP timeout 100 $B --model smollm2-135m --repeats 2 --output-json $OUT/s135m_${v}_$R.json 2>&1 | grep -E -A4 "^(structured|mode|ms per)"
  [ $R -gt 2 ] && continue
  echo "=== throughput smollm2-135m dummy $v"
  PYTHONPATH=$PP timeout 100 $T --output-json $OUT/t135m_$v.json 2>&1 | grep -v Warn | tail -14
done
