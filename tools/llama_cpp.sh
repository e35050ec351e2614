# Sourced by tools/llama_server_check.sh and tools/llama_student_check.sh: what both need of
# llama.cpp, built once into $WORK (default /tmp/stepgap-llama) and kept for the next run.
# llama.cpp is the one vendored in llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (its sdist).
PY=${PY:-.venv/bin/python}
STEPGAP="$PY -m stepgap.cli"
WORK=${WORK:-/tmp/stepgap-llama}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
mkdir -p "$WORK"

llama_cpp_source() {  # the llama.cpp sources (and convert_hf_to_gguf.py) in $WORK/src
  if [ ! -d "$WORK/src" ]; then
    $PY -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK/sdist"
    mkdir -p "$WORK/src" && tar -xzf "$WORK"/sdist/llama_cpp_python-*.tar.gz -C "$WORK/src" --strip-components=1
  fi
}

llama_server_build() {  # $WORK/build/bin/llama-server (10-20 minutes on 2 cores, once)
  llama_cpp_source
  if [ ! -x "$WORK/build/bin/llama-server" ]; then
    cmake -S "$WORK/src/vendor/llama.cpp" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DGGML_NATIVE=ON > "$WORK/cmake.log"
    cmake --build "$WORK/build" --target llama-server -j "$(nproc)" > "$WORK/build.log"
  fi
}

# No real NLI model can be downloaded here: stages D-E get the tests' stand-in (a tiny
# DebertaV2 trained on synthetic pairs), built once; its labels mean nothing.
NLI="$WORK/standin-nli"
standin_nli() {
  [ -f "$NLI/config.json" ] || $PY -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from tests.fixtures.models import build_deberta_nli; build_deberta_nli(Path('$NLI'))"
}

# Some virtual machines list AMX (cpuinfo amx_tile) and fault on its instructions: llama-server
# dies of SIGILL in ggml_backend_amx_mul_mat. ggml's AMX kernels come with weight repacking.
no_repack_where_amx() {
  if grep -q amx_tile /proc/cpuinfo; then export LLAMA_ARG_REPACK=${LLAMA_ARG_REPACK:-0}; fi
}
