"""Every command's output on the shipped examples, compared with a stored snapshot.

Each case runs one `stepgap` command in process on `examples/` and records what it wrote: the
sha256 of each output file (after replacing the run's temp folder by `$OUT` and the repo by
`$REPO`, so paths in outputs do not matter) and its stdout and stderr. The snapshot
(`tests/cli/golden/command_outputs.json`) was taken before the commands moved into their own
modules; a change of output shows here as the case and the file that changed. When an output
changes on purpose, regenerate the snapshot and say why in the commit:

    python -m tests.cli.test_command_outputs --regenerate
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import sys
from pathlib import Path

import pytest

from stepgap.cli import main

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples"
GOLDEN = Path(__file__).with_name("golden") / "command_outputs.json"

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
    """Run one case into `out`; return its record (exit code, file hashes, stdout, stderr)."""
    argv, files = CASES[name]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main([a.replace("{out}", str(out)) for a in argv])
    hashes = {}
    for rel in files:
        if rel.endswith("/"):  # a `datasets` folder: its rows, split by split
            from datasets import load_from_disk

            data = json.dumps({k: v.to_list() for k, v in load_from_disk(out / rel).items()})
        else:
            data = (out / rel).read_text(encoding="utf-8")
        data = _normalise(data, out)
        hashes[rel] = hashlib.sha256(data.encode("utf-8")).hexdigest()
    return {
        "rc": rc,
        "files": hashes,
        "stdout": _normalise(stdout.getvalue(), out),
        "stderr": _normalise(stderr.getvalue(), out),
    }


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("commands")


@pytest.fixture(scope="module")
def records(outputs) -> dict[str, dict[str, object]]:
    return {name: run_case(name, outputs) for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_command_output_matches_the_snapshot(records, name):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert name in golden, f"no snapshot for {name}: regenerate (see the module docstring)"
    expected, got = golden[name], records[name]
    assert got["rc"] == expected["rc"]
    for rel, digest in expected["files"].items():
        assert got["files"].get(rel) == digest, f"{name}: {rel} changed"
    assert got["stdout"] == expected["stdout"]
    assert got["stderr"] == expected["stderr"]


# What each case's output must say, checked against what the examples' hand labels and the
# contract say rather than against a digest the same code made: a regenerated snapshot cannot
# hide a wrong output from these.
def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def _content_checks(out: Path) -> dict[str, object]:
    hand = {(g["trace_id"], g["step"]): g["label"] for g in _jsonl(EX / "gold_steps.jsonl")}
    correct = {g["trace_id"]: g["correct"] for g in _jsonl(EX / "gold_traces.jsonl")}

    def segment() -> None:
        traces = _jsonl(out / "segmented.jsonl")
        assert len(traces) == 10 and sum(len(t["steps"]) for t in traces) == len(hand)

    def check() -> None:
        vs = _jsonl(out / "verdicts.jsonl")
        agree = sum(hand[(v["trace_id"], v["step"])] == v["label"] for v in vs)
        assert len(vs) == len(hand) and agree == len(hand) - 2  # the two teacher errors
        assert all(v["tree"]["hypothesis"] == "answer_statement" for v in vs)

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
        report = json.loads((out / folder / "report.json").read_text())
        assert report["n_steps"] == len(hand) and report["bootstrap"]["unit"] == unit
        if "flag" in report["checkers"]:
            assert report["checkers"]["flag"]["sR"] == 1.0  # flagging all finds every gap

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
    assert records[name]["rc"] == 0
    _content_checks(outputs)[name]()


if __name__ == "__main__":  # python -m tests.cli.test_command_outputs --regenerate
    import tempfile

    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = {name: run_case(name, Path(tmp)) for name in CASES}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN} ({len(snapshot)} cases)")
