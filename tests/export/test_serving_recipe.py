"""SERVING.md's llama.cpp part: the converter's commands where llama.cpp takes the student's
tokenizer (the real Qwen2.5 vocabulary), a sentence saying why not where it does not (the tiny
demo students' made-up vocabulary, an unmerged adapter). An optional end-to-end test runs the
recipe with a llama-server built by tools/llama_student_check.sh."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from stepgap.export.llama_cpp_vocab import CHECK_TEXT, llama_cpp_pre_tokenizer, tokenizer_hash
from stepgap.export.serving_recipe import serving_recipe

CONVERT = 'python "$LLAMA_CPP/convert_hf_to_gguf.py" ./student --outfile stepgap-student.gguf'
# tiny_qwen2's context is 4,096 tokens: 4 slots of it
SERVE = "llama-server -m stepgap-student.gguf --alias stepgap-student -np 4 -c 16384 --port 8080"
# llama.cpp's own hash for Qwen1.5's tokenizer (Qwen2 and Qwen2.5 have the same), in its
# convert_hf_to_gguf.py: written here rather than read from the table under test
QWEN2_HASH = "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea"
STUDENT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja")  # fmt: skip


@pytest.fixture(scope="module")
def made_up_tokenizer(tmp_path_factory, example_traces) -> Path:
    """The tiny demo students' kind of tokenizer: a byte-level BPE trained on the examples."""
    from stepgap.student.tiny import corpus_tokenizer

    texts = [s.claim or "" for t in example_traces for s in t.steps] + [CHECK_TEXT]
    path = tmp_path_factory.mktemp("made-up-tokenizer")
    corpus_tokenizer(texts, vocab_size=600).save_pretrained(path)
    return path


def _bundle(root: Path, tokenizer: Path | None, merged: bool = True) -> tuple[dict, Path]:
    """A bundle folder with the student's config and tokenizer only: all the recipe reads."""
    student = root / "student"
    student.mkdir(parents=True)
    for name in STUDENT_FILES if tokenizer else ():
        if (tokenizer / name).is_file():
            shutil.copy2(tokenizer / name, student / name)
    info = {"path": "student", "merged": merged}
    if not merged:
        info.update(base="base", base_source="tiny")
    return info, root


def _llama_cpp(recipe: str) -> str:
    return recipe.split("## llama.cpp", 1)[1].split("\n## ", 1)[0]


def test_the_real_qwen_vocabulary_is_what_the_converter_calls_qwen2(tiny_qwen2):
    from transformers import AutoTokenizer

    assert tokenizer_hash(AutoTokenizer.from_pretrained(tiny_qwen2)) == QWEN2_HASH
    pre, why = llama_cpp_pre_tokenizer(tiny_qwen2)
    assert pre == "qwen2" and "`qwen2`" in why


def test_a_merged_real_vocabulary_student_gets_the_llama_cpp_commands(tiny_qwen2, tmp_path):
    recipe = serving_recipe(*_bundle(tmp_path, tiny_qwen2))
    part = _llama_cpp(recipe)
    assert CONVERT in part and SERVE in part, part
    assert "recognises (pre-tokenizer `qwen2`)" in part and "cannot" not in part
    assert "llama.cpp: 8080" in recipe  # the check command names the port it listens on


def test_a_made_up_vocabulary_gets_a_sentence_instead_of_commands(made_up_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    digest = tokenizer_hash(AutoTokenizer.from_pretrained(made_up_tokenizer))
    assert llama_cpp_pre_tokenizer(made_up_tokenizer)[0] is None
    part = _llama_cpp(serving_recipe(*_bundle(tmp_path, made_up_tokenizer)))
    assert 'convert_hf_to_gguf.py" ./student' not in part and "llama-server -m" not in part
    assert "```" not in part, part
    assert part.strip().startswith("llama.cpp cannot take this student:")
    assert "BPE pre-tokenizer was not recognized" in part and digest in part
    assert "vLLM or SGLang" in part and "qwen2.5-7b-lora.yaml" in part


def test_an_adapter_is_told_to_merge_or_that_merging_would_not_help(
    tiny_qwen2, made_up_tokenizer, tmp_path
):
    part = _llama_cpp(serving_recipe(*_bundle(tmp_path / "a", tiny_qwen2, merged=False)))
    assert "not a LoRA adapter" in part and "`stepgap export ... --merge`" in part
    assert "`qwen2`" in part and CONVERT not in part and "cannot" not in part
    part = _llama_cpp(serving_recipe(*_bundle(tmp_path / "b", made_up_tokenizer, merged=False)))
    assert "llama.cpp cannot take this student, merged or not:" in part and CONVERT not in part
    part = _llama_cpp(serving_recipe(*_bundle(tmp_path / "c", None, merged=False)))
    assert "--merge" in part and "cannot" not in part and CONVERT not in part


def test_a_tokenizer_that_does_not_load_is_no_command(tmp_path):
    info, root = _bundle(tmp_path, None)
    (root / "student" / "tokenizer.json").write_text("{not json")
    part = _llama_cpp(serving_recipe(info, root))
    assert "llama.cpp cannot take this student: its tokenizer does not load" in part
    assert CONVERT not in part


# --- end to end, with a llama-server built outside the test suite ---------------------------

LLAMA_WORK = Path(os.environ.get("STEPGAP_LLAMA_WORK", "/tmp/stepgap-llama"))
LLAMA_SERVER = LLAMA_WORK / "build" / "bin" / "llama-server"
LLAMA_CPP = LLAMA_WORK / "src" / "vendor" / "llama.cpp"


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(
    not (LLAMA_SERVER.is_file() and (LLAMA_CPP / "convert_hf_to_gguf.py").is_file()),
    reason=f"no llama.cpp build at {LLAMA_WORK} (the suite never builds it): run "
    "tools/llama_student_check.sh once, or set STEPGAP_LLAMA_WORK to its $WORK",
)
def test_the_recipe_runs_as_written_with_llama_server(
    tiny_qwen2, tiny_nli, example_traces, tmp_path
):
    """Export a real-vocabulary student, run SERVING.md's two commands, and ask the server what
    stepgap asks: its chat template and tokens are transformers' for every example prompt, and
    it answers the student's json_schema (a random model: an answer cut at max_tokens, in the
    schema's shape)."""
    from transformers import AutoTokenizer

    from stepgap.export.bundle import export_bundle
    from stepgap.student.judge import ServedStudentJudge
    from stepgap.teacher.judges.openai_api import OpenAIJudgeOptions
    from stepgap.teacher.judges.openai_wire import format_params
    from stepgap.teacher.prompt import build_requests

    bundle = export_bundle(str(tiny_qwen2), str(tiny_nli), tmp_path / "bundle")
    part = _llama_cpp((bundle / "SERVING.md").read_text())
    lines = [x for x in part.split("```bash\n", 1)[1].split("```", 1)[0].splitlines() if x]
    assert lines[0].startswith(CONVERT) and lines[1] == SERVE
    env = {
        **os.environ,
        "LLAMA_CPP": str(LLAMA_CPP),
        "PATH": f"{LLAMA_SERVER.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "LLAMA_ARG_THREADS": "1",  # see tools/llama_student_check.sh
    }
    if "amx_tile" in Path("/proc/cpuinfo").read_text():
        env["LLAMA_ARG_REPACK"] = "0"  # ditto: AMX faults on some virtual machines
    subprocess.run(["bash", "-c", lines[0]], cwd=bundle, env=env, check=True, capture_output=True)
    from gguf import GGUFReader

    field = GGUFReader(bundle / "stepgap-student.gguf").fields["tokenizer.ggml.pre"]
    assert bytes(field.parts[field.data[0]]).decode() == "qwen2"

    port = _free_port()
    server = subprocess.Popen(
        ["bash", "-c", "exec " + lines[1].replace("--port 8080", f"--port {port}")],
        cwd=bundle, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=5)
                break
            except OSError:
                assert server.poll() is None, f"llama-server exited ({server.returncode})"
                time.sleep(1)
        tokenizer = AutoTokenizer.from_pretrained(bundle / "student")
        requests = [r for t in example_traces for r in build_requests(t.id, t.question, t.steps)]
        for request in requests:
            messages = [dict(m) for m in request.messages]
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            assert _post(f"{url}/apply-template", {"messages": messages})["prompt"] == text
            ids = _post(f"{url}/tokenize", {"content": text, "parse_special": True})["tokens"]
            assert ids == tokenizer(text, add_special_tokens=False)["input_ids"], request.step
        options = OpenAIJudgeOptions(
            base_url=f"{url}/v1", max_tokens=48, invalid_retries=0, response_format="json_schema"
        )
        judge = ServedStudentJudge("stepgap-student", options)
        [result] = judge.judge(requests[:1])  # taken, answered, read: parsed or cut short
        assert result.judge is not None or "truncated at max_tokens=48" in (result.error or "")
        answer = _post(f"{url}/v1/chat/completions", {
            "model": "stepgap-student", "messages": requests[0].messages, "max_tokens": 48,
            **format_params("json_schema", judge.schema()),
        })["choices"][0]["message"]["content"]  # fmt: skip
        first = next(iter(judge.schema()["properties"]))
        assert answer.lstrip().startswith("{") and f'"{first}"' in answer, answer
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
