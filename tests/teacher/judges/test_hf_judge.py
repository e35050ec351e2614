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
def test_fast_decoder_answers_equal_plain_generate(tiny_qwen2, requests_, monkeypatch):
    """The project's decoder (one batch, finished rows dropped, schema-forced tokens appended
    without a pass of their own, over a cache that writes each step in place) gives the tokens
    of plain `generate()` at batch 1, and so the same judge objects, with the same confidences
    up to float rounding."""
    from stepgap.teacher.judges import kv_cache

    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(max_string_chars=6, max_tokens=300))
    prompts = [judge.prompt_ids(r) for r in requests_[:3]]
    judge.decoding = "generate"
    plain = [judge.generate_ids([p])[0] for p in prompts]
    judge.decoding = "loop"
    caches = []
    real = kv_cache.growing_cache
    monkeypatch.setattr(
        kv_cache, "growing_cache", lambda *a, **k: caches.append(real(*a, **k)) or caches[-1]
    )
    fast = judge.generate_ids(prompts)
    assert len(caches) == 1 and {layer.room for layer in caches[0].layers} == {300}
    assert caches[0].layers[0].length > max(len(p) for p in prompts)  # it held the answers
    assert [d.tokens for d in fast] == [d.tokens for d in plain]
    assert all(d.forward_passes < len(d.tokens) for d in fast)  # forced tokens rode along
    assert all(d.forward_passes == len(d.tokens) for d in plain)
    # its timings: one batch, its forwards (the row decoded longest took part in each), the
    # padded prompt it computed, and a decode that the model call, the waits and the loop's
    # own work add up to
    stats = judge.decode_stats
    assert (stats.batches, stats.rows) == (1, 3)
    assert stats.forwards == max(d.forward_passes for d in fast) - 1 > 0
    assert stats.prompt_tokens == 3 * max(len(p) for p in prompts)
    assert stats.prefill_s > 0 and stats.model_s > 0 and stats.host_s > 0 and stats.wait_s >= 0
    summary = stats.summary()
    assert summary["forward_ms"] == pytest.approx(
        summary["forward_model_ms"] + summary["forward_wait_ms"] + summary["forward_host_ms"],
        abs=0.03,
    )
    judge.generate_ids(prompts[:1])  # a second batch adds to the same figures
    assert (judge.decode_stats.batches, judge.decode_stats.rows) == (2, 4)
    for f, p, n in zip(fast, plain, prompts, strict=True):
        rf, rp = judge._result(f, len(n), None), judge._result(p, len(n), None)
        assert rf.judge is not None and rf.judge == rp.judge and rf.usage == rp.usage
        assert rf.confidences == pytest.approx(rp.confidences, rel=1e-4)


def test_a_decode_forward_computes_each_rows_last_logits_only(tiny_qwen2, requests_, monkeypatch):
    """A decode forward carries each row's chosen token and the schema-forced tokens after it,
    so its rows differ in length: they are left-padded, every row ends at the forward's last
    position, and the model computes the logits of that position alone, not a vocabulary's
    worth per forced token (Qwen2.5's 152K a token, which the loop then had to gather from)."""
    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(max_string_chars=6, max_tokens=120))
    prompts = [judge.prompt_ids(r) for r in requests_[:3]]
    forwards = []
    real = judge.model.forward

    def spy(**kwargs):
        out = real(**kwargs)
        width = kwargs["input_ids"].shape[1]
        forwards.append((width, kwargs["attention_mask"][:, -width:], out.logits.shape[1]))
        return out

    monkeypatch.setattr(judge.model, "forward", spy)
    answers = judge.generate_ids(prompts)
    decode = [f for f in forwards if f[0] < min(len(p) for p in prompts)]  # not a prefill
    assert len(decode) == judge.decode_stats.forwards > 0
    # forced tokens rode along, in rows of unequal lengths in one forward
    assert any(width > 1 and (mask.sum(1) < width).any() for width, mask, _ in decode)
    for _, mask, kept in decode:
        assert kept == 1
        assert mask[:, -1].all()  # each row's last token is the last position
        assert (mask.diff(dim=1) >= 0).all()  # padding before the tokens, never after
    judge.decoding = "generate"
    assert [d.tokens for d in answers] == [judge.generate_ids([p])[0].tokens for p in prompts]


def test_padded_batches_on_a_cpu_attend_with_grouped_heads_and_answer_the_same(
    tiny_qwen2, requests_, monkeypatch
):
    """On a CPU the judge's left-padded batches attend with grouped heads (decode steps' query
    heads folded onto their key-value head, prompts on SDPA's `enable_gqa`), not transformers'
    copy of each key and value head out to every query head: the same tokens and
    log-probabilities as transformers' own SDPA, without a single copy."""
    import transformers.integrations.sdpa_attention as sdpa

    from stepgap.teacher.judges.decoding import GROUPED_SDPA

    judge = HFJudge(str(tiny_qwen2), HFJudgeOptions(max_string_chars=6, max_tokens=40))
    assert judge.model.config._attn_implementation == GROUPED_SDPA
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


@pytest.mark.slow
def test_static_cache_decoding_pads_batches_to_few_shapes_and_answers_as_the_loop(
    tiny_qwen2, requests_, monkeypatch
):
    """`decoding="static"` (`generate` on a static cache, compiled on a GPU once per shape) pads
    a batch to a power of two rows, at most the call's batch size, and its prompts to a
    multiple of 256 tokens; the padding rows' answers are dropped, and the answers are the
    loop's."""
    from stepgap.teacher.judges.decoding import STATIC_WIDTH, Decoded, GreedyDecoder

    judge = HFJudge(
        str(tiny_qwen2), HFJudgeOptions(max_string_chars=6, max_tokens=300, judge_batch_size=4)
    )
    loop = judge.judge(requests_[:3])
    shapes = []
    plain = GreedyDecoder._decode_plain

    def spy(self, prompts, masks, width=None, stop=None, **settings):
        shapes.append((len(prompts), width, settings))
        return plain(self, prompts, masks, width, stop, **settings)

    monkeypatch.setattr(GreedyDecoder, "_decode_plain", spy)
    judge.decoding = "static"
    static = judge.judge(requests_[:3])
    assert [r.judge for r in static] == [r.judge for r in loop]
    assert all(r.judge is not None for r in static)
    assert [r.usage for r in static] == [r.usage for r in loop]
    longest = max(len(judge.prompt_ids(r)) for r in requests_[:3])
    width = -(-longest // STATIC_WIDTH) * STATIC_WIDTH
    # three prompts and a copy of the last (its answer dropped)
    assert shapes == [(4, width, {"cache_implementation": "static"})]
    assert judge.model.generation_config.cache_implementation is None  # left as it was
    shapes.clear()  # rows: a power of two, at most the call's batch size
    monkeypatch.setattr(
        GreedyDecoder, "_decode_plain", lambda self, p, m, width=None, **s: (
            shapes.append(len(p)) or [Decoded([], []) for _ in p]
        ),
    )  # fmt: skip
    for n, rows in ((3, 3), (3, 8), (5, 64), (1, 64), (64, 64), (2, None)):
        decoder = GreedyDecoder(judge.model, judge.tokenizer, 8, decoding="static", rows=rows)
        assert len(decoder.generate([[1, 2]] * n, [None] * n)) == n
    assert shapes == [3, 4, 8, 1, 64, 2]
    with pytest.raises(ValueError, match="decoding must be one of loop, generate, static"):
        HFJudge(str(tiny_qwen2), decoding="fast")


def test_the_package_decoders_on_cuda_decode_without_cudnn_attention_and_generate_keeps_it(
    monkeypatch,
):
    """On a CUDA device the package's decode loop and its static-cache `generate` run with
    SDPA's cuDNN kernel off (its host time per call set an H100's decode step), and put it back
    after; plain `generate`, the reference, keeps torch's own choice; on a CPU nothing
    changes."""
    from types import SimpleNamespace

    import torch

    from stepgap.teacher.judges.decoding import GreedyDecoder, without_cudnn_attention

    enabled = torch.backends.cuda.cudnn_sdp_enabled
    seen: dict[str, bool] = {}
    monkeypatch.setattr(
        GreedyDecoder, "_decode_loop", lambda self, p, m, *a: [seen.setdefault("loop", enabled())]
    )
    monkeypatch.setattr(
        GreedyDecoder,
        "_decode_static",
        lambda self, p, m, *a: [seen.setdefault("static", enabled())],
    )
    monkeypatch.setattr(
        GreedyDecoder,
        "_decode_plain",
        lambda self, p, m, **k: [seen.setdefault("plain", enabled())],
    )
    assert enabled()
    cuda = SimpleNamespace(device=torch.device("cuda", 0))
    for decoding in ("loop", "static", "generate"):
        GreedyDecoder(cuda, None, 8, decoding=decoding).generate([[1]], [None])
    assert seen == {"loop": False, "static": False, "plain": True}
    assert enabled() and torch.backends.cuda.flash_sdp_enabled()  # put back after the loop
    with without_cudnn_attention(torch.device("cpu")):
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


def test_token_masks_hold_each_states_allowed_tokens_and_its_forced_one():
    """A state's mask is exactly its allowed tokens (vocabulary ids past the model's rows left
    out), and `forced` names the one token of a state that allows one, as the fast decoder's
    forced runs need."""
    import torch

    from stepgap.teacher.judges.constrained import TokenMasks, build_index
    from tests.fixtures.models import qwen_tokenizer

    tokenizer = qwen_tokenizer()
    index = build_index(tokenizer, r"quartz(yes|no)")
    masks = TokenMasks(index, len(tokenizer), tokenizer.eos_token_id, torch.device("cpu"))
    state = masks.initial()
    allowed = set(index.get_allowed_tokens(state))
    assert len(allowed) > 1 and masks.forced(state) is None
    assert set(masks.mask(state).nonzero().view(-1).tolist()) == allowed
    for piece in tokenizer.tokenize("quartz"):  # through the word to the choice
        state = masks.advance(state, tokenizer.convert_tokens_to_ids(piece))
    assert masks.forced(state) is None  # "yes" or "no"
    state = masks.advance(state, tokenizer.convert_tokens_to_ids("yes"))
    assert masks.forced(state) == tokenizer.eos_token_id  # the answer is complete
    assert masks.mask(state).nonzero().view(-1).tolist() == [tokenizer.eos_token_id]
    narrow = TokenMasks(index, 100, tokenizer.eos_token_id, torch.device("cpu"))
    assert narrow.mask(narrow.initial()).shape == (100,)  # ids past the model's rows: out

    class Counting:  # each state's token list (147k ids for a string state) is fetched once
        def __init__(self) -> None:
            self.fetched: list[int] = []

        def __getattr__(self, name):
            return getattr(index, name)

        def get_allowed_tokens(self, s):
            self.fetched.append(s)
            return index.get_allowed_tokens(s)

    counting = Counting()
    masks = TokenMasks(counting, len(tokenizer), tokenizer.eos_token_id, torch.device("cpu"))
    first = masks.initial()
    for _ in range(2):
        masks.forced(first), masks.mask(first), masks.mask(state), masks.forced(state)
    assert counting.fetched == [first, state]


def test_a_local_judge_reports_each_answer_as_its_row_finishes_and_stops_mid_batch(
    tiny_qwen2, requests_, monkeypatch
):
    """A command's progress on a slow local judge moves as each row of a batch finishes, not
    once the whole batch is done (a CPU batch of 8 answers took 27 minutes); and a stopped
    call (an error elsewhere, Ctrl-C on a server) ends between two decode steps, not after
    the batch."""
    import threading

    from stepgap.teacher.judges.base import JudgeStopped
    from stepgap.teacher.judges.decoding import GreedyDecoder

    judge = HFJudge(
        str(tiny_qwen2), HFJudgeOptions(max_string_chars=12, max_tokens=300, judge_batch_size=6)
    )
    choose, steps = GreedyDecoder._choose, []

    def counted(self, *args):
        steps.append(1)
        return choose(self, *args)

    monkeypatch.setattr(GreedyDecoder, "_choose", counted)
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

    monkeypatch.setattr(GreedyDecoder, "_choose", stopping)
    with pytest.raises(JudgeStopped):
        judge.judge(requests_, stop=stop)
    assert len(steps) == 4  # the step under way ended, no other began
