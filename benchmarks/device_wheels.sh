#!/usr/bin/env bash
# Fill .whl/ (ignored by git) with what a bare GPU machine needs to run benchmarks/gpu_session.sh:
# wheels of fastllm's own distributions, built from HEAD (uncommitted edits stay behind), and of
# the third-party packages its image lacks (for CPython 3.12, manylinux x86-64). Also split the embedded SmolLM2 GGUF into
# .gguf/smollm2.part_a and part_b, since one call carries at most 64 MiB, and save its tokenizer
# alone in .gguf/smollm2-tokenizer (a few MB) for runs that need only the vocabulary.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .gguf
rm -f .whl/fastllm*.whl
head=$(mktemp -d)
git archive HEAD | tar -x -C "$head"
(cd "$head" && python3 -m pip wheel -q --no-deps --no-build-isolation -w "$OLDPWD/.whl" . ./kernels ./templates plugins/*/)
rm -rf "$head"
PLATFORMS=""
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS="$PLATFORMS --platform ${p}_x86_64"
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
  -d .whl pydantic pydantic_core annotated_types typing_inspection typing_extensions fastapi starlette \
  opentelemetry-api uvicorn httptools gguf xgrammar llguidance apache-tvm-ffi "openai<2" distro jiter sniffio
gguf=$(python3 -c "from fastllm.model_loader.resolve import embedded_model_path; print(embedded_model_path())")
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
head -c "$half" "$gguf" > .gguf/smollm2.part_a
tail -c +"$((half + 1))" "$gguf" > .gguf/smollm2.part_b
python3 -c "import sys; from fastllm.model_loader.gguf_loader import GGUFLoader
GGUFLoader().load_tokenizer(sys.argv[1], None).save_pretrained('.gguf/smollm2-tokenizer')" "$gguf"
du -sh .whl .gguf/*
