"""Hard negatives: the steps where the checker that ships parts from the teacher.

The paper's student fails mostly by calibration: it finds a quote and lets a claim through that
the teacher, after NLI, flags. What ships is not the student's own label but the decision tree
run on its judge object, with the NLI stages (`check --bundle`). So mining runs exactly that
checker over a teacher-labeled pool and keeps every step where its NLI-stage decision (the
stage D/E entries of the path) or its label differs from the teacher's (and, given gold labels,
only where the teacher matches gold on an adjacent step of the same trace, as the paper does).
The pool is held out: traces the student was trained on are left out (the adapter records
them). Mined steps are split by trace into a training half and a held-out half; a short
augmentation run continues from the adapter on the training half, an order of magnitude below
the distillation learning rate, and the same pool is measured again.

A PRM folder (`stepgap_prm.json`) is mined the same way with the PRM as the checker (no judge,
no NLI): a step is mined where its label or its firing stage (the last token of the teacher's
path) differs; the mined steps are written as verdicts a `kind: prm` recipe trains on, and the
augmentation continues the PRM from its folder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stepgap.data_builders.sft_data import build_sft_dataset, in_eval_split, save_sft_dataset
from stepgap.io import JsonlWriter, replacing, write_text
from stepgap.progress import progress_bar
from stepgap.schema import Trace, Verdict
from stepgap.teacher.checker import Checker, StepChecker
from stepgap.teacher.judges.base import JudgeBackend
from stepgap.teacher.judges.hf import StudentJudgeOptions
from stepgap.teacher.nli.base import NLIBackend
from stepgap.teacher.relabel import group_by_trace
from stepgap.tree import TreeConfig

from .prm import PRM_KIND, is_prm, prm_meta

log = logging.getLogger(__name__)

NO_GAP = "no_gap"
SUMMARY = "summary.json"  # marks a `stepgap mine` folder, which a rerun replaces
CHECK_BATCH = 64  # pool traces checked at once, as `stepgap check` batches them


def nli_decision(path: Sequence[str] | None) -> tuple[str, ...]:
    """The stage D/E part of a path: () when the tree decided before any NLI call."""
    return tuple(p for p in path or () if p.startswith(("stageD:", "stageE:")))


@dataclass
class Comparison:
    """One teacher-labeled step: the teacher's verdict and the shipped checker's (the student's
    judge object through the tree and the NLI stages)."""

    teacher: Verdict
    student: Verdict

    @property
    def student_label(self) -> str | None:
        return self.student.label

    @property
    def student_path(self) -> list[str]:
        return list(self.student.path)

    def differs(self) -> str | None:
        """Why this step is a hard negative, or None when the checker agrees with the teacher."""
        if self.student.label is None:
            return f"student failed: {self.student.error}"
        if nli_decision(self.student_path) != nli_decision(self.teacher.path):
            return "nli_stage"
        if self.student_label != self.teacher.label:
            return "label"
        return None

    def same_path(self) -> bool:
        return self.student_path == list(self.teacher.path)

    def short_circuit(self) -> bool:
        """The student's quote let the claim through (stage C found it, the tree said no-gap)
        where the teacher, with its own quote and NLI, found a gap."""
        return (
            "stageC:quote" in self.student.path
            and self.student_label == NO_GAP
            and self.teacher.label not in (None, NO_GAP)
        )


class PRMComparison(Comparison):
    """A step set against a PRM's verdict: its path is the firing stage alone, so the stage is
    compared with the last token of the teacher's path."""

    def differs(self) -> str | None:
        if self.student.label is None:
            return f"student failed: {self.student.error}"
        if not self.same_path():
            return "stage"
        if self.student_label != self.teacher.label:
            return "label"
        return None

    def same_path(self) -> bool:
        return bool(self.teacher.path) and self.student_path[-1:] == self.teacher.path[-1:]


def pool_traces(pool: Sequence[Verdict]) -> list[Trace]:
    """The traces of a verdicts file, rebuilt from the question and steps each verdict stores
    (traces whose verdicts lack them are skipped: nothing to prompt with)."""
    traces = []
    for trace_id, group in group_by_trace(pool).items():
        steps = [v.step_data for v in group]
        if group[0].question is None or any(s is None for s in steps):
            log.warning("trace %r: verdicts lack question/step_data; not compared", trace_id)
            continue
        traces.append(Trace(id=trace_id, question=group[0].question, steps=steps))
    return traces


def compare(
    judge: JudgeBackend,
    pool: Sequence[Verdict],
    nli: NLIBackend,
    config: TreeConfig | None = None,
    *,
    progress: bool = False,
    desc: str = "mine",
) -> list[Comparison]:
    """The shipped checker (`judge` + `nli` + the tree) over the pool's traces, set against
    the teacher on every step the teacher labeled; `CHECK_BATCH` traces at a time, their
    progress shown (as `desc`) when `progress`."""
    return compare_with(Checker(judge, nli, config), pool, progress=progress, desc=desc)


def compare_with(
    checker: StepChecker,
    pool: Sequence[Verdict],
    *,
    progress: bool = False,
    desc: str = "mine",
    kind: type[Comparison] = Comparison,
) -> list[Comparison]:
    """Any checker (the judge's with the tree, or a PRM) over the pool's traces, set against the
    teacher on every step the teacher labeled (as `kind` compares them)."""
    traces = pool_traces(pool)
    by_key: dict[tuple[str, int], Verdict] = {}
    with progress_bar(sum(len(t.steps or []) for t in traces), desc, enabled=progress) as bar:
        for start in range(0, len(traces), CHECK_BATCH):
            for verdicts in checker.check(traces[start : start + CHECK_BATCH]):
                by_key.update({(v.trace_id, v.step): v for v in verdicts})
                bar.update(len(verdicts))
    return [
        kind(v, by_key[(v.trace_id, v.step)])
        for v in pool
        if v.label is not None and (v.trace_id, v.step) in by_key
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
    failed: int = 0  # no verdict (no schema-valid judge answer, or an NLI failure)
    judge_json: float | None = None  # the judge's decisions and quote equal (what the tree reads)
    path: float | None = None  # the tree's path equal (for a PRM: the firing stage)
    nli_stage: float | None = None  # stage D/E part of the path equal
    label: float | None = None  # the shipped label equal

    @classmethod
    def of(cls, comparisons: Sequence[Comparison]) -> Agreement:
        n = len(comparisons)
        if not n:
            return cls()

        def rate(hits: int) -> float:
            return hits / n

        return cls(
            steps=n,
            failed=sum(c.student.label is None for c in comparisons),
            judge_json=rate(sum(_same_decisions(c) for c in comparisons)),
            path=rate(sum(c.same_path() for c in comparisons)),
            nli_stage=rate(
                sum(
                    c.student.label is not None
                    and nli_decision(c.student_path) == nli_decision(c.teacher.path)
                    for c in comparisons
                )
            ),
            label=rate(sum(c.student_label == c.teacher.label for c in comparisons)),
        )


def _same_decisions(c: Comparison) -> bool:
    """Equal judge decisions and quote, reasoning aside (a compact student writes none)."""
    from stepgap.data_builders.student_target import judge_decisions

    s, t = c.student.judge, c.teacher.judge
    return s is not None and t is not None and judge_decisions(s) == judge_decisions(t)


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
    earlier_evidence_chars: int | None = None,
    *,
    prm: bool = False,
) -> Path:
    """hard_negatives.jsonl (with reasons), sft/ (train = mined half, test = held-out half),
    and summary.json; the SFT examples are the student's own prompts (its NLI features and
    evidence budget) over the pool's whole traces. For a PRM (`prm`), prm/verdicts.jsonl in
    place of sft/ (see `write_prm_verdicts`). An earlier output in `out_dir` is replaced whole
    once all three are written."""
    with replacing(out_dir, folder=True, owned_by=SUMMARY) as work:
        if prm:
            _write_hard_negatives(result, work)
            write_prm_verdicts(result, pool, work / PRM_DATA)
            (work / SUMMARY).write_text(json.dumps(result.summary(), indent=2), encoding="utf-8")
        else:
            _write_mined(result, pool, work, nli, earlier_evidence_chars)
    return Path(out_dir)


PRM_DATA = "prm"  # under a PRM's mined folder: the verdicts a `kind: prm` recipe trains on
CONTEXT = "context: not a mined step"  # the error of the unlabelled steps around mined ones


def write_prm_verdicts(result: MineResult, pool: Sequence[Verdict], folder: Path) -> None:
    """`folder/verdicts.jsonl`: the whole traces of the mined training half (a PRM reads whole
    traces), the mined steps with the teacher's verdicts and every other step without a label
    (`CONTEXT`), so that continuing a PRM trains on the mined steps only."""
    keep = {(v.trace_id, v.step) for v in result.train}
    traces = {v.trace_id for v in result.train}
    folder.mkdir(parents=True, exist_ok=True)
    with JsonlWriter(folder / "verdicts.jsonl") as f:
        for v in pool:
            if v.trace_id not in traces:
                continue
            if (v.trace_id, v.step) not in keep:
                v = v.model_copy(update={"label": None, "repair": None, "error": CONTEXT})
            f.write(json.loads(v.model_dump_json()))


def _write_hard_negatives(result: MineResult, out: Path) -> None:
    held = {(v.trace_id, v.step) for v in result.held_out}
    with JsonlWriter(out / "hard_negatives.jsonl") as f:
        for v, reason in result.mined:
            split = "held_out" if (v.trace_id, v.step) in held else "train"
            f.write({**json.loads(v.model_dump_json()), "mined_reason": reason, "split": split})


def _write_mined(
    result: MineResult,
    pool: Sequence[Verdict],
    out: Path,
    nli: NLIBackend | None,
    earlier_evidence_chars: int | None,
) -> None:
    held = {(v.trace_id, v.step) for v in result.held_out}
    _write_hard_negatives(result, out)
    keep = {(v.trace_id, v.step) for v, _ in result.mined}
    context = [
        v if (v.trace_id, v.step) in keep else v.model_copy(update={"label": None, "judge": None})
        for v in pool
    ]  # whole traces for the prompts; only mined steps become examples
    if result.mined:
        data = build_sft_dataset(
            context, eval_fraction=0.0, nli=nli, earlier_evidence_chars=earlier_evidence_chars
        )
        train = data["train"].filter(lambda ex: (ex["trace_id"], ex["step"]) not in held)
        test = data["train"].filter(lambda ex: (ex["trace_id"], ex["step"]) in held)
        from datasets import DatasetDict

        splits = {"train": train} | ({"test": test} if len(test) else {})
        save_sft_dataset(
            DatasetDict(splits),
            out / "sft",
            nli_features=nli is not None,
            earlier_evidence_chars=earlier_evidence_chars,
        )
    (out / SUMMARY).write_text(json.dumps(result.summary(), indent=2), encoding="utf-8")


AUGMENT_LR_DIVISOR = 10


def augment_learning_rate(config: str | Path, overrides: Sequence[str] = ()) -> float:
    """The recipe's distillation rate divided by `AUGMENT_LR_DIVISOR` (the paper's protocol)."""
    from stepgap.arguments import parse_sets

    from .recipe import load_config

    recipe = load_config(config, parse_sets(list(overrides)))
    return recipe.training_args.learning_rate / AUGMENT_LR_DIVISOR


def augment(
    config: str | Path,
    adapter: str | Path,
    mined_dir: str | Path,
    *,
    max_steps: int = 200,
    learning_rate: float | None = None,
    overrides: Sequence[str] = (),
    prm: bool = False,
) -> Path:
    """Continue training `adapter` on the mined half (`mined_dir/sft`); returns the new adapter.
    With `prm`, `adapter` is a PRM folder, continued whole on `mined_dir/prm`.

    The recipe gives everything else (LoRA shape, batch, precision); the base is the adapter's own.
    `learning_rate` defaults to the recipe's own divided by `AUGMENT_LR_DIVISOR`: the paper
    augments an order of magnitude below the distillation rate, so as not to overfit the small
    mined set.
    """
    from stepgap.arguments import parse_sets

    from .judge import adapter_base
    from .recipe import load_config
    from .trainer import train

    sets = parse_sets(list(overrides))
    out = Path(mined_dir) / "augmented"
    settings: dict[str, Any] = {"output_dir": str(out), "max_steps": max_steps,
                                "max_train_examples": None}  # fmt: skip
    if prm:  # the PRM folder is the base; every mined trace trains (the held-out half is apart)
        settings |= {"model_name_or_path": str(adapter), "kind": PRM_KIND, "eval_fraction": 0.0,
                     "dataset": str(Path(mined_dir) / PRM_DATA)}  # fmt: skip
    else:
        settings |= {
            "model_name_or_path": sets.get("model_name_or_path") or adapter_base(adapter),
            "init_adapter": str(adapter),
            "dataset": str(Path(mined_dir) / "sft"),
        }
    settings |= sets
    if learning_rate is None:
        learning_rate = augment_learning_rate(config, overrides)
    train(load_config(config, {**settings, "learning_rate": learning_rate}))
    return out


def trained_traces(student: str | Path) -> list[str] | None:
    """The traces a student (an adapter, merged folder or PRM) records it was trained on."""
    from .judge import TRAIN_TRACES, student_meta

    if is_prm(student):
        return prm_meta(student).get(TRAIN_TRACES)
    return student_meta(student).get(TRAIN_TRACES)


def held_out_pool(
    pool: Sequence[Verdict], student: str | Path, *, allow_training_traces: bool = False
) -> tuple[list[Verdict], dict[str, Any]]:
    """The pool without the traces the student was trained on (its `stepgap_student.json`
    lists them): disagreements on training traces measure memory, not the checker."""
    trained = trained_traces(student)
    if trained is None or allow_training_traces:
        if trained is None:
            log.warning(
                "%s records no training traces (trained before stepgap recorded them): the "
                "pool is used whole; make sure it is held out from the SFT data",
                student,
            )
        # None: the student records none, so none could be found; 0: kept, as asked
        return list(pool), {"training_traces_dropped": None if trained is None else 0}
    seen = set(trained)
    kept = [v for v in pool if v.trace_id not in seen]
    dropped = {v.trace_id for v in pool if v.trace_id in seen}
    if not kept:
        raise ValueError(
            f"every trace of the pool was in {student}'s training set ({len(dropped)} traces): "
            "mine on held-out verdicts (the sft-data test split, or traces labeled after "
            "training), or pass --include-training-traces to measure memory anyway"
        )
    return kept, {"training_traces_dropped": len(dropped)}


def mine(
    pool: str | Path,
    student: str | Path,
    output: str | Path,
    *,
    nli: str | NLIBackend | None,
    gold: Sequence[str | Path] | None = None,
    tree: TreeConfig | None = None,
    device: str | None = None,
    held_out_fraction: float = 0.5,
    seed: int = 0,
    allow_training_traces: bool = False,
    augment_config: str | Path | None = None,
    augment_steps: int = 200,
    augment_lr: float | None = None,
    overrides: Sequence[str] = (),
    judge_options: StudentJudgeOptions | Mapping[str, Any] | None = None,
    report: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Mine hard negatives from a teacher-labeled pool and optionally augment (`stepgap mine`).

    Runs the checker that would ship (the student in `student`, an adapter or merged folder,
    with `nli` and the tree under `tree`, the teacher's thresholds by default) over the pool's
    held-out traces (see `held_out_pool`), keeps the disagreements with the teacher
    (gold-supported ones with `gold` files), writes them under `output` (see `write_mined`) and,
    with `augment_config`, continues the adapter on the mined train half at the recipe's rate
    / 10 and measures again. Returns the summary also written to `summary.json`. `nli` is a
    spec or a backend (on `device`); `judge_options` are the student judge's
    (`StudentJudgeOptions`, or its fields by name: `student_base`, `judge_device`, ...).
    The checker's progress is shown unless not `progress`. A PRM folder as `student` is
    mined by `mine_prm` (`nli`, `tree` and `judge_options` are not used).
    """
    from stepgap.io import ErrorReport, read_models
    from stepgap.teacher.judges import build_judge, close_judge

    report = report if report is not None else ErrorReport()
    options = judge_options
    verdicts, pool_info = held_out_pool(
        [v for _, v in read_models(pool, Verdict, report)],
        student,
        allow_training_traces=allow_training_traces,
    )
    gold_steps = None
    if gold:
        from stepgap.eval.report import load_gold

        gold_steps = load_gold(gold, report).steps
    if is_prm(student):
        return mine_prm(
            student, verdicts, output, pool_info, gold_steps, device=device,
            held_out_fraction=held_out_fraction, seed=seed, augment_config=augment_config,
            augment_steps=augment_steps, augment_lr=augment_lr, overrides=overrides,
            progress=progress,
        )  # fmt: skip
    nli_backend = nli
    if isinstance(nli, str):
        from stepgap.teacher.nli import load_nli

        nli_backend = load_nli(nli, device=device)
    judge = build_judge(f"student:{student}", options)
    try:
        comparisons = compare(judge, verdicts, nli_backend, tree, progress=progress)  # type: ignore[arg-type]
        features = nli_backend if judge.nli_features else None
        budget = judge.earlier_evidence_chars  # the student's own prompt
    finally:  # on vLLM its engine holds most of the GPU's memory, which the augmentation needs
        close_judge(judge)
    del judge
    result = select_hard_negatives(
        comparisons, gold_steps, held_out_fraction=held_out_fraction, seed=seed
    )
    out = write_mined(result, verdicts, output, features, budget)  # type: ignore[arg-type]
    summary = {**pool_info, **result.summary()}
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
        augmented = build_judge(f"student:{adapter}", options)
        try:
            after = compare(
                augmented, verdicts, nli_backend, tree,  # type: ignore[arg-type]
                progress=progress, desc="mine (augmented)",
            )  # fmt: skip
        finally:
            close_judge(augmented)
        summary["augmented_adapter"] = str(adapter)
        summary.update(after_augmenting(result, comparisons, after))
    write_text(Path(out) / SUMMARY, json.dumps(summary, indent=2))
    return summary


def after_augmenting(
    result: MineResult, before: Sequence[Comparison], after: Sequence[Comparison]
) -> dict[str, Any]:
    """The pool measured again after the augmentation, whole and on the mined held-out half
    (the augmentation trained on the train half: the held-out half is the honest check)."""
    held = {v.trace_id for v in result.held_out}
    return {
        "short_circuit_after": asdict(ShortCircuit.of(after)),
        "agreement_after": asdict(Agreement.of(after)),
        "agreement_held_out": asdict(
            Agreement.of([c for c in before if c.teacher.trace_id in held])
        ),
        "agreement_after_held_out": asdict(
            Agreement.of([c for c in after if c.teacher.trace_id in held])
        ),
    }


def mine_prm(
    prm: str | Path,
    verdicts: Sequence[Verdict],
    output: str | Path,
    pool_info: dict[str, Any],
    gold: dict[tuple[str, int], str] | None = None,
    *,
    device: str | None = None,
    held_out_fraction: float = 0.5,
    seed: int = 0,
    augment_config: str | Path | None = None,
    augment_steps: int = 200,
    augment_lr: float | None = None,
    overrides: Sequence[str] = (),
    progress: bool = True,
) -> dict[str, Any]:
    """`mine` for a PRM folder: the PRM (no judge, no NLI) over the held-out pool, a step mined
    where its label or firing stage (the last token of the teacher's path) differs; the mined
    steps written as verdicts a `kind: prm` recipe takes and, with `augment_config`, the PRM
    continued on the train half at the recipe's rate / 10 and measured again."""
    from .prm import PRMChecker

    def measure(folder: str | Path, desc: str) -> list[Comparison]:
        checker = PRMChecker.from_folder(folder, device)
        return compare_with(checker, verdicts, progress=progress, desc=desc, kind=PRMComparison)

    comparisons = measure(prm, "mine")
    result = select_hard_negatives(
        comparisons, gold, held_out_fraction=held_out_fraction, seed=seed
    )
    out = write_mined(result, verdicts, output, prm=True)
    summary = {**pool_info, **result.summary()}
    if augment_config and result.train:
        if augment_lr is None:
            augment_lr = augment_learning_rate(augment_config, overrides)
        summary["augment_learning_rate"] = augment_lr
        folder = augment(
            augment_config, prm, out, max_steps=augment_steps, learning_rate=augment_lr,
            overrides=overrides, prm=True,
        )  # fmt: skip
        summary["augmented_prm"] = str(folder)
        summary.update(after_augmenting(result, comparisons, measure(folder, "mine (augmented)")))
    write_text(Path(out) / SUMMARY, json.dumps(summary, indent=2))
    return summary
