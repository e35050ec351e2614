"""Flags that several commands share, declared once: the judge, the NLI model, the tree, the
reward, the error report; and the few helpers that turn them into library arguments."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def finish(report: Any, errors_path: str | None, done: int, what: str) -> int:
    """Print the error report; exit 1 when nothing at all could be processed."""
    if report:
        print(f"stepgap: skipped {len(report)} bad record(s):\n{report.summary()}", file=sys.stderr)
        if errors_path:
            report.write(errors_path)
    print(f"stepgap: wrote {done} {what}", file=sys.stderr)
    return 0 if done or not report else 1


def add_errors_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")


def add_tree_options(p: Any, *, exclude: tuple[str, ...] = (), recorded: bool = False) -> None:
    """One flag per `TreeConfig` field, with its default, choices and help. `recorded`: no
    defaults (`relabel` starts from the config each verdict recorded, overriding what is given)."""
    import dataclasses

    from stepgap.teacher.tree import TreeConfig

    for f in dataclasses.fields(TreeConfig):
        if f.name in exclude:
            continue
        meta = dict(f.metadata)
        kwargs: dict[str, Any] = {"help": meta["help"]}
        if "choices" in meta:
            kwargs["choices"] = meta["choices"]
        else:
            kwargs.update(type=type(f.default), metavar="X")
        if recorded:
            kwargs["help"] += " (default: as the verdicts recorded)"
        else:
            kwargs["default"] = f.default
        p.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def tree_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `TreeConfig` fields given on the command line (those with a value)."""
    import dataclasses

    from stepgap.teacher.tree import TreeConfig

    names = (f.name for f in dataclasses.fields(TreeConfig))
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def tree_config(args: argparse.Namespace):
    from stepgap.teacher.tree import TreeConfig

    return TreeConfig(**tree_overrides(args))


def add_judge_options(
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
    g.add_argument(
        "--response-format",
        choices=["auto", "json_schema", "json_object", "none"],
        default="auto",
        help="openai judge: how to ask for JSON. json_schema (strict; OpenAI, vLLM, SGLang, "
        "llama.cpp), json_object with the schema (llama-cpp-python, Ollama), none (schema in the "
        "prompt); auto tries them in that order until the server takes one",
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


def judge_options(args: argparse.Namespace) -> dict[str, Any]:
    """The judge flags as keyword arguments of `stepgap.teacher.build_judge`."""
    return {
        "base_url": args.base_url,
        "api_key_env": args.api_key_env,
        "response_format": args.response_format,
        "concurrency": args.concurrency,
        "max_retries": args.max_retries,
        "timeout": args.timeout,
        "invalid_retries": args.invalid_retries,
        "max_tokens": args.max_tokens,
        "logprobs": not args.no_logprobs,
        "device": args.judge_device,
        "dtype": args.judge_dtype,
        "batch_size": args.judge_batch_size,
        "max_string_chars": args.max_string_chars,
        "constrained": not args.unconstrained,
        "base": args.student_base,
        "cache": False if args.no_cache else args.cache,
        "prices": args.prices,
    }


def add_nli_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("NLI (stages D-E) and the tree")
    g.add_argument(
        "--nli",
        required=required,
        metavar="SPEC",
        help="replay:FILE, hf:ID_OR_PATH, onnx:EXPORTED_FOLDER or a hub id/path",
    )
    g.add_argument("--device", default=None, help="NLI device (cpu, cuda, cuda:1; default auto)")
    add_tree_options(g)


def add_checker_options(p: argparse.ArgumentParser) -> None:
    """A checker from --judge and --nli, or the offline one from --bundle."""
    p.add_argument(
        "--bundle",
        metavar="DIR",
        help="offline checker exported by `stepgap export` (no --judge/--nli, no API key)",
    )
    p.add_argument(
        "--nli-precision", choices=["fp32", "int8", "fp16"], help="--bundle: which ONNX graph"
    )
    p.add_argument(
        "--nli-provider",
        action="append",
        metavar="NAME[:KEY=VALUE...]",
        help="--bundle: ONNX Runtime execution provider(s) of the NLI model in order of "
        "preference, repeated or a comma list, with provider options after the name, e.g. "
        "CUDAExecutionProvider:device_id=1,CPUExecutionProvider (default: CUDA if available, "
        "then CPU); the bundle's parity probe is re-run on them at load",
    )
    add_judge_options(p, required=False, spec=True)
    add_nli_options(p, required=False)


def checker(args: argparse.Namespace):
    """The checker the flags describe (`stepgap.teacher.build_checker`)."""
    from stepgap.teacher import build_checker
    from stepgap.teacher.nli.onnx import parse_providers

    return build_checker(
        args.judge,
        args.nli,
        bundle=getattr(args, "bundle", None),
        nli_precision=getattr(args, "nli_precision", None),
        nli_providers=parse_providers(getattr(args, "nli_provider", None)),
        tree=tree_config(args),
        device=args.device,
        judge_options=judge_options(args),
    )


def add_reward_options(p: argparse.ArgumentParser) -> None:
    from stepgap.reward import VARIANTS

    p.add_argument("--variant", choices=VARIANTS, default="typed_shape", help="docs/contract.md")
    p.add_argument("--lam", type=float, default=1.0, help="weight of the step rewards")


def reward_config(path: str | Path) -> argparse.Namespace:
    """The checker and reward flags of `stepgap serve`, set from a JSON file instead of the
    command line (`STEPGAP_REWARD_CONFIG`, veRL's `reward_kwargs.config`), so a reward worker
    takes every judge option `stepgap check` takes, with the same defaults. Keys are the flags'
    names (`base_url` or `base-url`); an unknown key, a value the flag would refuse or a file that
    is not a JSON object is a ValueError naming the file, the line and the key."""
    from .config import apply_values

    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of flag names to values")
    p = argparse.ArgumentParser(add_help=False)
    add_reward_options(p)
    add_checker_options(p)
    apply_values(p, data, path, text, "a reward configuration has no such key")
    return p.parse_args([])
