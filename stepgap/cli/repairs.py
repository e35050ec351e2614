"""`stepgap repairs`: traces and their verdicts -> step-level preference data from typed
repairs, in TRL's preference (DPO) and unpaired (KTO) formats (`data_builders/repairs.py`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from stepgap.cli import Command
from stepgap.cli.options import EXIT_NOTHING, ProgressOptions, RecordOptions, finish
from stepgap.data_builders.policies import PolicyConfig
from stepgap.data_builders.retrieval import RetrieverConfig
from stepgap.options import at_least_one, option


@dataclass(frozen=True, kw_only=True)
class RepairsArguments(RecordOptions, ProgressOptions):
    traces: str = option(help="traces (raw or segmented), those the verdicts label",
                         positional=True)  # fmt: skip
    verdicts: str = option(help="the traces' verdicts (`stepgap check` or `label`)", metavar="FILE")
    reward_config: str = option(
        help="the checker of the new steps, as a reward config file (the one that labelled "
        "the traces: `judge`, `nli` or `bundle`, and their options)",
        metavar="FILE",
    )
    output: str = option(
        help="folder: repairs.jsonl (appended to, rerun to resume), preference.jsonl and "
        "unpaired.jsonl (TRL's formats)",
        aliases=["-o"],
        metavar="DIR",
    )
    samples: int = option(4, "new versions of each trace's first gap step", metavar="K")
    topk: int = option(3, "documents per search")
    limit: int | None = option(None, "first N traces only", metavar="N")

    def __post_init__(self) -> None:
        for name in ("samples", "topk", "limit"):
            at_least_one(name, getattr(self, name))
        super().__post_init__()


def repairs(args: RepairsArguments, policy: PolicyConfig, retriever: RetrieverConfig) -> int:
    from stepgap.cli.options import checker
    from stepgap.data_builders.repairs import check_policy, repairs_dir
    from stepgap.io import ErrorReport, require_input
    from stepgap.serving.process_reward import reward_config

    for path in (args.traces, args.verdicts, args.reward_config):
        require_input(path)  # before the models load
    config, _ = reward_config(args.reward_config)
    report = ErrorReport()
    writer = policy.build()
    check_policy(writer)  # a policy whose prompts cannot be written: said before the checker
    judged_by = checker(config, progress=not args.no_progress)
    try:
        summary = repairs_dir(
            args.traces, args.verdicts, writer, retriever.build(), judged_by, args.output,
            samples=args.samples, topk=args.topk, limit=args.limit, report=report,
            progress=not args.no_progress,
        )  # fmt: skip
    finally:
        judged_by.close()
    print(f"stepgap repairs: {summary}", file=sys.stderr)
    code = finish(args, report, summary.pairs + summary.unpaired, f"rows to {args.output}")
    return EXIT_NOTHING if summary.failed and not summary.traces else code


COMMANDS = [
    Command(
        "repairs",
        "traces + verdicts -> step-level preference data from typed repairs (TRL's DPO and KTO)",
        (RepairsArguments, PolicyConfig, RetrieverConfig),
        repairs,
    ),
]
