#!/usr/bin/env bash
# A bundle's llama.cpp recipe, run as its SERVING.md writes it: a tiny Qwen2 student with the
# real Qwen2.5 vocabulary (tests/fixtures/models.py's tokenizer, the shape of the tiny student),
# trained with student/configs/tiny.yaml, merged and exported with the stand-in NLI model; then
# the recipe's `convert_hf_to_gguf.py` and `llama-server` commands (llama.cpp as vendored in
# llama-cpp-python's sdist on PyPI), and `stepgap check --bundle` twice on the example traces:
# with the served student (`--judge openai:stepgap-student`) and with the in-process one.
# Prints the two side by side per step, and whether llama-server renders and tokenizes every
# judge prompt as transformers does.
#
#   bash tools/llama_student_check.sh            # STEPS=100 optimiser steps, as tiny.yaml
#   STEPS=0 bash tools/llama_student_check.sh    # the random student, untrained (minutes)
#
# Needs cmake and a C++ compiler (Debian: cmake g++). Everything is kept in $WORK (default
# /tmp/stepgap-llama, shared with tools/llama_server_check.sh: one llama-server build, 10-20
# minutes on 2 cores) for the next run; so is each trained student, by STEPS (training takes
# 20-60 s a step on 2 shared cores: Qwen2.5's 151,665-token LM head is most of it). A random or
# barely trained model's answers mean nothing: what the run shows is the pipeline end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/llama_cpp.sh
PORT=${PORT:-8432}
STEPS=${STEPS:-100}
MAX_TOKENS=${MAX_TOKENS:-768}  # the in-process student's answer budget, for both
S="$WORK/student-qwen2.5-vocab"
mkdir -p "$S"

llama_server_build
standin_nli

# The student: Qwen2ForCausalLM as the tiny student is built (128 wide, 2 layers), with Qwen2.5's
# vocabulary and special tokens instead of a vocabulary trained on the examples.
[ -f "$S/base/config.json" ] || $PY -c "import sys; sys.path.insert(0, '.')
from tests.fixtures.models import qwen_tokenizer
from stepgap.student.tiny import build_tiny_qwen2
build_tiny_qwen2('$S/base', qwen_tokenizer())"
STUDENT="$S/base"
if [ "$STEPS" -gt 0 ]; then
  STUDENT="$S/adapter-$STEPS"
  if [ ! -f "$STUDENT/adapter_model.safetensors" ]; then
    echo "== training $STEPS steps (log: $S/train-$STEPS.log)"
    $STEPGAP train --config student/configs/tiny.yaml --set model_name_or_path="$S/base" \
      --set output_dir="$STUDENT" --set max_steps="$STEPS" --set eval_strategy=steps \
      --set eval_steps="$STEPS" --set save_steps="$STEPS" --set max_length=16384 \
      > "$S/train-$STEPS.log" 2>&1
  fi
fi
BUNDLE="$S/bundle-$STEPS"  # exported afresh each run: SERVING.md as this stepgap writes it
echo "== stepgap export --student $STUDENT --merge (log: $S/export-$STEPS.log)"
$STEPGAP export --student "$STUDENT" --nli "$NLI" -o "$BUNDLE" --merge --overwrite \
  > "$S/export-$STEPS.log" 2>&1 || { tail -20 "$S/export-$STEPS.log" >&2; exit 1; }

echo "== $BUNDLE/SERVING.md, its llama.cpp section:"
section=$(awk '/^## llama.cpp/{on=1; next} /^## /{on=0} on' "$BUNDLE/SERVING.md")
echo "$section"
commands=$(awk '/^```bash/{on=1; next} /^```/{on=0} on' <<< "$section")
convert=$(grep '^python .*convert_hf_to_gguf.py' <<< "$commands" || true)
serve=$(grep '^llama-server ' <<< "$commands" || true)
if [ -z "$convert" ] || [ -z "$serve" ]; then
  echo "SERVING.md gives no llama.cpp commands for this student" >&2
  exit 1
fi

# The recipe's commands as written, from the bundle's folder: `$LLAMA_CPP` is the vendored
# llama.cpp, `python` this venv's, `llama-server` the build; only the port is this script's.
export LLAMA_CPP="$WORK/src/vendor/llama.cpp"
export PATH="$WORK/build/bin:$(cd "$(dirname "$PY")" && pwd):$PATH"
echo "== $convert"
(cd "$BUNDLE" && rm -f stepgap-student.gguf && eval "$convert") > "$S/convert.log" 2>&1 \
  || { tail -20 "$S/convert.log" >&2; exit 1; }
PYTHONPATH="$LLAMA_CPP/gguf-py" python - "$BUNDLE/stepgap-student.gguf" <<'EOF'
import sys
from gguf import GGUFReader
field = GGUFReader(sys.argv[1]).fields["tokenizer.ggml.pre"]
print("   GGUF tokenizer.ggml.pre =", bytes(field.parts[field.data[0]]).decode())
EOF
serve=$(sed -E "s/--port [0-9]+/--port $PORT/" <<< "$serve")

# How llama-server runs on this machine, not what it runs (the recipe's line is unchanged):
# - one thread by default: ggml's threads spin at every barrier, and on 2 cores shared with
#   other work they wait out each other's time slices (a tiny model's 200 tokens: 0.4 s with one
#   thread, 9 s with two, measured here beside a training run);
# - no weight repacking where the CPU lists AMX: some virtual machines advertise it and fault on
#   its instructions (SIGILL in ggml_backend_amx_mul_mat, at start or later), and ggml's AMX
#   kernels come with repacking.
export LLAMA_ARG_THREADS=${LLAMA_ARG_THREADS:-1}
no_repack_where_amx
echo "== $serve   (the port is this script's)"
echo "   (environment: LLAMA_ARG_THREADS=$LLAMA_ARG_THREADS${LLAMA_ARG_REPACK:+ LLAMA_ARG_REPACK=$LLAMA_ARG_REPACK})"
SERVER=
trap '[ -z "$SERVER" ] || kill $SERVER 2> /dev/null || true' EXIT
(cd "$BUNDLE" && eval "exec $serve") > "$S/llama-server.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break
  kill -0 $SERVER 2> /dev/null || { tail -20 "$S/llama-server.log" >&2; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null || { echo "llama-server never answered" >&2; exit 1; }

URL="http://127.0.0.1:$PORT/v1"
echo "== stepgap check examples/traces.jsonl --bundle BUNDLE --judge openai:stepgap-student --base-url $URL"
rm -f "$S"/verdicts-*.jsonl
start=$(date +%s)
$STEPGAP check examples/traces.jsonl --bundle "$BUNDLE" --judge openai:stepgap-student \
  --base-url "$URL" --max-tokens "$MAX_TOKENS" --no-cache --no-progress \
  -o "$S/verdicts-served.jsonl" 2> "$S/check-served.log" || grep -v "not part of" "$S/check-served.log" | tail -3
touch "$S/verdicts-served.jsonl"
echo "   $(( $(date +%s) - start )) s, $(wc -l < "$S/verdicts-served.jsonl") verdicts"
echo "== stepgap check examples/traces.jsonl --bundle BUNDLE (the student in-process)"
start=$(date +%s)
$STEPGAP check examples/traces.jsonl --bundle "$BUNDLE" --max-tokens "$MAX_TOKENS" \
  --no-progress -o "$S/verdicts-in-process.jsonl" 2> "$S/check-in-process.log" \
  || grep -v "not part of" "$S/check-in-process.log" | tail -3
touch "$S/verdicts-in-process.jsonl"
echo "   $(( $(date +%s) - start )) s, $(wc -l < "$S/verdicts-in-process.jsonl") verdicts"
echo
$PY tools/llama_student_table.py "$BUNDLE" examples/traces.jsonl \
  "$S/verdicts-in-process.jsonl" "$S/verdicts-served.jsonl" "$URL"
echo
echo "== veRL's reward loop (RewardLoopWorker + its NaiveRouter) with llama-server as its reward model"
$PY tools/llama_verl_reward.py "$BUNDLE" "$S/base" "$URL" "$S/verdicts-in-process.jsonl" \
  "$MAX_TOKENS" 2> "$S/verl-reward.log" || { tail -20 "$S/verl-reward.log" >&2; exit 1; }
