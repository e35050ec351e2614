"""`SERVING.md` in a bundle: how to serve its student on an inference engine (vLLM, SGLang,
llama.cpp) and point `stepgap check|serve --bundle` at it, so judging scales past one process
while the ONNX NLI model, the thresholds and the prompt version stay those of the bundle."""

from __future__ import annotations

from typing import Any

SERVED_NAME = "stepgap-student"
RECIPE = "SERVING.md"


def serving_recipe(student: dict[str, Any]) -> str:
    """The recipe for a bundle's `student` manifest entry (merged model or LoRA adapter)."""
    name = SERVED_NAME
    if student["merged"]:
        vllm = f"vllm serve ./student --served-model-name {name} --port 8000"
        sglang = (
            f"python -m sglang.launch_server --model-path ./student --served-model-name {name} "
            "--port 30000"
        )
        gguf = (
            "python convert_hf_to_gguf.py ./student --outfile stepgap-student.gguf --outtype q8_0\n"
            "llama-server -m stepgap-student.gguf --port 8080"
        )
    else:
        base = student["base"] if student.get("base_revision") else f"./{student['base']}"
        revision = f" --revision {student['base_revision']}" if student.get("base_revision") else ""
        vllm = (
            f"vllm serve {base}{revision} --enable-lora --lora-modules {name}=./student "
            "--max-lora-rank 64 --port 8000"
        )
        sglang = (
            f"python -m sglang.launch_server --model-path {base}{revision} --enable-lora "
            f"--lora-paths {name}=./student --port 30000"
        )
        gguf = (
            "merge first (`stepgap export ... --merge`): llama.cpp's converter takes a merged "
            "model folder"
        )
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

`convert_hf_to_gguf.py` is llama.cpp's own script (in its repository and in the `gguf` tools).

```bash
{gguf}
```

## Check or serve rewards with the served student

```bash
stepgap check TRACES.jsonl --bundle . --judge openai:{name} --base-url http://HOST:8000/v1 -o verdicts.jsonl
stepgap serve --bundle . --judge openai:{name} --base-url http://HOST:8000/v1 --port 8100
```

`--concurrency N` sets how many requests are in flight to the engine.
"""
