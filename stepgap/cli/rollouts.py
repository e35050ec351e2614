"""`stepgap rollouts`: a QA set -> raw Search-R1-style traces from a policy and a retriever
(resumable), with typed feedback to the policy inside the rollout when asked
(`FeedbackArguments`, `stepgap.feedback`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from stepgap.cli import Command
from stepgap.cli.options import EXIT_NOTHING, ProgressOptions, RecordOptions, finish
from stepgap.data_builders.policies import PolicyConfig
from stepgap.data_builders.retrieval import RetrieverConfig
from stepgap.feedback import FeedbackSource
from stepgap.options import at_least_one, option


@dataclass(frozen=True, kw_only=True)
class RolloutsArguments(RecordOptions, ProgressOptions):
    qa: str = option(
        help="QA set: JSONL / JSON / Parquet file, datasets folder or hub id (Search-R1 parquet, "
        "FlashRAG, HotpotQA, 2Wiki and MuSiQue columns are understood)",
        positional=True,
    )
    output: str = option(help="raw traces (JSONL); appended to, rerun to resume", aliases=["-o"])
    n_per_question: int = option(1, "rollouts each", metavar="K")
    max_turns: int = option(4, "search turns (Search-R1: 4)", metavar="T")
    topk: int = option(3, "documents per search (Search-R1: 3)")
    format: Literal["search-r1", "hermes"] = option("search-r1", "the trace format")
    columns: str | None = option(
        None,
        "where the fields are: id=COL,question=COL,answers=COL,data_source=COL (dotted paths)",
        metavar="MAP",
    )
    split: str | None = option(None, "hub data set: split (default test, dev, validation, train)")
    subset: str | None = option(None, "hub data set: configuration name")
    exclude_ids: list[str] | None = option(
        None,
        "question ids to leave out (gold benchmark): one per line or JSONL with id",
        metavar="FILE",
    )
    limit: int | None = option(None, "first N questions only", metavar="N")
    wave_size: int = option(64, "rollouts advanced together")

    def __post_init__(self) -> None:
        for name in ("n_per_question", "max_turns", "topk", "limit", "wave_size"):
            at_least_one(name, getattr(self, name))
        super().__post_init__()


FEEDBACK_GROUP = "typed feedback (off by default)"


@dataclass(frozen=True, kw_only=True)
class FeedbackArguments:
    """Typed feedback to the policy inside the rollout (`stepgap.feedback`): each search result
    goes back with the note for its step when the step's verdict is ready in time."""

    feedback: Literal["none", "typed"] = option(
        "none", "typed: send each gap's note with its search result", group=FEEDBACK_GROUP
    )
    feedback_wait: float = option(
        0.0,
        "seconds a turn waits for its wave's verdicts, at most 600 (0: only those already in)",
        metavar="S",
        group=FEEDBACK_GROUP,
    )
    reward_config: str | None = option(
        None, "the notes' checker: a reward config file, checked here", metavar="FILE",
        group=FEEDBACK_GROUP,
    )  # fmt: skip
    reward_url: str | None = option(
        None, "the notes' checker: `stepgap serve` at URL (replicas: comma-separated)",
        metavar="URL", group=FEEDBACK_GROUP,
    )  # fmt: skip

    def __post_init__(self) -> None:
        if not 0 <= self.feedback_wait <= 600:
            raise ValueError(f"feedback_wait must be 0 to 600 s, got {self.feedback_wait}")
        if self.reward_config and self.reward_url:
            raise ValueError("give --reward-config or --reward-url, not both")
        if self.feedback == "none" and (self.reward_config or self.reward_url):
            raise ValueError(
                "--reward-config and --reward-url name the notes' checker: add --feedback typed"
            )
        if self.feedback == "typed" and not (self.reward_config or self.reward_url):
            raise ValueError(
                "--feedback typed needs the checker of the notes: --reward-config FILE or "
                "--reward-url URL"
            )

    def build(self) -> FeedbackSource | None:
        """The notes' checker, or None with feedback off."""
        if self.feedback == "none":
            return None
        from stepgap.serving.inline import inline_checker

        return inline_checker(url=self.reward_url, config=self.reward_config)


def rollouts(
    args: RolloutsArguments,
    policy: PolicyConfig,
    retriever: RetrieverConfig,
    feedback: FeedbackArguments,
) -> int:
    from stepgap.data_builders.rollouts import rollouts_file
    from stepgap.io import ErrorReport

    report = ErrorReport()
    source = feedback.build()
    summary = rollouts_file(
        args.qa,
        policy.build(),
        retriever.build(),
        args.output,
        columns=args.columns,
        split=args.split,
        subset=args.subset,
        exclude_ids=args.exclude_ids or [],
        report=report,
        retriever_name=retriever.retriever,
        fmt=args.format,
        n_per_question=args.n_per_question,
        max_turns=args.max_turns,
        topk=args.topk,
        wave_size=args.wave_size,
        limit=args.limit,
        progress=not args.no_progress,
        feedback=source,
        feedback_wait=feedback.feedback_wait,
    )
    print(f"stepgap rollouts: {summary.questions} question(s); {summary}", file=sys.stderr)
    code = finish(args, report, summary.traces, f"new traces to {args.output}")
    return EXIT_NOTHING if summary.failed and not summary.traces else code


COMMANDS = [
    Command(
        "rollouts",
        "QA set -> Search-R1-style raw traces from a policy and a retriever (resumable)",
        (RolloutsArguments, PolicyConfig, RetrieverConfig, FeedbackArguments),
        rollouts,
    ),
]
