"""Hard negatives: the steps where the student's path or label parts from the teacher's.

The paper's student fails mostly by calibration: it says `found_quote` and answers no-gap,
skipping the NLI check the teacher runs. Mining runs the student over a teacher-labeled pool,
keeps every step where the student's NLI-stage decision (the stage D/E entries of its path) or
its final label differs from the teacher's (and, given gold labels, only where the teacher
matches gold on an adjacent step of the same trace, as the paper does), and splits the mined
steps by trace into a training half and a held-out half. A short augmentation run continues
from the adapter on the training half; the found_quote -> no_gap short-circuit rate is measured
before and after on the same pool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stepgap.data_builders.schema import Verdict
from stepgap.data_builders.sft import build_sft_dataset, in_eval_split, save_sft_dataset
from stepgap.teacher.checker import group_by_trace, step_nli_features
from stepgap.teacher.judges.base import JudgeBackend, JudgeRequest, JudgeResult
from stepgap.teacher.nli.base import NLIBackend
from stepgap.teacher.prompt import build_messages

NO_GAP = "no_gap"


def nli_decision(path: Sequence[str] | None) -> tuple[str, ...]:
    """The stage D/E part of a path: () when the tree decided before any NLI call."""
    return tuple(p for p in path or () if p.startswith(("stageD:", "stageE:")))


@dataclass
class Comparison:
    """The student's answer for one teacher-labeled step."""

    teacher: Verdict
    result: JudgeResult

    @property
    def student_label(self) -> str | None:
        return self.result.extra.get("gap_type") if self.result.judge is not None else None

    @property
    def student_path(self) -> list[str]:
        return list(self.result.extra.get("pipeline_path") or [])

    def differs(self) -> str | None:
        """Why this step is a hard negative, or None when the student agrees with the teacher."""
        if self.result.judge is None:
            return f"student failed: {self.result.error}"
        if nli_decision(self.student_path) != nli_decision(self.teacher.path):
            return "nli_stage"
        if self.student_label != self.teacher.label:
            return "label"
        return None

    def short_circuit(self) -> bool:
        """The student found a quote and said no-gap where the teacher, after NLI, found a gap."""
        judge = self.result.judge
        return (
            judge is not None
            and judge.step_1_quote_search.found_quote
            and self.student_label == NO_GAP
            and self.teacher.label not in (None, NO_GAP)
        )


def student_requests(pool: Sequence[Verdict], nli: NLIBackend | None = None) -> list[JudgeRequest]:
    """The judge prompt for every step of the pool that the teacher labeled (with NLI
    features when an NLI backend is given, for students trained with them)."""
    requests = []
    for trace_id, group in group_by_trace(pool).items():
        steps = [v.step_data for v in group]
        question = group[0].question
        if question is None or any(s is None for s in steps):
            continue
        feats = step_nli_features(question, steps, nli) if nli is not None else None  # type: ignore[arg-type]
        for i, v in enumerate(group):
            if v.label is not None and v.judge is not None:
                messages = build_messages(question, steps, i, feats[i] if feats else None)  # type: ignore[arg-type]
                requests.append(JudgeRequest(trace_id, v.step, v.type, messages))
    return requests


def compare(
    judge: JudgeBackend, pool: Sequence[Verdict], nli: NLIBackend | None = None
) -> list[Comparison]:
    """Ask the student about every teacher-labeled step of the pool."""
    if getattr(judge, "nli_features", False) and nli is None:
        raise ValueError("this student was trained with NLI features: give an NLI model (--nli)")
    by_key = {(v.trace_id, v.step): v for v in pool}
    requests = student_requests(pool, nli if getattr(judge, "nli_features", False) else None)
    results = judge.judge(requests)
    return [
        Comparison(by_key[(r.trace_id, r.step)], res)
        for r, res in zip(requests, results, strict=True)
    ]


@dataclass
class ShortCircuit:
    steps: int = 0
    teacher_gaps: int = 0
    student_false_negatives: int = 0  # teacher: a gap; student: no gap
    short_circuits: int = 0
    rate: float | None = None  # short circuits / teacher gaps
    share_of_false_negatives: float | None = None  # the paper's 49%

    @classmethod
    def of(cls, comparisons: Sequence[Comparison]) -> ShortCircuit:
        s = cls(steps=len(comparisons))
        for c in comparisons:
            gap = c.teacher.label not in (None, NO_GAP)
            s.teacher_gaps += gap
            s.student_false_negatives += gap and c.student_label == NO_GAP
            s.short_circuits += c.short_circuit()
        s.rate = s.short_circuits / s.teacher_gaps if s.teacher_gaps else None
        if s.student_false_negatives:
            s.share_of_false_negatives = s.short_circuits / s.student_false_negatives
        return s


@dataclass
class Agreement:
    """How closely the student's own answers follow the teacher's, step by step."""

    steps: int = 0
    failed: int = 0  # no schema-valid answer
    judge_json: float | None = None  # the whole judge object equal
    path: float | None = None  # pipeline_path equal
    nli_stage: float | None = None  # stage D/E part of the path equal
    label: float | None = None  # gap_type equal

    @classmethod
    def of(cls, comparisons: Sequence[Comparison]) -> Agreement:
        n = len(comparisons)
        if not n:
            return cls()

        def rate(hits: int) -> float:
            return hits / n

        return cls(
            steps=n,
            failed=sum(c.result.judge is None for c in comparisons),
            judge_json=rate(sum(c.result.judge == c.teacher.judge for c in comparisons)),
            path=rate(sum(c.student_path == list(c.teacher.path) for c in comparisons)),
            nli_stage=rate(
                sum(
                    c.result.judge is not None
                    and nli_decision(c.student_path) == nli_decision(c.teacher.path)
                    for c in comparisons
                )
            ),
            label=rate(sum(c.student_label == c.teacher.label for c in comparisons)),
        )


@dataclass
class MineResult:
    mined: list[tuple[Verdict, str]] = field(default_factory=list)  # (teacher verdict, reason)
    train: list[Verdict] = field(default_factory=list)
    held_out: list[Verdict] = field(default_factory=list)
    skipped_gold: int = 0
    short_circuit: ShortCircuit = field(default_factory=ShortCircuit)
    agreement: Agreement = field(default_factory=Agreement)

    def summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for _, reason in self.mined:
            key = reason if not reason.startswith("student failed") else "student_failed"
            reasons[key] = reasons.get(key, 0) + 1
        return {
            "mined": len(self.mined),
            "train": len(self.train),
            "held_out": len(self.held_out),
            "reasons": reasons,
            "skipped_without_gold_support": self.skipped_gold,
            "short_circuit": asdict(self.short_circuit),
            "agreement": asdict(self.agreement),
        }


def select_hard_negatives(
    comparisons: Sequence[Comparison],
    gold: dict[tuple[str, int], str] | None = None,
    *,
    held_out_fraction: float = 0.5,
    seed: int = 0,
) -> MineResult:
    """Keep the disagreements (gold-supported ones when gold is given); split them by trace."""
    teacher = {(c.teacher.trace_id, c.teacher.step): c.teacher for c in comparisons}
    out = MineResult(
        short_circuit=ShortCircuit.of(comparisons), agreement=Agreement.of(comparisons)
    )
    for c in comparisons:
        reason = c.differs()
        if reason is None:
            continue
        v = c.teacher
        if gold is not None and not _teacher_matches_gold_nearby(v, teacher, gold):
            out.skipped_gold += 1
            continue
        out.mined.append((v, reason))
        side = out.held_out if in_eval_split(v.trace_id, held_out_fraction, seed) else out.train
        side.append(v)
    return out


def _teacher_matches_gold_nearby(
    v: Verdict, teacher: dict[tuple[str, int], Verdict], gold: dict[tuple[str, int], str]
) -> bool:
    for neighbour in (v.step - 1, v.step + 1):
        key = (v.trace_id, neighbour)
        if key in gold and key in teacher and teacher[key].label == gold[key]:
            return True
    return False


def write_mined(
    result: MineResult,
    pool: Sequence[Verdict],
    out_dir: str | Path,
    nli: NLIBackend | None = None,
) -> Path:
    """hard_negatives.jsonl (with reasons), sft/ (train = mined half, test = held-out half),
    and summary.json; the SFT examples keep the teacher's full prompt context from the pool."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    held = {(v.trace_id, v.step) for v in result.held_out}
    with (out / "hard_negatives.jsonl").open("w", encoding="utf-8") as f:
        for v, reason in result.mined:
            split = "held_out" if (v.trace_id, v.step) in held else "train"
            row = {**json.loads(v.model_dump_json()), "mined_reason": reason, "split": split}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    keep = {(v.trace_id, v.step) for v, _ in result.mined}
    context = [
        v if (v.trace_id, v.step) in keep else v.model_copy(update={"label": None, "judge": None})
        for v in pool
    ]  # whole traces for the prompts; only mined steps become examples
    if result.mined:
        data = build_sft_dataset(context, eval_fraction=0.0, nli=nli)
        train = data["train"].filter(lambda ex: (ex["trace_id"], ex["step"]) not in held)
        test = data["train"].filter(lambda ex: (ex["trace_id"], ex["step"]) in held)
        from datasets import DatasetDict

        splits = {"train": train} | ({"test": test} if len(test) else {})
        save_sft_dataset(DatasetDict(splits), out / "sft", nli_features=nli is not None)
    (out / "summary.json").write_text(json.dumps(result.summary(), indent=2), encoding="utf-8")
    return out


AUGMENT_LR_DIVISOR = 10


def augment_learning_rate(config: str | Path, overrides: Sequence[str] = ()) -> float:
    """The recipe's distillation rate divided by `AUGMENT_LR_DIVISOR` (the paper's protocol)."""
    from .config import load_config, parse_overrides

    return load_config(config, parse_overrides(list(overrides))).learning_rate / AUGMENT_LR_DIVISOR


def augment(
    config: str | Path,
    adapter: str | Path,
    mined_dir: str | Path,
    *,
    max_steps: int = 200,
    learning_rate: float | None = None,
    overrides: Sequence[str] = (),
) -> Path:
    """Continue training `adapter` on the mined half (`mined_dir/sft`); returns the new adapter.

    The recipe gives everything else (LoRA shape, batch, precision); the base is the adapter's own.
    `learning_rate` defaults to the recipe's own divided by `AUGMENT_LR_DIVISOR`: the paper
    augments an order of magnitude below the distillation rate, so as not to overfit the small
    mined set.
    """
    from .config import load_config, parse_overrides
    from .judge import ADAPTER_CONFIG
    from .sft import train

    adapter_cfg = json.loads((Path(adapter) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    out = Path(mined_dir) / "augmented"
    settings = {
        "model": adapter_cfg["base_model_name_or_path"],
        "init_adapter": str(adapter),
        "dataset": str(Path(mined_dir) / "sft"),
        "output_dir": str(out),
        "max_steps": max_steps,
        "max_train_examples": None,
        **parse_overrides(list(overrides)),
    }
    if learning_rate is None:
        learning_rate = augment_learning_rate(config, overrides)
    train(load_config(config, {**settings, "learning_rate": learning_rate}))
    return out


def mine(
    pool: str | Path,
    student: str | Path,
    output: str | Path,
    *,
    gold: Sequence[str | Path] | None = None,
    nli: str | NLIBackend | None = None,
    device: str | None = None,
    held_out_fraction: float = 0.5,
    seed: int = 0,
    augment_config: str | Path | None = None,
    augment_steps: int = 200,
    augment_lr: float | None = None,
    overrides: Sequence[str] = (),
    judge_options: dict[str, Any] | None = None,
    report: Any = None,
) -> dict[str, Any]:
    """Mine hard negatives from a teacher-labeled pool and optionally augment (`stepgap mine`).

    Runs the student (`student`: adapter or merged folder) over every teacher-labeled step of
    `pool`, keeps the disagreements (gold-supported ones with `gold` files), writes them under
    `output` (see `write_mined`) and, with `augment_config`, continues the adapter on the mined
    train half and measures again. Returns the summary that is also written to `summary.json`.
    `nli` (spec or backend) is needed for a student trained with NLI features; `judge_options`
    go to the student judge (`base`, `device`, `dtype`, `batch_size`, `max_new_tokens`).
    """
    from stepgap.data_builders.io import ErrorReport, read_models
    from stepgap.teacher.judges import load_judge

    report = report if report is not None else ErrorReport()
    options = judge_options or {}
    verdicts = [v for _, v in read_models(pool, Verdict, report)]
    gold_steps = None
    if gold:
        from stepgap.eval.report import load_gold

        gold_steps = load_gold(gold, report).steps
    nli_backend = nli
    if isinstance(nli, str):
        from stepgap.teacher.nli import load_nli

        nli_backend = load_nli(nli, device=device)
    judge = load_judge(f"student:{student}", **options)
    comparisons = compare(judge, verdicts, nli_backend)  # type: ignore[arg-type]
    result = select_hard_negatives(
        comparisons, gold_steps, held_out_fraction=held_out_fraction, seed=seed
    )
    features = nli_backend if judge.nli_features else None  # type: ignore[attr-defined]
    out = write_mined(result, verdicts, output, features)  # type: ignore[arg-type]
    summary = result.summary()
    if augment_config and result.train:
        if augment_lr is None:
            augment_lr = augment_learning_rate(augment_config, overrides)
        summary["augment_learning_rate"] = augment_lr
        adapter = augment(
            augment_config,
            student,
            out,
            max_steps=augment_steps,
            learning_rate=augment_lr,
            overrides=overrides,
        )
        after = compare(load_judge(f"student:{adapter}", **options), verdicts, nli_backend)  # type: ignore[arg-type]
        summary["augmented_adapter"] = str(adapter)
        summary["short_circuit_after"] = asdict(ShortCircuit.of(after))
        summary["agreement_after"] = asdict(Agreement.of(after))
    (Path(out) / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
