"""Teacher verdicts -> a chat SFT data set for the student judge (path-supervised).

Each example is one step: the prompt is exactly the teacher's judge prompt for that step, the
completion is the teacher's judge JSON extended with its `pipeline_path` and `gap_type`, so the
student learns how the tree reached the label, not only the label (the `compact` target keeps
only the judge's decisions and quote, without its reasoning strings). Splits are drawn by trace
(a hash of the trace id), so no trace has steps on both sides; gold-benchmark traces can be
excluded by id. Steps whose teacher check failed are skipped and counted, never guessed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepgap.io import replacing
from stepgap.schema import Verdict

from .student_target import check_target, student_target

SFT_META = "stepgap_sft.json"  # beside a saved data set: how its prompts were built


@dataclass
class SFTStats:
    examples: int = 0
    traces: int = 0
    skipped_failed: int = 0  # teacher check failed: nothing to imitate
    skipped_excluded: int = 0  # steps of excluded (gold benchmark) traces
    skipped_incomplete: int = 0  # traces whose verdicts lack question/step_data
    labels: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        labels = ", ".join(f"{k} {v}" for k, v in sorted(self.labels.items())) or "none"
        return (
            f"{self.examples} example(s) from {self.traces} trace(s) (labels: {labels}); "
            f"skipped {self.skipped_failed} failed check(s), {self.skipped_excluded} excluded "
            f"step(s), {self.skipped_incomplete} incomplete trace(s)"
        )


def sft_examples(
    verdicts: Iterable[Verdict],
    *,
    exclude_ids: Iterable[str] = (),
    stats: SFTStats | None = None,
    nli: Any = None,
    earlier_evidence_chars: int | None = None,
    target: str = "full",
) -> Iterator[dict[str, Any]]:
    """Prompt-completion chat examples, one per successfully labeled step.

    With an NLI backend, each prompt also carries the step's NLI features (the "with NLI"
    student); without, it is the teacher's prompt exactly (the paper's "no NLI" ablation).
    `earlier_evidence_chars` shortens the earlier-evidence budget of the prompt (default: the
    teacher's), to keep the examples within the student's `max_length`. `target`: what the
    completion holds (`TARGETS`; see `student_target`).
    """
    from stepgap.teacher.decide import step_nli_features
    from stepgap.teacher.prompt import build_messages, snippet_counts
    from stepgap.teacher.relabel import group_by_trace

    check_target(target)
    stats = stats if stats is not None else SFTStats()
    excluded = set(exclude_ids)
    for trace_id, group in group_by_trace(verdicts).items():
        if trace_id in excluded:
            stats.skipped_excluded += len(group)
            continue
        steps = [v.step_data for v in group]
        question = group[0].question
        if question is None or any(s is None for s in steps):
            stats.skipped_incomplete += len(group)
            continue
        stats.traces += 1
        features = step_nli_features(question, steps, nli) if nli is not None else None  # type: ignore[arg-type]
        before = snippet_counts(steps)  # type: ignore[arg-type]
        for i, v in enumerate(group):
            if v.judge is None or v.label is None:
                stats.skipped_failed += 1
                continue
            stats.examples += 1
            stats.labels[v.label] = stats.labels.get(v.label, 0) + 1
            yield {
                "prompt": build_messages(
                    question,
                    steps,  # type: ignore[arg-type]
                    i,
                    features[i] if features else None,
                    earlier_evidence_chars=earlier_evidence_chars,
                    snippets_before=before,
                ),
                "completion": [{"role": "assistant", "content": student_target(v, target)}],
                "trace_id": trace_id,
                "step": v.step,
                "label": v.label,
                "path": list(v.path),
            }


def in_eval_split(trace_id: str, eval_fraction: float, seed: int = 0) -> bool:
    """Deterministic by trace id: every step of a trace lands on the same side."""
    digest = hashlib.sha256(f"{seed}:{trace_id}".encode()).hexdigest()
    return int(digest[:8], 16) / 0x100000000 < eval_fraction


def split_by_trace(
    examples: Sequence[dict[str, Any]], eval_fraction: float = 0.1, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train, held = [], []
    for ex in examples:
        (held if in_eval_split(ex["trace_id"], eval_fraction, seed) else train).append(ex)
    return train, held


def build_sft_dataset(
    verdicts: Iterable[Verdict],
    *,
    eval_fraction: float = 0.1,
    seed: int = 0,
    exclude_ids: Iterable[str] = (),
    stats: SFTStats | None = None,
    nli: Any = None,
    earlier_evidence_chars: int | None = None,
    target: str = "full",
) -> Any:
    """A `datasets.DatasetDict` with `train` and (when non-empty) `test` splits."""
    from datasets import Dataset, DatasetDict

    examples = list(
        sft_examples(
            verdicts,
            exclude_ids=exclude_ids,
            stats=stats,
            nli=nli,
            earlier_evidence_chars=earlier_evidence_chars,
            target=target,
        )
    )
    if not examples:
        raise ValueError("no labeled steps to learn from (all failed, excluded or incomplete)")
    train, held = split_by_trace(examples, eval_fraction, seed)
    splits = {"train": Dataset.from_list(train)}
    if held:
        splits["test"] = Dataset.from_list(held)
    return DatasetDict(splits)


def save_sft_dataset(data: Any, path: str | Path, *, nli_features: bool, **info: Any) -> None:
    """`save_to_disk` plus a `stepgap_sft.json` that the trainer copies into the adapter, so the
    student judge knows whether its prompts need NLI features and which target it writes."""
    from stepgap.teacher.prompt import PROMPT_VERSION

    meta = {"nli_features": nli_features, "prompt_version": PROMPT_VERSION, **info}
    # an earlier data set in `path` is replaced whole, and only once this one is complete
    with replacing(path, folder=True, owned_by=SFT_META) as work:
        data.save_to_disk(str(work))
        (work / SFT_META).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")


def read_sft_metadata(path: str | Path) -> dict[str, Any]:
    """The data set's metadata; a folder without one (or a verdicts file) has no NLI features
    (and, like any data set built before targets were recorded, the full target)."""
    meta = Path(path) / SFT_META
    if meta.is_file():
        return json.loads(meta.read_text(encoding="utf-8"))
    return {"nli_features": False}


def read_ids(path: str | Path) -> set[str]:
    """Trace ids to exclude: one per line, or JSONL with `trace_id` / `id`."""
    ids = set()
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            obj = json.loads(line)
            ids.add(str(obj.get("trace_id", obj.get("id"))))
        else:
            ids.add(line)
    return ids


def write_sft_data(
    verdicts: str | Path | Sequence[str | Path],
    output: str | Path,
    *,
    eval_fraction: float = 0.1,
    seed: int = 0,
    exclude_ids: Iterable[str | Path] = (),
    nli_features: str | None = None,
    device: str | None = None,
    push_to_hub: str | None = None,
    private: bool = False,
    earlier_evidence_chars: int | None = None,
    target: str = "full",
    report: Any = None,
) -> tuple[Any, SFTStats]:
    """Teacher verdict files -> the student's SFT data set on disk (`stepgap sft-data`).

    `exclude_ids` are files of trace ids to leave out (the gold benchmark); `nli_features` is an
    NLI spec whose probabilities go into each prompt (the "with NLI" student); `target` is what
    each completion holds (`TARGETS`), recorded for the student judge. The data set is
    saved with `save_to_disk` under `output` (and pushed when `push_to_hub` names a repo).
    Returns the `DatasetDict` and its counts; unreadable verdict lines go to `report`.
    """
    from stepgap.hub_access import require_hub, upload_errors
    from stepgap.io import ErrorReport, check_output, read_models

    report = report if report is not None else ErrorReport()
    paths = [verdicts] if isinstance(verdicts, str | Path) else list(verdicts)
    check_output(output, *paths, folder=True)
    if push_to_hub:  # before any work, not after it
        require_hub(f"--push-to-hub {push_to_hub}")
    rows = [v for path in paths for _, v in read_models(path, Verdict, report)]
    exclude = set().union(*(read_ids(p) for p in exclude_ids))
    stats = SFTStats()
    nli = None
    if nli_features:
        from stepgap.teacher.nli import load_nli

        nli = load_nli(nli_features, device=device)
    data = build_sft_dataset(
        rows,
        eval_fraction=eval_fraction,
        seed=seed,
        exclude_ids=exclude,
        stats=stats,
        nli=nli,
        earlier_evidence_chars=earlier_evidence_chars,
        target=target,
    )
    save_sft_dataset(
        data,
        output,
        nli_features=nli is not None,
        nli_model=nli_features,
        earlier_evidence_chars=earlier_evidence_chars,
        target=target,
        eval_fraction=eval_fraction,
        seed=seed,
        stats=stats.__dict__,
    )
    if push_to_hub:
        with upload_errors(f"--push-to-hub {push_to_hub}"):
            data.push_to_hub(push_to_hub, private=private)
    return data, stats
