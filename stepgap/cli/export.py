"""Commands of the export: `export` (the offline bundle) and `push` (bundle + model card to the
Hugging Face Hub)."""

from __future__ import annotations

import argparse
import json
import sys

from stepgap.cli import Command
from stepgap.cli.options import add_tree_options, tree_config


def export(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from stepgap.export.bundle import export_bundle

    out = export_bundle(
        args.student,
        args.nli,
        args.output,
        base=args.base,
        merge=args.merge,
        dtype=args.dtype,
        nli_quantize=args.nli_quantize,
        nli_fp16=args.nli_fp16,
        probe_verdicts=args.probe_verdicts,
        parity_floor=args.parity_floor,
        tree=asdict(tree_config(args)),
        eval_report=args.eval_report,
        eval_checker=args.eval_checker,
        overwrite=args.overwrite,
        base_revision=args.base_revision,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    print(json.dumps({"bundle": str(out), "nli_parity": manifest["nli"]["parity"]}, indent=2))
    return 0


def export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--student", required=True, metavar="PATH", help="trained adapter or merged")
    p.add_argument("--base", metavar="ID_OR_PATH", help="the adapter's base (default: its config)")
    p.add_argument(
        "--base-revision",
        metavar="COMMIT",
        help="a hub base's commit (default: the one in the local cache); local bases are copied in",
    )
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
    p.add_argument(
        "--eval-checker",
        metavar="NAME",
        help="the report's row that measured this student (needed when it has several)",
    )
    add_tree_options(p, exclude=("ablate",))
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle")


def push(args: argparse.Namespace) -> int:
    from stepgap.export.push import push_bundle

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


def push_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="folder written by stepgap export")
    p.add_argument("--repo-id", required=True, metavar="USER/NAME")
    p.add_argument("--private", action="store_true", help="create a private repo")
    p.add_argument("--revision", metavar="BRANCH", help="push to this branch (created if needed)")
    p.add_argument("--dry-run", action="store_true", help="list the files and print the card")


COMMANDS = [
    Command(
        "export",
        "one offline bundle: student (merged or adapter) + ONNX NLI + checksummed manifest",
        export_arguments,
        export,
    ),
    Command(
        "push", "upload a bundle and its model card to the Hugging Face Hub", push_arguments, push
    ),
]
