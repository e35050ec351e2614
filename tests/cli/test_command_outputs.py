"""Every command's output on the shipped examples, against what the examples' hand labels and
the contract say it must be.

Each case runs one `stepgap` command in process on `examples/`; later cases read what earlier
ones wrote. The expectations come from outside the code under test: the hand labels
(`gold_steps.jsonl`, `gold_traces.jsonl`), the contract's reward arithmetic, and scikit-learn's
metrics on the same labels; the bootstrap's intervals, which depend on its resampling, are
checked for what any interval must hold (inside [0, 1], around its estimate). A failure names
the case and the figure that is wrong.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from stepgap.cli import main

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples"

REPLAY = [f"--judge=replay:{EX / 'judge_replay.jsonl'}", f"--nli=replay:{EX / 'nli_replay.jsonl'}"]
GOLD = [f"--gold={EX / 'gold_steps.jsonl'}", f"--gold={EX / 'gold_traces.jsonl'}"]

# name -> (argv with {out} for the case's folder, files the command writes under {out}).
# Cases run in this order; later ones read what earlier ones wrote.
CASES: dict[str, tuple[list[str], list[str]]] = {
    "segment": (["segment", str(EX / "traces.jsonl"), "-o", "{out}/segmented.jsonl"],
                ["segmented.jsonl"]),
    "check": (["check", "{out}/segmented.jsonl", *REPLAY, "-o", "{out}/verdicts.jsonl"],
              ["verdicts.jsonl"]),
    "label": (["label", str(EX / "traces.jsonl"), *REPLAY, "--no-progress", "--batch-size=3",
               "-o", "{out}/labelled.jsonl", "--summary", "{out}/label_summary.json"],
              ["labelled.jsonl", "label_summary.json"]),
    "relabel-A": (["relabel", "{out}/verdicts.jsonl", "--ablate", "A", "-o", "{out}/minus_A.jsonl"],
                  ["minus_A.jsonl"]),
    "relabel-E": (["relabel", "{out}/verdicts.jsonl", "--ablate=E", "-o", "{out}/minus_E.jsonl"],
                  ["minus_E.jsonl"]),
    "relabel-threshold": (["relabel", "{out}/verdicts.jsonl", "--entail-threshold=0.9",
                           "--contradict-threshold=0.3", "-o", "{out}/strict.jsonl"],
                          ["strict.jsonl"]),
    "baseline-flag": (["baseline", "flag-everything", str(EX / "traces.jsonl"),
                       "-o", "{out}/flag.jsonl"], ["flag.jsonl"]),
    "eval": (["eval", *GOLD, "--pred=StepGap={out}/verdicts.jsonl",
              "--pred=minus-E={out}/minus_E.jsonl", "--pred=flag={out}/flag.jsonl",
              "--silver=StepGap", "--resamples=200", "--no-plots", "-o", "{out}/report"],
             ["report/report.json", "report/report.md"]),
    "eval-trace-unit": (["eval", *GOLD, "--pred=StepGap={out}/verdicts.jsonl", "--unit=trace",
                         "--seed=3", "--resamples=100", "--no-plots", "-o", "{out}/report_t"],
                        ["report_t/report.json", "report_t/report.md"]),
    "sft-data": (["sft-data", "{out}/verdicts.jsonl", "--eval-fraction=0.3", "-o", "{out}/sft"],
                 ["sft/", "sft/stepgap_sft.json"]),
    "reward": (["reward", str(EX / "traces.jsonl"), "--verdicts", "{out}/verdicts.jsonl",
                "-o", "{out}/rewards.jsonl"], ["rewards.jsonl"]),
    "reward-variant": (["reward", str(EX / "traces.jsonl"), "--verdicts", "{out}/verdicts.jsonl",
                        "--variant=untyped_dense", "--lam=0.5", "-o", "{out}/rewards_u.jsonl"],
                       ["rewards_u.jsonl"]),
}  # fmt: skip


def _normalise(text: str, out: Path) -> str:
    text = re.sub(r"(?m)^.*\r.*\n?", "", text)  # progress bars (they carry timings)
    return text.replace(str(out), "$OUT").replace(str(REPO), "$REPO")


def run_case(name: str, out: Path) -> dict[str, object]:
    """Run one case into `out`; return its exit code and what it printed."""
    argv, _ = CASES[name]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main([a.replace("{out}", str(out)) for a in argv])
    return {
        "rc": rc,
        "stdout": _normalise(stdout.getvalue(), out),
        "stderr": _normalise(stderr.getvalue(), out),
    }


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("commands")


@pytest.fixture(scope="module")
def records(outputs) -> dict[str, dict[str, object]]:
    return {name: run_case(name, outputs) for name in CASES}


# What each case's output must say, checked against what the examples' hand labels and the
# contract say rather than against a digest the same code made: a regenerated snapshot cannot
# hide a wrong output from these.
def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def _content_checks(out: Path, printed: dict[str, str]) -> dict[str, object]:
    hand = {(g["trace_id"], g["step"]): g["label"] for g in _jsonl(EX / "gold_steps.jsonl")}
    correct = {g["trace_id"]: g["correct"] for g in _jsonl(EX / "gold_traces.jsonl")}

    def segment() -> None:
        traces = _jsonl(out / "segmented.jsonl")
        assert len(traces) == 10 and sum(len(t["steps"]) for t in traces) == len(hand)
        assert {(t["id"], s["index"]) for t in traces for s in t["steps"]} == set(hand)
        assert "wrote 10 segmented traces" in printed["segment"]

    def check() -> None:
        vs = _jsonl(out / "verdicts.jsonl")
        agree = sum(hand[(v["trace_id"], v["step"])] == v["label"] for v in vs)
        assert len(vs) == len(hand) and agree == len(hand) - 2  # the two teacher errors
        assert all(v["tree"]["hypothesis"] == "answer_statement" for v in vs)
        counts = {lab: sum(v["label"] == lab for v in vs) for lab in ("no_gap", "CC", "IE", "MB")}
        summary = ", ".join(f"{lab} {n}" for lab, n in counts.items())
        assert f"{len(hand)} verdicts: {summary}; 0 failed" in printed["check"]

    def label() -> None:
        labelled = {(v["trace_id"], v["step"]): v["label"] for v in _jsonl(out / "labelled.jsonl")}
        checked = {(v["trace_id"], v["step"]): v["label"] for v in _jsonl(out / "verdicts.jsonl")}
        assert labelled == checked
        summary = json.loads((out / "label_summary.json").read_text())
        assert (summary["verdicts"], summary["traces"], summary["errors"]) == (len(hand), 10, 0)

    def relabel(name: str, stage: str | None) -> None:
        vs = _jsonl(out / name)
        assert len(vs) == len(hand)
        if stage:
            assert not any(p.startswith(stage) for v in vs for p in v["path"])
        before = {(v["trace_id"], v["step"]): v for v in _jsonl(out / "verdicts.jsonl")}
        for v in vs:  # a step whose path never passed the ablated stage keeps its label
            old = before[(v["trace_id"], v["step"])]
            if stage and not any(p.startswith(stage) for p in old["path"]):
                assert v["label"] == old["label"], v

    def threshold() -> None:
        before = {(v["trace_id"], v["step"]): v for v in _jsonl(out / "verdicts.jsonl")}
        for v in _jsonl(out / "strict.jsonl"):
            assert (v["tree"]["entail_threshold"], v["tree"]["contradict_threshold"]) == (0.9, 0.3)
            old = before[(v["trace_id"], v["step"])]
            if v["label"] != old["label"]:  # only the NLI stages decide differently
                assert v["path"][-1].startswith(("stageD", "stageE")), v

    def flag() -> None:
        assert {v["label"] for v in _jsonl(out / "flag.jsonl")} <= {"CC", "IE", "MB"}

    def evaluate(folder: str, unit: str) -> None:
        from sklearn import metrics

        report = json.loads((out / folder / "report.json").read_text())
        assert report["n_steps"] == len(hand) and report["bootstrap"]["unit"] == unit
        if "flag" in report["checkers"]:
            assert report["checkers"]["flag"]["sR"] == 1.0  # flagging all finds every gap
        # the step metrics of the contract (section 5) are scikit-learn's on gap / no gap
        vs = _jsonl(out / "verdicts.jsonl")
        gold = [hand[(v["trace_id"], v["step"])] != "no_gap" for v in vs]
        pred = [v["label"] != "no_gap" for v in vs]
        expected = {
            "sP": metrics.precision_score(gold, pred),
            "sR": metrics.recall_score(gold, pred),
            "sF1": metrics.f1_score(gold, pred),
            "BA": metrics.balanced_accuracy_score(gold, pred),
            "kappa": metrics.cohen_kappa_score(gold, pred),
            "typed_accuracy": metrics.accuracy_score(
                [hand[(v["trace_id"], v["step"])] for v in vs], [v["label"] for v in vs]
            ),
        }
        stepgap = report["checkers"]["StepGap"]
        for name, value in expected.items():
            assert stepgap[name] == pytest.approx(value, abs=1e-12), name
        for name, (low, high) in stepgap["ci"].items():  # a bootstrap interval, any seed
            assert 0.0 <= low <= stepgap[name] <= high <= 1.0, (name, low, high)

    def sft() -> None:
        meta = json.loads((out / "sft" / "stepgap_sft.json").read_text())
        assert (meta["stats"]["examples"], meta["stats"]["traces"]) == (len(hand), 10)

    def reward(name: str, variant: str, lam: float) -> None:
        rows = _jsonl(out / name)
        assert [r["em"] for r in rows] == [float(correct[r["trace_id"]]) for r in rows]
        assert {(r["variant"], r["lam"]) for r in rows} == {(variant, lam)}
        if variant == "untyped_dense":  # +0.20 no_gap, -0.10 any gap, no shaping
            for r in rows:
                dense = sum(0.20 if s["label"] == "no_gap" else -0.10 for s in r["steps"])
                assert r["reward"] == pytest.approx(r["em"] + lam * dense)

    return {
        "segment": segment,
        "check": check,
        "label": label,
        "relabel-A": lambda: relabel("minus_A.jsonl", "stageA"),
        "relabel-E": lambda: relabel("minus_E.jsonl", "stageE"),
        "relabel-threshold": threshold,
        "baseline-flag": flag,
        "eval": lambda: evaluate("report", "step"),
        "eval-trace-unit": lambda: evaluate("report_t", "trace"),
        "sft-data": sft,
        "reward": lambda: reward("rewards.jsonl", "typed_shape", 1.0),
        "reward-variant": lambda: reward("rewards_u.jsonl", "untyped_dense", 0.5),
    }


@pytest.mark.parametrize("name", list(CASES))
def test_command_output_says_what_the_hand_labels_and_the_contract_say(records, outputs, name):
    assert records[name]["rc"] == 0, records[name]["stderr"]
    printed = {case: str(r["stdout"]) + str(r["stderr"]) for case, r in records.items()}
    _content_checks(outputs, printed)[name]()
