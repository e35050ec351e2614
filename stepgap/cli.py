"""The `stepgap` command line: one subcommand per stage of the life cycle.

Each subcommand is a thin wrapper over the library; heavy imports happen inside the command so
`stepgap --help` stays instant. Records that cannot be read are reported (file, line, field) on
stderr, optionally to `--errors FILE`, and never stop the rest of the file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from stepgap import __version__
from stepgap.export.bundle import BundleError
from stepgap.export.onnx_nli import ExportError
from stepgap.redact import install_redaction, redact
from stepgap.teacher.judges.base import JudgeConfigError


def _finish(report, errors_path: str | None, done: int, what: str) -> int:
    """Print the error report; exit 1 when nothing at all could be processed."""
    if report:
        print(f"stepgap: skipped {len(report)} bad record(s):\n{report.summary()}", file=sys.stderr)
        if errors_path:
            report.write(errors_path)
    print(f"stepgap: wrote {done} {what}", file=sys.stderr)
    return 0 if done or not report else 1


def _tree_config(args: argparse.Namespace):
    from stepgap.teacher.tree import TreeConfig

    return TreeConfig(
        ablate=getattr(args, "ablate", None),
        entail_threshold=args.entail_threshold,
        contradict_threshold=args.contradict_threshold,
        hypothesis=getattr(args, "hypothesis", "answer_statement"),
    )


def _add_tree_options(p) -> None:
    p.add_argument("--ablate", choices=["A", "E"], help="remove a stage (SPEC section 3)")
    p.add_argument("--entail-threshold", type=float, default=0.5, metavar="X")
    p.add_argument("--contradict-threshold", type=float, default=0.5, metavar="X")


# --------------------------------------------------------------------------- segment
def _segment(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, iter_traces

    report = ErrorReport()
    n = 0
    with JsonlWriter(args.output) as out:
        for trace in iter_traces(args.input, report):
            out.write(trace)
            n += 1
    return _finish(report, args.errors, n, f"segmented traces to {args.output}")


def _segment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces: JSONL, JSON array, Parquet or a datasets folder")
    p.add_argument("-o", "--output", required=True, help="segmented traces (JSONL)")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")


# --------------------------------------------------------------------------- judges
def _add_judge_options(
    p: argparse.ArgumentParser, required: bool = True, spec: bool | None = None
) -> None:
    g = p.add_argument_group("judge (stages A-C)")
    if spec if spec is not None else required:  # `baseline` declares its own optional --judge
        g.add_argument(
            "--judge",
            required=required,
            metavar="SPEC",
            help="openai:MODEL (any OpenAI-compatible server), hf:PATH_OR_ID (local causal LM, "
            "also a .gguf file), student:PATH (trained adapter or merged student) or replay:FILE",
        )
    g.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    g.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="NAME",
        help="environment variable holding the API key (keys are never read from the command line)",
    )
    g.add_argument("--concurrency", type=int, default=8, help="judge requests in flight")
    g.add_argument("--max-retries", type=int, default=6, help="API retries (backoff, Retry-After)")
    g.add_argument("--timeout", type=float, default=120.0, help="seconds per API request")
    g.add_argument(
        "--invalid-retries",
        type=int,
        default=2,
        help="re-asks after a refusal, a truncated answer or schema-violating JSON",
    )
    g.add_argument("--max-tokens", type=int, default=None, help="judge answer token budget")
    g.add_argument(
        "--no-logprobs", action="store_true", help="do not request token log-probabilities"
    )
    g.add_argument("--judge-device", default=None, help="hf judge device (default auto)")
    g.add_argument("--judge-dtype", default=None, help="hf judge dtype (float32, bfloat16, ...)")
    g.add_argument("--judge-batch-size", type=int, default=8, help="hf judge generation batch")
    g.add_argument(
        "--max-string-chars",
        type=int,
        default=None,
        help="hf judge: cap every free-text field at this many characters",
    )
    g.add_argument(
        "--unconstrained", action="store_true", help="hf judge: no schema-constrained decoding"
    )
    g.add_argument(
        "--student-base",
        metavar="ID_OR_PATH",
        help="student judge: base model of the adapter (default: the one in adapter_config.json)",
    )
    g.add_argument(
        "--cache",
        metavar="PATH",
        default=None,
        help="judge answer cache (SQLite; default $STEPGAP_CACHE or ~/.cache/stepgap/)",
    )
    g.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    g.add_argument(
        "--prices", metavar="FILE", help="price table JSON {model: {input, cached_input, output}}"
    )


def _build_judge(args: argparse.Namespace):
    from stepgap.teacher.judges import PRICES, CostMeter, JudgeCache, default_cache_path, load_judge

    prices = dict(PRICES)
    if args.prices:
        from stepgap.teacher.judges.cost import load_prices

        prices.update(load_prices(args.prices))
    kind, _, model = args.judge.partition(":")
    use_cache = kind != "replay" and not args.no_cache  # replay answers are already on disk
    cache = JudgeCache(args.cache or default_cache_path()) if use_cache else None
    return load_judge(
        args.judge,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        concurrency=args.concurrency,
        max_retries=args.max_retries,
        timeout=args.timeout,
        invalid_retries=args.invalid_retries,
        max_tokens=args.max_tokens,
        max_new_tokens=args.max_tokens,
        logprobs=not args.no_logprobs,
        device=args.judge_device,
        dtype=args.judge_dtype,
        batch_size=args.judge_batch_size,
        max_string_chars=args.max_string_chars,
        constrained=not args.unconstrained,
        base=args.student_base,
        cache=cache,
        meter=CostMeter(model=model, prices=prices),
    )


def _add_nli_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("NLI (stages D-E) and the tree")
    g.add_argument(
        "--nli",
        required=required,
        metavar="SPEC",
        help="replay:FILE, hf:ID_OR_PATH, onnx:EXPORTED_FOLDER or a hub id/path",
    )
    g.add_argument("--device", default=None, help="NLI device (cpu, cuda, cuda:1; default auto)")
    g.add_argument(
        "--hypothesis",
        choices=["answer_statement", "answer", "claim"],
        default="answer_statement",
        help="NLI hypothesis of a conclusion step",
    )
    _add_tree_options(g)


def _add_checker_options(p: argparse.ArgumentParser) -> None:
    """A checker from --judge and --nli, or the offline one from --bundle."""
    p.add_argument(
        "--bundle",
        metavar="DIR",
        help="offline checker exported by `stepgap export` (no --judge/--nli, no API key)",
    )
    p.add_argument(
        "--nli-precision", choices=["fp32", "int8", "fp16"], help="--bundle: which ONNX graph"
    )
    _add_judge_options(p, required=False, spec=True)
    _add_nli_options(p, required=False)


def _build_checker(args: argparse.Namespace):
    from stepgap.teacher import Checker, load_nli

    if getattr(args, "bundle", None):
        from stepgap.serving.offline import OfflineChecker

        if args.judge or args.nli:
            raise ValueError("--bundle brings its own judge and NLI model; drop --judge/--nli")
        return OfflineChecker.from_bundle(
            args.bundle,
            nli_precision=args.nli_precision,
            device=args.judge_device,
            dtype=args.judge_dtype,
            batch_size=args.judge_batch_size,
            max_new_tokens=args.max_tokens or 768,
        )
    if not args.judge or not args.nli:
        raise ValueError("give --judge and --nli, or --bundle")
    return Checker(_build_judge(args), load_nli(args.nli, device=args.device), _tree_config(args))


# --------------------------------------------------------------------------- check
def _check(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, iter_traces

    report = ErrorReport()
    checker = _build_checker(args)
    traces = list(iter_traces(args.input, report))
    n = 0
    with JsonlWriter(args.output) as out:
        for start in range(0, len(traces), args.batch_size):
            for verdicts in checker.check(traces[start : start + args.batch_size]):
                for v in verdicts:
                    out.write(v)
                    n += 1
    return _finish(report, args.errors, n, f"verdicts to {args.output}")


def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument("-o", "--output", required=True, help="verdicts (JSONL), overwritten")
    p.add_argument("--batch-size", type=int, default=64, help="traces per judge+NLI batch")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    _add_checker_options(p)


# --------------------------------------------------------------------------- label
def _label(args: argparse.Namespace) -> int:
    import json

    from stepgap.data_builders import ErrorReport
    from stepgap.teacher.label import label_file, parse_shard

    shard = parse_shard(args.shard)
    report = ErrorReport()
    checker = _build_checker(args)
    summary = label_file(
        args.input,
        checker,
        args.output,
        report,
        shard=shard,
        limit=args.limit,
        batch_size=args.batch_size,
        fsync=args.fsync,
        progress=not args.no_progress,
    )
    meter = getattr(checker.judge, "meter", None)
    if meter is not None:
        print(f"stepgap: {meter.summary()}", file=sys.stderr)
    print(
        f"stepgap: {summary.traces} trace(s) in shard {args.shard}, {summary.skipped_traces} "
        f"already done; {summary.errors} verdict(s) carry an error",
        file=sys.stderr,
    )
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as fh:
            json.dump({**vars(summary), "cost": meter.as_dict() if meter else None}, fh, indent=2)
    return _finish(report, args.errors, summary.verdicts, f"new verdicts to {args.output}")


def _label_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument(
        "-o", "--output", required=True, help="verdicts (JSONL); appended to, rerun to resume"
    )
    p.add_argument("--shard", default="0/1", metavar="I/N", help="label only shard I of N")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="at most N traces")
    p.add_argument("--batch-size", type=int, default=16, help="traces per judge+NLI batch")
    p.add_argument("--fsync", action="store_true", help="fsync after every verdict")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--summary", metavar="FILE", help="write counts and cost as JSON")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    _add_judge_options(p)
    _add_nli_options(p)


# --------------------------------------------------------------------------- relabel
def _relabel(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, Verdict, read_models
    from stepgap.teacher import relabel

    report = ErrorReport()
    verdicts = [v for _, v in read_models(args.input, Verdict, report)]
    n = 0
    with JsonlWriter(args.output) as out:
        for v in relabel(verdicts, _tree_config(args)):
            out.write(v)
            n += 1
    return _finish(report, args.errors, n, f"relabelled verdicts to {args.output}")


def _relabel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="verdicts written by `stepgap check` or `stepgap label`")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    _add_tree_options(p)


# --------------------------------------------------------------------------- baseline
def _baseline(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, iter_traces
    from stepgap.eval import baselines

    report = ErrorReport()
    traces = list(iter_traces(args.input, report))
    if args.kind == "flag-everything":
        verdicts = baselines.flag_everything(traces)
    else:
        if not args.nli:
            raise ValueError(f"baseline {args.kind} needs --nli SPEC")
        from stepgap.teacher import load_nli

        nli = load_nli(args.nli, device=args.device)
        if args.kind == "nli-only":
            verdicts = baselines.nli_only(
                traces,
                nli,
                entail_threshold=args.entail_threshold,
                contradict_threshold=args.contradict_threshold,
            )
        else:
            if not args.judge:
                raise ValueError("baseline ner-quote needs --judge SPEC for stages A and B")
            verdicts = baselines.ner_quote(traces, _build_judge(args), nli, _tree_config(args))
    n = 0
    with JsonlWriter(args.output) as out:
        for v in verdicts:
            out.write(v)
            n += 1
    return _finish(report, args.errors, n, f"{args.kind} verdicts to {args.output}")


def _baseline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "kind",
        choices=["nli-only", "ner-quote", "flag-everything"],
        help="nli-only: NLI on (all evidence, claim); ner-quote: spaCy NER + token overlap "
        "instead of stage C; flag-everything: every step a gap",
    )
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument("-o", "--output", required=True, help="verdicts (JSONL)")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    p.add_argument("--judge", metavar="SPEC", help="ner-quote: judge for stages A and B")
    p.add_argument("--nli", metavar="SPEC", help="nli-only, ner-quote: NLI model")
    p.add_argument("--device", default=None, help="NLI device")
    p.add_argument(
        "--hypothesis",
        choices=["answer_statement", "answer", "claim"],
        default="answer_statement",
    )
    _add_tree_options(p)
    _add_judge_options(p, required=False)


# --------------------------------------------------------------------------- eval
def _eval(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from stepgap.data_builders import ErrorReport
    from stepgap.eval.markdown import render_markdown
    from stepgap.eval.report import build_report, load_gold, load_predictions

    report = ErrorReport()
    gold = load_gold(args.gold, report)
    checkers = {}
    for spec in args.pred:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--pred must look like NAME=FILE, got {spec!r}")
        if name in checkers:
            raise ValueError(f"--pred name {name!r} given twice")
        checkers[name] = load_predictions(path, report)
    result = build_report(
        gold, checkers, resamples=args.resamples, seed=args.seed, unit=args.unit, silver=args.silver
    )
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(result), encoding="utf-8")
    written = ["report.json", "report.md"]
    if not args.no_plots:
        from stepgap.eval.plots import write_plots

        written += [p.name for p in write_plots(result, out)]
    for name, c in result["checkers"].items():
        if c["missing_steps"] or c["error_steps"]:
            print(
                f"stepgap: {name}: {c['missing_steps']} gold step(s) missing from the "
                f"predictions, {c['error_steps']} with a failed check; not scored",
                file=sys.stderr,
            )
    return _finish(report, args.errors, len(written), f"files to {out}: {', '.join(written)}")


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gold",
        required=True,
        action="append",
        metavar="FILE",
        help="gold step labels and trace correctness (one file or two; repeatable)",
    )
    p.add_argument(
        "--pred",
        required=True,
        action="append",
        metavar="NAME=FILE",
        help="a checker's verdicts (repeatable)",
    )
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="report folder")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--unit", choices=["step", "trace"], default="step", help="bootstrap unit")
    p.add_argument("--silver", metavar="NAME", help="a --pred checker to use as silver reference")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")


# --------------------------------------------------------------------------- reward
def _reward(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport, JsonlWriter, Verdict, iter_traces, read_models
    from stepgap.serving.reward import compute_reward

    report = ErrorReport()
    by_trace: dict[str, list] = {}
    for _, v in read_models(args.verdicts, Verdict, report):
        by_trace.setdefault(v.trace_id, []).append(v)
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        from stepgap.models import check_model_ref

        tokenizer = AutoTokenizer.from_pretrained(check_model_ref(args.tokenizer))
    n = 0
    with JsonlWriter(args.output) as out:
        for trace in iter_traces(args.input, report):
            try:
                result = compute_reward(
                    trace,
                    by_trace.get(trace.id, []),
                    variant=args.variant,
                    lam=args.lam,
                    tokenizer=tokenizer,
                )
            except ValueError as exc:
                report.add(args.verdicts, 0, str(exc), field="step")
                continue
            out.write(result.as_dict())
            n += 1
    return _finish(report, args.errors, n, f"rewards to {args.output}")


def _add_reward_options(p) -> None:
    from stepgap.serving.reward import VARIANTS

    p.add_argument("--variant", choices=VARIANTS, default="typed_shape", help="SPEC section 4")
    p.add_argument("--lam", type=float, default=1.0, help="weight of the step rewards")


def _reward_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument("--verdicts", required=True, help="verdicts for those traces")
    p.add_argument("-o", "--output", required=True, help="one reward line per trace (JSONL)")
    p.add_argument("--tokenizer", help="hub id or path: adds token spans (the dense form)")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    _add_reward_options(p)


# --------------------------------------------------------------------------- serve
def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from stepgap.serving.reward import StepGapReward
    from stepgap.serving.server import create_app

    app = create_app(
        StepGapReward(_build_checker(args), args.variant, args.lam),
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_mb * 1024 * 1024,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=30)
    return 0


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=32, help="traces per checker call")
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="wait this long to fill a batch")
    p.add_argument("--max-queue", type=int, default=1024, help="queued traces before 503")
    p.add_argument("--max-body-mb", type=int, default=8, help="largest request body (MB)")
    _add_reward_options(p)
    _add_checker_options(p)


# --------------------------------------------------------------------------- student
def _read_verdicts(path: str, report) -> list:
    from stepgap.data_builders.io import read_models
    from stepgap.data_builders.schema import Verdict

    return [v for _, v in read_models(path, Verdict, report)]


def _sft_data(args: argparse.Namespace) -> int:
    from stepgap.data_builders import ErrorReport
    from stepgap.data_builders.sft import SFTStats, build_sft_dataset, read_ids, save_sft_dataset

    report = ErrorReport()
    verdicts = [v for path in args.verdicts for v in _read_verdicts(path, report)]
    exclude = set().union(*(read_ids(p) for p in args.exclude_ids or []))
    stats = SFTStats()
    nli = None
    if args.nli_features:
        from stepgap.teacher import load_nli

        nli = load_nli(args.nli_features, device=args.device)
    data = build_sft_dataset(
        verdicts,
        eval_fraction=args.eval_fraction,
        seed=args.seed,
        exclude_ids=exclude,
        stats=stats,
        nli=nli,
    )
    save_sft_dataset(
        data,
        args.output,
        nli_features=nli is not None,
        nli_model=args.nli_features,
        eval_fraction=args.eval_fraction,
        seed=args.seed,
        stats=stats.__dict__,
    )
    if args.push_to_hub:
        data.push_to_hub(args.push_to_hub, private=args.private)
    sizes = ", ".join(f"{k}: {len(v)}" for k, v in data.items())
    print(f"stepgap sft-data: {sizes}; {stats}", file=sys.stderr)
    return _finish(report, args.errors, stats.examples, f"SFT examples to {args.output}")


def _sft_data_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--push-to-hub", metavar="REPO_ID", help="also push the data set to the Hub")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: a private repo")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")


def _train(args: argparse.Namespace) -> int:
    from stepgap.student.train import run

    return run(args)


def _train_args(p: argparse.ArgumentParser) -> None:
    from stepgap.student.train import add_arguments

    add_arguments(p)


def _student_judge(args: argparse.Namespace, path: str):
    from stepgap.teacher.judges import load_judge

    return load_judge(
        f"student:{path}",
        base=args.student_base,
        device=args.judge_device,
        dtype=args.judge_dtype,
        batch_size=args.judge_batch_size,
        max_new_tokens=args.max_tokens,
    )


def _mine(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict
    from pathlib import Path

    from stepgap.data_builders import ErrorReport
    from stepgap.student.mine import Agreement, ShortCircuit, compare, mine, write_mined

    report = ErrorReport()
    pool = _read_verdicts(args.pool, report)
    gold = None
    if args.gold:
        from stepgap.eval.report import load_gold

        gold = load_gold(args.gold, report).steps
    nli = None
    if args.nli:
        from stepgap.teacher import load_nli

        nli = load_nli(args.nli, device=args.device)
    student = _student_judge(args, args.student)
    comparisons = compare(student, pool, nli)
    result = mine(comparisons, gold, held_out_fraction=args.held_out_fraction, seed=args.seed)
    out = write_mined(result, pool, args.output, nli if student.nli_features else None)
    summary = result.summary()
    if args.augment_config and result.train:
        from stepgap.student.mine import augment

        adapter = augment(
            args.augment_config,
            args.student,
            out,
            max_steps=args.augment_steps,
            learning_rate=args.augment_lr,
            overrides=args.set,
        )
        after = compare(_student_judge(args, str(adapter)), pool, nli)
        summary["augmented_adapter"] = str(adapter)
        summary["short_circuit_after"] = asdict(ShortCircuit.of(after))
        summary["agreement_after"] = asdict(Agreement.of(after))
    (Path(out) / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(summary, indent=2))
    return _finish(report, args.errors, len(result.mined), f"hard negatives to {out}")


def _mine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("pool", help="teacher verdicts of the labeled pool (JSONL)")
    p.add_argument("--student", required=True, metavar="PATH", help="trained adapter or merged")
    p.add_argument("-o", "--output", required=True, help="folder for the mined steps")
    p.add_argument("--gold", nargs="+", help="gold labels: keep steps the paper's way")
    p.add_argument("--held-out-fraction", type=float, default=0.5, help="by trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--augment-config",
        metavar="YAML",
        help="continue training the adapter on the mined half with this recipe, then re-measure",
    )
    p.add_argument("--augment-steps", type=int, default=200, help="augmentation optimiser steps")
    p.add_argument("--augment-lr", type=float, default=5e-7, help="augmentation learning rate")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe key")
    g = p.add_argument_group("student judge")
    g.add_argument("--student-base", metavar="ID_OR_PATH", help="base of the adapter")
    g.add_argument("--nli", metavar="SPEC", help="NLI model for a student trained with features")
    g.add_argument("--device", default=None, help="device of the --nli model")
    g.add_argument("--judge-device", default=None, help="device (default auto)")
    g.add_argument("--judge-dtype", default=None, help="dtype (float32, bfloat16, ...)")
    g.add_argument("--judge-batch-size", type=int, default=8, help="generation batch")
    g.add_argument("--max-tokens", type=int, default=None, help="answer token budget")
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")


# --------------------------------------------------------------------------- export, push
def _export(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from stepgap.export.bundle import eval_summary, export_bundle

    probe = []
    if args.probe_verdicts:
        from stepgap.data_builders import ErrorReport

        for v in _read_verdicts(args.probe_verdicts, ErrorReport()):
            probe.extend((c.premise, c.hypothesis) for c in [*v.nli, *v.nli_extra])
    out = export_bundle(
        args.student,
        args.nli,
        args.output,
        base=args.base,
        merge=args.merge,
        dtype=args.dtype,
        nli_quantize=args.nli_quantize,
        nli_fp16=args.nli_fp16,
        probe=probe,
        parity_floor=args.parity_floor,
        tree=asdict(_tree_config(args)),
        eval_summary=eval_summary(args.eval_report, args.eval_checker)
        if args.eval_report
        else None,
        overwrite=args.overwrite,
    )
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    print(json.dumps({"bundle": str(out), "nli_parity": manifest["nli"]["parity"]}, indent=2))
    return 0


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--student", required=True, metavar="PATH", help="trained adapter or merged")
    p.add_argument("--base", metavar="ID_OR_PATH", help="the adapter's base (default: its config)")
    p.add_argument("--nli", required=True, metavar="ID_OR_PATH", help="NLI cross-encoder")
    p.add_argument("-o", "--output", required=True, metavar="BUNDLE", help="bundle folder")
    p.add_argument("--merge", action="store_true", help="merge the LoRA into the base weights")
    p.add_argument("--dtype", help="merged weights dtype (float32, bfloat16; default float32)")
    p.add_argument("--nli-quantize", choices=["int8"], help="add a dynamic int8 graph (CPU)")
    p.add_argument("--nli-fp16", action="store_true", help="add an fp16 graph (GPU)")
    p.add_argument(
        "--parity-floor",
        type=float,
        default=0.99,
        help="least label agreement of int8/fp16 with fp32 on the probe set",
    )
    p.add_argument(
        "--probe-verdicts",
        metavar="FILE",
        help="verdicts whose NLI pairs join the parity probe set",
    )
    p.add_argument("--eval-report", metavar="JSON", help="stepgap eval report.json for the card")
    p.add_argument("--eval-checker", metavar="NAME", help="which checker of the report")
    p.add_argument("--hypothesis", choices=["answer_statement", "answer", "claim"],
                   default="answer_statement", help="NLI hypothesis of a conclusion step")  # fmt: skip
    p.add_argument("--entail-threshold", type=float, default=0.5, metavar="X")
    p.add_argument("--contradict-threshold", type=float, default=0.5, metavar="X")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle")


def _push(args: argparse.Namespace) -> int:
    from stepgap.export.hub import push_bundle

    plan = push_bundle(
        args.bundle,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        dry_run=args.dry_run,
    )
    verb = "would upload" if args.dry_run else "uploaded"
    print(f"stepgap push: {verb} {len(plan.files)} files to {args.repo_id}:", file=sys.stderr)
    for f in plan.files:
        print(f)
    if args.dry_run:
        print("\n----- README.md (model card) -----\n" + plan.card)
    return 0


def _push_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="folder written by stepgap export")
    p.add_argument("--repo-id", required=True, metavar="USER/NAME")
    p.add_argument("--private", action="store_true", help="create a private repo")
    p.add_argument("--revision", metavar="BRANCH", help="push to this branch (created if needed)")
    p.add_argument("--dry-run", action="store_true", help="list the files and print the card")


# name -> (help, add arguments, run); later issues add label, reward, eval, train, ...
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[..., int]]] = {
    "segment": ("split raw responses into steps (SPEC section 2)", _segment_args, _segment),
    "check": ("label every step of traces with a typed gap verdict", _check_args, _check),
    "label": (
        "label traces at scale: concurrent judge, cache, cost, --shard, resume after a crash",
        _label_args,
        _label,
    ),
    "baseline": (
        "run a baseline checker: nli-only, ner-quote or flag-everything",
        _baseline_args,
        _baseline,
    ),
    "eval": (
        "score checkers against gold labels: report.json, report.md and PNG plots",
        _eval_args,
        _eval,
    ),
    "reward": (
        "typed GRPO rewards (SPEC section 4) for stored traces and verdicts",
        _reward_args,
        _reward,
    ),
    "serve": (
        "serve /check, /reward and OpenRLHF's /get_reward with micro-batching",
        _serve_args,
        _serve,
    ),
    "relabel": (
        "re-decide stored verdicts (ablation, thresholds) without calling a model",
        _relabel_args,
        _relabel,
    ),
    "sft-data": (
        "teacher verdicts -> path-supervised chat SFT data set, split by trace",
        _sft_data_args,
        _sft_data,
    ),
    "train": ("train the student (LoRA/QLoRA SFT): same as student/train.py", _train_args, _train),
    "mine": (
        "hard negatives where the student parts from the teacher; optional augmentation run",
        _mine_args,
        _mine,
    ),
    "export": (
        "one offline bundle: student (merged or adapter) + ONNX NLI + checksummed manifest",
        _export_args,
        _export,
    ),
    "push": ("upload a bundle and its model card to the Hugging Face Hub", _push_args, _push),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepgap",
        description="Step-level evidence-gap checking (CC / IE / MB) for search agents.",
    )
    parser.add_argument("--version", action="version", version=f"stepgap {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, configure, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(levelname)s %(name)s: %(message)s",
    )
    install_redaction()
    try:
        return int(args._run(args) or 0)
    except (
        FileNotFoundError,
        FileExistsError,
        ValueError,
        JudgeConfigError,
        BundleError,
        ExportError,
    ) as exc:
        print(f"stepgap {args.command}: error: {redact(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
