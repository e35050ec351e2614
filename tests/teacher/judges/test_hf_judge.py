"""The `hf:` judge: schema-constrained decoding with the tiny Qwen2, SmolLM2 end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.schema import Judge
from stepgap.teacher.judges import build_judge
from stepgap.teacher.judges.constrained import judge_regex
from stepgap.teacher.judges.decoding import auto_batch_size
from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions
from stepgap.teacher.prompt import build_requests
from tests.fixtures.models import smollm2_gguf

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def requests_(example_traces):
    return [r for t in example_traces[:2] for r in build_requests(t.id, t.question, t.steps)]


def test_constrained_decoding_gives_schema_valid_judges_from_random_weights(
    tiny_qwen2, requests_, tmp_path
):
    judge = build_judge(
        f"hf:{tiny_qwen2}",
        max_string_chars=12,
        max_tokens=300,
        judge_batch_size=4,
        cache=str(tmp_path / "c.sqlite"),
    )
    results = judge.judge(requests_)
    assert len(results) == len(requests_) == 6
    for r in results:
        assert r.error is None and isinstance(r.judge, Judge)
        assert len(r.judge.step_1_quote_search.evidence_quote) <= 12
        assert set(r.confidences) == {"A", "B", "C"}
        assert all(0 < p <= 1 for p in r.confidences.values())
        assert r.usage["completion_tokens"] > 0
    assert judge.meter.calls == 6 and judge.meter.completion_tokens > 0
    # Same prompts again: answered from the cache, identical objects, no generation.
    again = judge.judge(requests_)
    assert [r.judge for r in again] == [r.judge for r in results]
    assert judge.meter.cache_hits == 6 and judge.meter.calls == 6


@pytest.mark.slow
def test_a_padded_batch_answers_as_each_request_alone(tiny_qwen2, requests_):
    """One `generate` of a left-padded batch, each row held to the schema by its own guide,
    gives each request the tokens it gets alone, and so the same judge objects, with the same
    confidences up to float rounding."""
    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(max_string_chars=6, max_tokens=300))
    prompts = [judge.prompt_ids(r) for r in requests_[:3]]
    assert len({len(p) for p in prompts}) > 1  # rows of other lengths: padded
    alone = [judge.generate_ids([p])[0] for p in prompts]
    told: dict[int, object] = {}
    batch = judge.generate_ids(prompts, on_row=lambda r, d: told.setdefault(r, d))
    assert [told[r] for r in range(len(batch))] == batch  # told as each row ended: the same
    assert [d.tokens for d in batch] == [d.tokens for d in alone]
    for f, p, n in zip(batch, alone, prompts, strict=True):
        rf, rp = judge.answer_result(f, len(n), None), judge.answer_result(p, len(n), None)
        assert rf.judge is not None and rf.judge == rp.judge and rf.usage == rp.usage
        assert rf.confidences == pytest.approx(rp.confidences, rel=1e-4)


def test_padded_batches_on_a_cpu_attend_with_grouped_heads_and_answer_the_same(
    tiny_qwen2, requests_, monkeypatch
):
    """On a CPU the judge's left-padded batches attend with grouped heads (decode steps' query
    heads folded onto their key-value head, prompts on SDPA's `enable_gqa`), not transformers'
    copy of each key and value head out to every query head: the same tokens and
    log-probabilities as transformers' own SDPA, without a single copy."""
    import transformers.integrations.sdpa_attention as sdpa

    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(max_string_chars=6, max_tokens=40))
    prompts = [judge.prompt_ids(r) for r in requests_[:3]]
    assert len({len(p) for p in prompts}) > 1  # rows of other lengths: padded
    copies: list[int] = []
    real = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda h, n: copies.append(n) or real(h, n))
    grouped = judge.generate_ids(prompts)
    assert copies == []
    judge.model.set_attn_implementation("sdpa")
    copied = judge.generate_ids(prompts)
    assert copies and set(copies) == {2}  # the tiny Qwen2: 4 query heads, 2 key-value heads
    assert [d.tokens for d in grouped] == [d.tokens for d in copied]
    for g, c in zip(grouped, copied, strict=True):
        assert g.logprobs == pytest.approx(c.logprobs, rel=1e-5, abs=1e-6)


def test_the_hf_path_on_cuda_decodes_without_cudnn_attention(tiny_qwen2, requests_, monkeypatch):
    """On a CUDA device the judge's `generate` runs with SDPA's cuDNN kernel off (its host time
    per call set an H100's decode step), and puts it back after; on a CPU nothing changes."""
    import torch

    from stepgap.teacher.judges import decoding

    entered: list[str] = []
    real = decoding.without_cudnn_attention
    monkeypatch.setattr(
        decoding, "without_cudnn_attention", lambda d: entered.append(str(d)) or real(d)
    )
    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(max_string_chars=6, max_tokens=20))
    judge.generate_ids([judge.prompt_ids(requests_[0])])
    assert entered == ["cpu"]
    enabled = torch.backends.cuda.cudnn_sdp_enabled
    assert enabled()
    with real(torch.device("cuda", 0)):
        assert not enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert enabled()  # put back after
    with real(torch.device("cpu")):
        assert enabled()


def test_batch_by_memory_shrinks_with_longer_rows(tiny_qwen2):
    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(unconstrained=True))
    short, long = auto_batch_size(judge.model, 100), auto_batch_size(judge.model, 10**8)
    assert 1 <= long < short <= 64
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        HFJudge(str(tiny_qwen2), HFJudgeOptions(judge_batch_size=0))


def test_batch_by_memory_takes_more_rows_on_a_gpu(tiny_qwen2, monkeypatch):
    """With memory to spare, a batch takes at most 64 rows on a CPU (a forward's time grows
    with its rows there) and 256 on a GPU (it barely does), from a quarter of the device's free
    memory there."""
    import torch

    from stepgap.teacher.judges import decoding

    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(unconstrained=True))
    assert auto_batch_size(judge.model, 100) == decoding.CPU_ROWS == 64
    assert auto_batch_size(judge.model, 100, cap=300) == 300  # the machine's memory allows it
    free: list[int] = [10**12]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free[0], 2 * free[0]))
    pool = {"reserved": 0, "allocated": 0}  # torch's cache of freed blocks counts as free
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: pool["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: pool["allocated"])
    monkeypatch.setattr(type(judge.model), "device", property(lambda m: torch.device("cuda")))
    assert auto_batch_size(judge.model, 100) == decoding.GPU_ROWS == 256
    # the tiny Qwen2 in fp32 keeps 1,024 bytes a token: K and V, 16 dims, 4 bytes each, for
    # 2 layers x 2 key-value heads and one layer's copy to its 4 query heads
    free[0] = 4 * 1024 * 100 * 100  # a quarter of it holds 100 rows of 100 tokens
    assert auto_batch_size(judge.model, 100) == 100
    pool.update(reserved=4 * 1024 * 100 * 50 + 7, allocated=7)  # 50 rows' worth, cached
    assert auto_batch_size(judge.model, 100) == 150


def test_unconstrained_random_model_failures_are_reported_not_guessed(tiny_qwen2, requests_):
    judge = build_judge(f"hf:{tiny_qwen2}", unconstrained=True, max_tokens=16, no_cache=True)
    results = judge.judge(requests_[:3])
    assert all(r.judge is None for r in results)
    assert all("truncated" in r.error or "not JSON" in r.error for r in results)
    assert judge.meter.failures == 3


def test_regex_caps_free_text_only():
    import re

    capped = judge_regex(max_string_chars=5)
    assert "{0,5}" in capped and re.search(r"entity_drift", capped)


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        build_judge(f"hf:{tmp_path / 'nope'}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_smollm2_gguf_labels_the_examples_end_to_end(tmp_path, examples_dir, tiny_nli):
    """A real 135M chat model through `stepgap label`, on two example traces (4 steps: one
    generation batch; all 28 take four and about 7 minutes on two cores)."""
    gguf = smollm2_gguf()
    assert gguf.is_file()
    keep = {"case1-whitehorse", "case3-peter-paul-fortress"}
    lines = (examples_dir / "traces.jsonl").read_text(encoding="utf-8").splitlines()
    traces = tmp_path / "traces.jsonl"
    traces.write_text("".join(x + "\n" for x in lines if json.loads(x)["id"] in keep))
    out = tmp_path / "verdicts.jsonl"
    cmd = [
        sys.executable, "-m", "stepgap.cli", "label", str(traces),
        "-o", str(out), "--judge", f"hf:{gguf}", "--nli", str(tiny_nli),
        "--max-string-chars", "40", "--max-tokens", "320", "--judge-batch-size", "8",
        "--batch-size", "32", "--cache", str(tmp_path / "c.sqlite"), "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    # loading the GGUF file says nothing for a user: no dequantisation bar, no "legacy" note
    assert "de-quantizing" not in done.stderr and "legacy" not in done.stderr, done.stderr
    verdicts = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(verdicts) == 4 and {v["trace_id"] for v in verdicts} == keep
    for v in verdicts:  # every step: a schema-valid judge object and a label, or a stated error
        assert (v["judge"] is not None and v["label"] is not None) or v["error"]
    assert sum(v["label"] is not None for v in verdicts) >= 3


def test_the_guide_constraint_allows_each_states_tokens_and_then_eos_only():
    """Each row's logits keep exactly the tokens its outlines-core index allows in the row's
    state (ids past the logits' width left out), a free row keeps all of them, and a row that
    completed its answer may only end it."""
    import torch

    from stepgap.teacher.judges.constrained import GuideConstraint, build_index
    from tests.fixtures.models import qwen_tokenizer

    tokenizer = qwen_tokenizer()
    eos, vocab = tokenizer.eos_token_id, len(tokenizer)
    index = build_index(tokenizer, r"quartz(yes|no)")
    constraint = GuideConstraint([index, None], eos, vocab)
    allowed = lambda scores, row: set((scores[row] > float("-inf")).nonzero().view(-1).tolist())  # noqa: E731
    scores = constraint(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, vocab))
    assert allowed(scores, 0) == set(index.get_allowed_tokens(index.get_initial_state()))
    assert allowed(scores, 1) == set(range(vocab))
    state, ids = index.get_initial_state(), torch.zeros(2, 1, dtype=torch.long)
    for piece in [*tokenizer.tokenize("quartz"), "yes"]:
        token = tokenizer.convert_tokens_to_ids(piece)
        state = index.get_next_state(state, token)
        ids = torch.cat([ids, torch.tensor([[token], [token]])], dim=1)
        scores = constraint(ids, torch.zeros(2, vocab))
        assert allowed(scores, 0) == set(index.get_allowed_tokens(state))
    assert allowed(scores, 0) == {eos}  # the answer is complete
    narrow = GuideConstraint([index], eos, vocab)(
        torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 100)
    )
    assert narrow.shape == (1, 100)  # logits narrower than the vocabulary: masked as they are


def test_a_local_judge_reports_each_answer_as_its_row_finishes_and_stops_mid_batch(
    tiny_qwen2, requests_, monkeypatch
):
    """A command's progress on a slow local judge moves as each row of a batch finishes, not
    once the whole batch is done (a CPU batch of 8 answers took 27 minutes); and a stopped
    call (an error elsewhere, Ctrl-C on a server) ends between two decode steps, not after
    the batch."""
    import threading

    from stepgap.teacher.judges.base import JudgeStopped
    from stepgap.teacher.judges.constrained import GuideConstraint

    judge = HFJudge(
        str(tiny_qwen2), HFJudgeOptions(max_string_chars=12, max_tokens=300, judge_batch_size=6)
    )
    choose, steps = GuideConstraint.__call__, []

    def counted(self, *args):
        steps.append(1)
        return choose(self, *args)

    monkeypatch.setattr(GuideConstraint, "__call__", counted)
    judge.cache = None  # every answer decoded here
    reported_at: list[int] = []
    judge.on_result = lambda request, result: reported_at.append(len(steps))
    results = judge.judge(requests_)
    assert all(r.judge is not None for r in results) and len(reported_at) == 6
    assert reported_at[0] < len(steps), reported_at  # the first answer came before the last
    assert len(set(reported_at)) > 1, reported_at

    stop, steps[:] = threading.Event(), []

    def stopping(self, *args):
        if len(steps) == 3:
            stop.set()  # as another thread would, mid-batch
        return counted(self, *args)

    monkeypatch.setattr(GuideConstraint, "__call__", stopping)
    with pytest.raises(JudgeStopped):
        judge.judge(requests_, stop=stop)
    assert len(steps) == 4  # the step under way ended, no other began
