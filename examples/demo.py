"""Run the stepgap pipeline offline on the shipped examples (what `make demo` does).

Stages: segment -> check (teacher tree) -> relabel (ablations) -> baselines -> eval -> distil a
tiny student -> export an offline bundle and check with it. The judge and NLI outputs of the
main run are replayed from `examples/*_replay.jsonl`, hand-written from the paper's case
studies. Later runs swap in a small stand-in NLI model (a tiny DebertaV2 with random weights,
built here) and a tiny random student: they show the real model paths end to end, but their
labels mean nothing beyond the steps the student memorised.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.fixtures (the stand-in model builder)

from stepgap.cli import main  # noqa: E402

EX = REPO / "examples"
OUT = REPO / "demo_out"


def run(*argv: str) -> None:
    print("$ stepgap", " ".join(argv))
    if main(list(argv)) != 0:
        sys.exit(f"demo: `stepgap {argv[0]}` failed")


def labels(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def show(title: str, path: Path) -> None:
    rows = labels(path)
    print(f"\n{title}: {dict(Counter(r['label'] for r in rows))}")


def main_demo() -> None:
    OUT.mkdir(exist_ok=True)
    replay = [
        f"--judge=replay:{EX / 'judge_replay.jsonl'}",
        f"--nli=replay:{EX / 'nli_replay.jsonl'}",
    ]

    print("== 1. segment raw Search-R1 / Hermes responses into steps")
    run("segment", str(EX / "traces.jsonl"), "-o", str(OUT / "segmented.jsonl"))

    print("\n== 2. check every step (replayed judge + replayed NLI, from the paper's case studies)")
    run("check", str(OUT / "segmented.jsonl"), *replay, "-o", str(OUT / "verdicts.jsonl"))
    for v in labels(OUT / "verdicts.jsonl"):
        print(
            f"  {v['trace_id']:<30} step {v['step']}  {v['label']:<7} {v['repair']:<16} {' > '.join(v['path'])}"
        )
    gold = {(g["trace_id"], g["step"]): g["label"] for g in labels(EX / "gold_steps.jsonl")}
    agree = sum(
        gold[(v["trace_id"], v["step"])] == v["label"] for v in labels(OUT / "verdicts.jsonl")
    )
    print(f"  agreement with the hand labels in examples/gold_steps.jsonl: {agree}/{len(gold)}")

    print("\n== 3. relabel the stored verdicts under ablations (no model is called)")
    for ablation in ("A", "E"):
        out = OUT / f"verdicts_minus_{ablation}.jsonl"
        run("relabel", str(OUT / "verdicts.jsonl"), "--ablate", ablation, "-o", str(out))
        show(f"  labels without stage {ablation}", out)
    show("  labels with every stage", OUT / "verdicts.jsonl")

    print("\n== 4. the same check with a STAND-IN NLI model (tiny DebertaV2, random weights)")
    from tests.fixtures.models import build_deberta_nli

    with tempfile.TemporaryDirectory() as tmp:
        nli = build_deberta_nli(Path(tmp) / "tiny-nli")
        run(
            "check",
            str(OUT / "segmented.jsonl"),
            replay[0],
            f"--nli={nli}",
            "--device=cpu",
            "-o",
            str(OUT / "verdicts_standin_nli.jsonl"),
        )
        show(
            "  labels with the stand-in NLI (meaningless: random weights)",
            OUT / "verdicts_standin_nli.jsonl",
        )

        print("\n== 5. baselines: flag-everything, and NLI-only / NER-Quote with the stand-in NLI")
        seg = str(OUT / "segmented.jsonl")
        run("baseline", "flag-everything", seg, "-o", str(OUT / "baseline_flag.jsonl"))
        run("baseline", "nli-only", seg, f"--nli={nli}", "-o", str(OUT / "baseline_nli_only.jsonl"))
        run(
            "baseline",
            "ner-quote",
            seg,
            replay[0],
            f"--nli={nli}",
            "-o",
            str(OUT / "baseline_ner_quote.jsonl"),
        )

    print("\n== 6. evaluate every checker against the hand labels (report, tables, plots)")
    run(
        "eval",
        f"--gold={EX / 'gold_steps.jsonl'}",
        f"--gold={EX / 'gold_traces.jsonl'}",
        f"--pred=StepGap={OUT / 'verdicts.jsonl'}",
        f"--pred=StepGap-A={OUT / 'verdicts_minus_A.jsonl'}",
        f"--pred=StepGap-E={OUT / 'verdicts_minus_E.jsonl'}",
        f"--pred=flag-everything={OUT / 'baseline_flag.jsonl'}",
        f"--pred=NLI-only(stand-in)={OUT / 'baseline_nli_only.jsonl'}",
        f"--pred=NER-Quote(stand-in)={OUT / 'baseline_ner_quote.jsonl'}",
        "--silver=StepGap",
        "-o",
        str(OUT / "report"),
    )
    md = (OUT / "report" / "report.md").read_text()
    print(md.split("## Label distribution")[0])
    print("\n== 7. distil: SFT data from the teacher verdicts, the tiny student recipe, mining")
    run("sft-data", str(OUT / "verdicts.jsonl"), "-o", str(OUT / "sft_data"), "--eval-fraction=0.3")
    student = OUT / "student_tiny"
    run("train", "--config", str(REPO / "student/configs/tiny.yaml"),
        f"--set=dataset={OUT / 'verdicts.jsonl'}", f"--set=output_dir={student}")  # fmt: skip
    run("mine", str(OUT / "verdicts.jsonl"), f"--student={student}", "-o", str(OUT / "mined"))

    print("\n== 8. export the student + ONNX NLI bundle, then check offline from it")
    with tempfile.TemporaryDirectory() as tmp:
        nli = build_deberta_nli(Path(tmp) / "tiny-nli")
        run("export", f"--student={student}", f"--nli={nli}", "-o", str(OUT / "bundle"),
            "--merge", "--nli-quantize=int8", "--overwrite",
            f"--eval-report={OUT / 'report' / 'report.json'}")  # fmt: skip
    run("check", str(OUT / "segmented.jsonl"), f"--bundle={OUT / 'bundle'}",
        "-o", str(OUT / "verdicts_bundle.jsonl"))  # fmt: skip
    show(
        "  labels from the offline bundle (tiny student, stand-in NLI)",
        OUT / "verdicts_bundle.jsonl",
    )
    run("push", str(OUT / "bundle"), "--repo-id=you/stepgap-demo", "--dry-run")

    print(
        f"\nAll outputs are in {OUT}/ (report in {OUT / 'report'}/). Stand-in models used: the "
        "stage D/E NLI model in steps 4-5 and 8, and the tiny student in 7-8; those rows measure "
        "nothing about a real checker."
    )


if __name__ == "__main__":
    main_demo()
