set -u
# Tenth session: the xgrammar mask fill on eight threads always (fixed8: BatchFiller's chunk_s
# patched to 1 ns, so every fill after the first takes the maximum, as before 826cb5d) against one
# thread per 0.2 ms of the previous fill (adaptive, the default), same wheels, interleaved.
# (A first try installed the plugin of 6b3ed80 beside the new fastllm; the benchmark imports
# BatchFiller, which that plugin lacks, so its runs failed; its "new" runs are 20_structured_*_new.json.)
export PYTHONPATH=/tmp/site
B="--load-format dummy --dtype bfloat16 --tokenizer .gguf/smollm2-tokenizer --max-tokens 128 --max-model-len 1024 --num-prompts 64 --repeats 2"
run() {  # run MODEL fixed8|adaptive TAG
  echo "=== $1 $2 $3"
  if [ $2 = fixed8 ]; then
    timeout 100 python3 -P -c "import runpy,sys; import fastllm_xgrammar.bitmask as b; b.BatchFiller.__init__.__defaults__=(1e-9,); sys.argv=['s']+sys.argv[1:]; runpy.run_path('benchmarks/structured_output.py', run_name='__main__')" $B --model $1 --output-json $OUT/20_structured_$3_$2.json
  else
    timeout 100 python3 -P benchmarks/structured_output.py $B --model $1 --output-json $OUT/20_structured_$3_$2.json
  fi
}
for r in 3 4 5; do run smollm2-135m fixed8 s135m_$r; run smollm2-135m adaptive s135m_$r; done
run llama-3-8b fixed8 s8b
