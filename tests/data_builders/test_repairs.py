"""`stepgap repairs` on the example traces: a tiny policy (trained on them) writes each trace's
first gap step again from the text before it, with the repair as an instruction; an
OpenAI-compatible judge on 127.0.0.1 (any prompt gets one of the stored judge objects) and the
tiny NLI check the new steps, from a reward config file. The pairs and unpaired rows are TRL's
formats: TRL's own DPOTrainer and KTOTrainer each train a step on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE, question_text
from stepgap.schema import GAP_TYPES
from tests.fixtures.openai_server import FakeOpenAI

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 4
# a policy trained here, and the command run twice (each run loads torch and its models)
pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


@pytest.fixture(scope="module")
def example_policy(tmp_path_factory, example_traces) -> Path:
    from tests.fixtures.models import build_search_policy

    examples = [(SEARCH_R1_TEMPLATE.format(question=question_text(t.question)), t.response)
                for t in example_traces]  # fmt: skip
    return build_search_policy(tmp_path_factory.mktemp("example-policy"), examples, steps=300,
                               require_exact=False)  # fmt: skip


@pytest.fixture(scope="module")
def judge(example_answers):
    server = FakeOpenAI(answers=dict(example_answers), answer_any=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def repaired(example_policy, judge, tiny_nli, wiki_bm25, examples_dir, tmp_path_factory):
    """The command run once, then again (a rerun: nothing left to do)."""
    folder = tmp_path_factory.mktemp("repairs")
    config = folder / "reward.json"
    config.write_text(json.dumps({"judge": "openai:gpt-4.1-mini", "base_url": judge.base_url,
                                  "nli": f"hf:{tiny_nli}", "max_retries": 0,
                                  "no_cache": True}))  # fmt: skip
    cmd = [sys.executable, "-m", "stepgap.cli", "repairs", str(examples_dir / "traces.jsonl"),
           "--verdicts", str(examples_dir / "teacher_verdicts.jsonl"), "--reward-config",
           str(config), "--policy", f"hf:{example_policy}", "--retriever", str(wiki_bm25),
           "--device", "cpu", "--temperature", "1.0", "--samples", str(SAMPLES), "--topk", "2",
           "-o", str(folder / "out"), "--no-progress"]  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    asked = len(judge.events)
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    return {"first": first, "second": second, "asked": asked, "judge": judge,
            "out": folder / "out"}  # fmt: skip


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _first_gaps(example_traces, verdicts: list[dict]) -> dict[str, int]:
    """Trace id -> its first gap's step, by hand from the verdicts."""
    out = {}
    for t in example_traces:
        mine = sorted((v for v in verdicts if v["trace_id"] == t.id), key=lambda v: v["step"])
        for v in mine:
            if v["label"] is None:
                break
            if v["label"] in GAP_TYPES:
                out[t.id] = v["step"]
                break
    return out


def test_each_first_gap_is_written_again_and_checked_and_a_rerun_asks_nothing(
    repaired, example_traces, examples_dir
):
    first = repaired["first"]
    assert first.returncode == 0, first.stderr[-3000:]
    verdicts = _rows(examples_dir / "teacher_verdicts.jsonl")
    gaps = _first_gaps(example_traces, verdicts)
    records = _rows(repaired["out"] / "repairs.jsonl")
    assert {r["trace_id"]: r["step"] for r in records} == gaps and gaps
    traces = {t.id: t for t in example_traces}
    for r in records:
        t = traces[r["trace_id"]]
        start, end = t.steps[r["step"]].span
        assert r["rejected"] == t.response[start:end]
        assert r["prompt"].endswith(t.response[:start]) and "<feedback>" not in r["prompt"]
        assert [c["sample"] for c in r["candidates"]] == list(range(SAMPLES))
        assert r["checker"]["judge"]["spec"] == "openai:gpt-4.1-mini"
    checked = [c for r in records for c in r["candidates"] if c["text"] is not None]
    assert checked and all(c["label"] in ("no_gap", *GAP_TYPES) for c in checked)
    # the rerun: every trace done, the judge asked nothing more, the data files the same
    second = repaired["second"]
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"0 trace(s) repaired ({len(gaps)} already done" in second.stderr
    assert len(repaired["judge"].events) == repaired["asked"]
    assert len(_rows(repaired["out"] / "repairs.jsonl")) == len(records)


def test_the_pairs_and_unpaired_rows_are_trls_formats_with_their_provenance(
    repaired, example_traces, examples_dir
):
    records = {r["trace_id"]: r for r in _rows(repaired["out"] / "repairs.jsonl")}
    pairs = _rows(repaired["out"] / "preference.jsonl")
    expected = [(r["trace_id"], c["sample"]) for r in records.values()
                for c in r["candidates"] if c["label"] == "no_gap"]  # fmt: skip
    assert [(p["trace_id"], p["sample"]) for p in pairs] == expected and pairs
    for p in pairs:
        r = records[p["trace_id"]]
        assert (p["prompt"], p["rejected"], p["step"], p["gap_type"]) == (
            r["prompt"], r["rejected"], r["step"], r["gap_type"])  # fmt: skip
        assert p["chosen"] == r["candidates"][p["sample"]]["text"] != p["rejected"]
        assert p["checker"] == r["checker"]
    unpaired = _rows(repaired["out"] / "unpaired.jsonl")
    labelled = [v for v in _rows(examples_dir / "teacher_verdicts.jsonl") if v["label"]]
    assert sorted(
        (u["trace_id"], u["step"], u["label"], u["gap_type"]) for u in unpaired
    ) == sorted((v["trace_id"], v["step"], v["label"] == "no_gap", v["label"]) for v in labelled)
    provenance = {(v["trace_id"], v["step"]): v.get("checker") for v in labelled}
    traces = {t.id: t for t in example_traces}
    for u in unpaired:
        t = traces[u["trace_id"]]
        start, end = t.steps[u["step"]].span
        assert u["completion"] == t.response[start:end] and u["prompt"].endswith(t.response[:start])
        assert u["checker"] == provenance[(u["trace_id"], u["step"])]  # the verdict's own


def test_trls_dpo_and_kto_trainers_each_train_a_step_on_them(repaired, example_policy, tmp_path):
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    tokenizer = AutoTokenizer.from_pretrained(example_policy)
    common = {"max_steps": 1, "per_device_train_batch_size": 2, "report_to": "none",
              "use_cpu": True, "bf16": False, "save_strategy": "no", "logging_steps": 1,
              "max_length": 1024}  # fmt: skip
    out = repaired["out"]
    pairs = load_dataset("json", data_files=str(out / "preference.jsonl"), split="train")
    dpo = DPOTrainer(model=str(example_policy), processing_class=tokenizer, train_dataset=pairs,
                     args=DPOConfig(output_dir=str(tmp_path / "dpo"), **common))  # fmt: skip
    dpo.train()
    assert dpo.state.global_step == 1 and "train_loss" in dpo.state.log_history[-1]
    unpaired = load_dataset("json", data_files=str(out / "unpaired.jsonl"), split="train")
    kto = KTOTrainer(model=str(example_policy), processing_class=tokenizer,
                     train_dataset=unpaired,
                     args=KTOConfig(output_dir=str(tmp_path / "kto"), **common))  # fmt: skip
    kto.train()
    assert kto.state.global_step == 1 and "train_loss" in kto.state.log_history[-1]
