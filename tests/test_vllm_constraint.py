"""bench/vllm_constraint.py --mask-walk: where xgrammar's and llguidance's token masks for the
judge's regex part, on Qwen's vocabulary. Needs both (they come with vLLM: `make test-peers`
runs this file in `.venv-vllm`); skipped where they are not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")

from tests.fixtures.bench import bench_script  # noqa: E402
from tests.fixtures.models import qwen_tokenizer  # noqa: E402


def test_llguidance_allows_only_the_canonical_split_of_fixed_text_and_no_special_tokens():
    """What makes its answers differ from xgrammar's: the JSON's fixed text (keys, punctuation)
    only as the tokenizer splits it, and no special token inside a string, where xgrammar
    allows any tokens that spell it and special tokens too. Never a token xgrammar refuses."""
    from stepgap.teacher.judges.constrained import judge_regex

    tokenizer = qwen_tokenizer()
    walk = bench_script("vllm_constraint").mask_walk(tokenizer, judge_regex(None), 120)
    fixed, free = walk["fixed text"], walk["free text"]
    assert fixed["steps"] and free["steps"]
    assert fixed["differ"] > 0 and not fixed["only_llguidance"] and not free["only_llguidance"]
    assert "<|im_start|>" in free["only_xgrammar"]
    assert all(p.startswith("<") for p in free["only_xgrammar"])  # special tokens only
