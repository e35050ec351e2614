"""`stepgap view`: one self-contained HTML page to diagnose a checker by looking at its verdicts.

People find a checker's faults by reading traces, not JSON lines. The page shows, per trace, the
question, the gold answers, the final answer and its EM; per step one card per checker,
coloured by label, with the repair, the decision path as stage chips, the confidence, the judge's
reasoning (on demand), the evidence with the judge's quote highlighted where stage C finds it
(marked when it is not verbatim), the stage E premises and each NLI call's probabilities; the
reward brackets when a `stepgap reward` file is given; two checkers (or a checker and gold) side
by side with disagreements marked; filters, search and pagination; and a summary with the label
distribution and, with gold, the evaluation report's main figures.

The page is static and offline and only one page of traces is in the DOM at a time, so 5,000
traces stay usable. This module reads the files and writes the page; what the page shows is
`view_data.py`, how it is drawn safely `view_page.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stepgap.io import ErrorReport, read_models, read_steps_once, write_text
from stepgap.schema import Trace, Verdict

from .report import Gold, load_gold
from .view_data import DEFAULT_PAGE_SIZE, RewardLine, view_data
from .view_page import render_html


@dataclass
class ViewResult:
    """What `write_view` wrote: the page, how many traces and steps it holds."""

    path: Path
    traces: int
    steps: int
    bytes: int
    unmatched: dict[str, int]  # checker -> verdicts for no step of the traces (not shown)


def render_view(
    traces: Sequence[Trace],
    checkers: Mapping[str, Iterable[Verdict]],
    *,
    gold: Gold | None = None,
    rewards: Mapping[str, RewardLine] | None = None,
    on_failed_check: str = "no_reward",
    title: str = "stepgap view",
    page_size: int = DEFAULT_PAGE_SIZE,
    resamples: int = 2000,
) -> str:
    """The HTML page for segmented traces and their verdicts (see `view_data` for the inputs);
    `stepgap serve`'s `GET /view` and `write_view` both draw with it."""
    return render_html(
        view_data(
            traces,
            checkers,
            gold=gold,
            rewards=rewards,
            on_failed_check=on_failed_check,
            title=title,
            page_size=page_size,
            resamples=resamples,
        )
    )


# ------------------------------------------------------------------ files in, page out
def parse_named_files(specs: Sequence[str], flag: str = "--verdicts") -> dict[str, str]:
    """`NAME=FILE` or a bare `FILE` (named after its stem) -> {name: file}, in order."""
    files: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():
            name, path = Path(spec).stem, spec
        if not name or not path:
            raise ValueError(f"{flag} must look like FILE or NAME=FILE, got {spec!r}")
        if name in files:
            raise ValueError(f"{flag} name {name!r} given twice; name them NAME=FILE")
        files[name] = path
    return files


def load_verdicts(path: str | Path, report: ErrorReport | None = None) -> list[Verdict]:
    """A verdicts file; a step given twice is reported (file:line) and the first one kept, as
    `stepgap eval` does."""
    report = report if report is not None else ErrorReport()
    return read_steps_once(path, Verdict, report, "has a verdict already (line {line})")


def load_rewards(path: str | Path, report: ErrorReport | None = None) -> dict[str, RewardLine]:
    """A `stepgap reward` file by trace id; a trace given twice is reported, the first kept."""
    report = report if report is not None else ErrorReport()
    rewards: dict[str, RewardLine] = {}
    for line, r in read_models(path, RewardLine, report):
        if r.trace_id in rewards:
            report.add(path, line, f"trace {r.trace_id!r} has a reward already", "trace_id")
            continue
        rewards[r.trace_id] = r
    return rewards


def write_view(
    traces: str | Path,
    verdicts: Mapping[str, str | Path],
    output: str | Path,
    *,
    rewards: str | Path | None = None,
    on_failed_check: str = "no_reward",
    gold: str | Path | Sequence[str | Path] | None = None,
    title: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    resamples: int = 2000,
    report: ErrorReport | None = None,
) -> ViewResult:
    """Read traces, verdicts (name -> file), optional rewards and gold; write the HTML page.

    `stepgap view`. Bad lines of any file go to `report` (file:line: field: reason) and the
    rest is shown. A reward with a failed step check is shown as none, and why, unless
    `on_failed_check="zero"`. Open the written file in any browser; it needs no server or network.
    """
    from stepgap.segment import iter_traces

    report = report if report is not None else ErrorReport()
    loaded = list(iter_traces(traces, report))
    checkers = {name: load_verdicts(path, report) for name, path in verdicts.items()}
    gold_labels = None
    if gold is not None:
        gold_labels = load_gold([gold] if isinstance(gold, str | Path) else list(gold), report)
    reward_lines = load_rewards(rewards, report) if rewards is not None else None
    page = render_view(
        loaded,
        checkers,
        gold=gold_labels,
        rewards=reward_lines,
        on_failed_check=on_failed_check,
        title=title or f"stepgap view: {Path(traces).name}",
        page_size=page_size,
        resamples=resamples,
    )
    sources = [traces, *verdicts.values(), *([rewards] if rewards is not None else [])]
    out = write_text(output, page, *sources)
    keys = {(t.id, s.index) for t in loaded for s in t.steps or []}
    return ViewResult(
        path=out,
        traces=len(loaded),
        steps=len(keys),
        bytes=len(page.encode("utf-8")),
        unmatched={
            name: sum((v.trace_id, v.step) not in keys for v in vs) for name, vs in checkers.items()
        },
    )
