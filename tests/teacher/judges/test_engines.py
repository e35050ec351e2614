"""Which engine a local judge decodes on (`--engine auto|vllm|hf`), and the schema constraint's
reading of the vocabulary that both engines share. These run without vLLM; the engine itself is
tested where it is installed (`test_vllm_engine.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepgap.teacher.judges import JudgeConfigError, vllm_engine
from stepgap.teacher.judges.constrained import build_index, judge_regex, token_bytes
from tests.fixtures.models import qwen_tokenizer


@pytest.fixture
def vllm_on(monkeypatch):
    """Pretend vLLM runs on the given device (None: not installed); forget what was printed."""
    monkeypatch.setattr(vllm_engine, "_announced", set())

    def on(device: str | None) -> None:
        monkeypatch.setattr(vllm_engine, "vllm_device", lambda: device)

    return on


def test_auto_is_hf_where_vllm_is_missing_and_the_choice_is_printed_once(vllm_on, capsys):
    vllm_on(None)
    assert vllm_engine.choose_engine("auto") == "hf"
    assert vllm_engine.choose_engine("auto") == "hf"
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["stepgap: local judge engine: hf (auto: vLLM is not installed here)"]


def test_auto_is_vllm_where_it_runs_on_the_judges_device(vllm_on, capsys):
    vllm_on("cuda")
    assert vllm_engine.choose_engine("auto") == "vllm"
    assert vllm_engine.choose_engine("auto", "cuda:1") == "vllm"
    assert vllm_engine.choose_engine("auto", "cpu") == "hf"  # a CUDA build does not run on CPU
    err = capsys.readouterr().err
    assert "local judge engine: vllm (auto: vLLM" in err and "on cuda)" in err
    assert "local judge engine: hf (auto: this vLLM build runs on cuda, the judge on cpu)" in err


def test_asking_for_vllm_where_it_cannot_run_names_the_extra_or_the_device(vllm_on):
    vllm_on(None)
    with pytest.raises(JudgeConfigError, match=r"install stepgap\[vllm\] \(CUDA\) or "):
        vllm_engine.choose_engine("vllm")
    vllm_on("cpu")
    with pytest.raises(JudgeConfigError, match="runs on cpu, not on the judge device cuda"):
        vllm_engine.choose_engine("vllm", "cuda")
    with pytest.raises(ValueError, match="engine must be one of auto, vllm, hf"):
        vllm_engine.choose_engine("tgi")


def test_hf_is_taken_when_asked_without_looking_for_vllm(vllm_on, monkeypatch):
    monkeypatch.setattr(vllm_engine, "vllm_device", lambda: pytest.fail("looked for vLLM"))
    assert vllm_engine.choose_engine("hf") == "hf"


@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer()


def test_byte_tokens_are_read_as_the_bytes_they_write(qwen):
    """A byte-level BPE token that is one byte of a multi-byte character writes that byte, not
    a whole replacement character: "é" is two bytes, and each of its byte tokens maps to one."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbol = bytes_to_unicode()
    vocab = token_bytes(qwen)
    for byte in "é".encode():
        token_id = qwen.convert_tokens_to_ids(symbol[byte])
        assert token_id in vocab[bytes([byte])]
    assert vocab["é".encode()] == [qwen.convert_tokens_to_ids(symbol[0xC3] + symbol[0xA9])]
    replacement = "\ufffd".encode()
    assert len(vocab.get(replacement, [])) <= 1  # only a token that is that character itself
    assert not any(i in qwen.all_special_ids for ids in vocab.values() for i in ids)


def test_a_schema_string_counts_characters_not_byte_tokens(qwen):
    """With `maxLength` 1, a string may hold one character of two bytes (two byte tokens in a
    row), which a reading of each byte token as one replacement character forbade."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbol = bytes_to_unicode()
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "maxLength": 1}},
        "required": ["s"],
        "additionalProperties": False,
    }
    index = build_index(qwen, judge_regex(schema=schema))
    state = index.get_initial_state()
    for token in ['{"', "s", '":"']:
        state = index.get_next_state(state, qwen.convert_tokens_to_ids(token))
        assert state is not None, token
    for byte in (0xC3, 0xA9):  # "é", one byte token at a time
        state = index.get_next_state(state, qwen.convert_tokens_to_ids(symbol[byte]))
        assert state is not None
    assert index.get_next_state(state, qwen.convert_tokens_to_ids("a")) is None  # a second char
    assert index.get_next_state(state, qwen.convert_tokens_to_ids('"}')) is not None


def test_a_merged_folder_is_written_once_and_never_half(tmp_path, monkeypatch):
    """`merged_folder` writes beside its target and renames, and reuses what is there."""
    from stepgap.models import merged_folder

    monkeypatch.setenv("STEPGAP_MODELS", str(tmp_path))
    calls = []

    class Saved:
        config = None
        hf_quantizer = None  # as transformers' PreTrainedModel declares it

        def save_pretrained(self, folder, **_):
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "config.json").write_text(json.dumps({"n": len(calls)}))

    class Crashing(Saved):
        def save_pretrained(self, folder, **_):
            super().save_pretrained(folder)
            raise OSError("disk full")

    def load():
        calls.append(1)
        return Saved(), Saved()

    def failing():
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        merged_folder("x:1", failing)
    with pytest.raises(OSError):
        merged_folder("x:1", lambda: (Saved(), Crashing()))
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left to be reused
    first = merged_folder("x:1", load)
    assert merged_folder("x:1", load) == first and calls == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x-1"]


def test_a_kv_cache_of_no_size_is_refused_before_any_engine_starts(vllm_on, monkeypatch):
    """From Python (a reward built in the trainer) as from the flags: vLLM would start, then
    fail naming its GPU memory share instead."""
    from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions

    monkeypatch.setattr(vllm_engine, "vllm_device", lambda: pytest.fail("looked for vLLM"))
    for size in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="kv_cache_gib must be more than 0, got"):
            HFJudge("unused", HFJudgeOptions(engine="vllm", kv_cache_gib=size))


def test_a_string_cap_on_vllm_is_warned_of(vllm_on, tiny_qwen2, monkeypatch, caplog):
    """xgrammar holds capped strings at ~7 ms a row per decode step on Qwen's vocabulary
    (bench/vllm_constraint.py): a judge asked for both says so once, at its start; the HF
    path, or vLLM without the cap, says nothing. The engine itself is not started here."""
    from stepgap.teacher.judges import hf

    vllm_on("cpu")
    started = []
    monkeypatch.setattr(hf, "VLLMEngine", lambda args: started.append(args) or object())
    hf.HFJudge(str(tiny_qwen2), hf.HFJudgeOptions(engine="vllm", max_string_chars=40))
    assert len(started) == 1
    warned = [
        r.getMessage() for r in caplog.records if "max_string_chars=40 on vLLM" in r.getMessage()
    ]
    assert len(warned) == 1 and "leave it unset on vLLM" in warned[0]
    caplog.clear()
    hf.HFJudge(str(tiny_qwen2), hf.HFJudgeOptions(engine="vllm"))
    hf.HFJudge(str(tiny_qwen2), hf.HFJudgeOptions(engine="hf", max_string_chars=40))
    assert "on vLLM" not in caplog.text


def test_vllm_loads_weights_without_a_bar_when_the_hubs_bars_are_off(vllm_on, monkeypatch):
    """`--no-progress` turns the Hub's bars off (stepgap.cli); vLLM's engine, which may load in
    a process of its own, is told so by its arguments."""
    import importlib

    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module, not the class

    vllm_on("cpu")
    monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", None)  # as read at import
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})
    kwargs = {"dtype": None, "max_model_len": None, "kv_cache_gib": None}
    assert vllm_engine.engine_args("m", **kwargs)["use_tqdm_on_load"] is True
    hub_tqdm.disable_progress_bars()
    assert vllm_engine.engine_args("m", **kwargs)["use_tqdm_on_load"] is False


@pytest.mark.slow
def test_a_gguf_model_is_written_as_the_plain_weights_it_was_loaded_as(tmp_path, monkeypatch):
    """SmolLM2's GGUF file, dequantized as transformers loads it, goes into a merged folder as
    a plain model (no quantization config, which vLLM would read as a GGUF checkpoint): the
    folder loads back with the very tensors and config the GGUF load gave."""
    import torch
    from transformers import AutoModelForCausalLM

    from stepgap.models import load_causal_lm, merged_folder
    from tests.fixtures.models import smollm2_gguf

    monkeypatch.setenv("STEPGAP_MODELS", str(tmp_path))
    tokenizer, model = load_causal_lm(str(smollm2_gguf()), "cpu")
    folder = merged_folder("gguf:1", lambda: (tokenizer, model))
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    want, got = model.state_dict(), loaded.state_dict()
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert "gguf" not in str(getattr(loaded.config, "quantization_config", "")).lower()
