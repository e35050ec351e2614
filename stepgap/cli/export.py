"""Commands of the export: `export` (the offline bundle) and `push` (bundle + model card to the
Hugging Face Hub)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Literal

from stepgap.cli import Command
from stepgap.options import option
from stepgap.tree import TreeConfig


@dataclass(frozen=True, kw_only=True)
class ExportArguments:
    student: str = option(
        help="trained adapter or merged, or a PRM (its folder has stepgap_prm.json)", metavar="PATH"
    )
    base: str | None = option(
        None, "the adapter's base (default: its config)", metavar="ID_OR_PATH"
    )
    base_revision: str | None = option(
        None,
        "a hub base's commit (default: the one in the local cache); local bases are copied in",
        metavar="COMMIT",
    )
    nli: str | None = option(None, "NLI cross-encoder (not for a PRM)", metavar="ID_OR_PATH")
    output: str = option(help="bundle folder", metavar="BUNDLE", aliases=["-o"])
    merge: bool = option(False, "merge the LoRA into the base weights")
    dtype: str | None = option(None, "merged weights dtype (float32, bfloat16; default float32)")
    nli_quantize: Literal["int8"] | None = option(None, "add a dynamic int8 graph (CPU)")
    nli_fp16: bool = option(False, "add an fp16 graph (GPU)")
    prm_quantize: Literal["int8"] | None = option(
        None, "a PRM: add a dynamic int8 graph (CPU), which the bundle then serves by default"
    )
    parity_floor: float = option(
        0.99, "least label agreement of int8/fp16 with fp32 on the probe set"
    )
    probe_verdicts: str | None = option(
        None,
        "verdicts whose NLI pairs join the parity probe set (a PRM: whose traces are its probe)",
        metavar="FILE",
    )
    eval_report: str | None = option(None, "stepgap eval report.json for the card", metavar="JSON")
    eval_checker: str | None = option(
        None,
        "the report's row that measured this student (needed when it has several)",
        metavar="NAME",
    )
    overwrite: bool = option(False, "replace an existing bundle")


def export(args: ExportArguments, tree: TreeConfig) -> int:
    from stepgap.export.bundle import export_bundle

    if tree.ablate:
        raise ValueError(
            "--ablate removes a stage for an experiment; a bundle keeps the whole tree"
        )
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
        tree=asdict(tree),
        eval_report=args.eval_report,
        eval_checker=args.eval_checker,
        overwrite=args.overwrite,
        base_revision=args.base_revision,
        prm_quantize=args.prm_quantize,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    if "nli" in manifest:
        summary = {"bundle": str(out), "nli_parity": manifest["nli"]["parity"]}
    else:
        summary = {"bundle": str(out), "prm_parity": manifest["student"]["parity"]}
    print(json.dumps(summary, indent=2))
    return 0


@dataclass(frozen=True, kw_only=True)
class PushArguments:
    bundle: str = option(help="folder written by stepgap export", positional=True)
    repo_id: str = option(help="the Hub repository", metavar="USER/NAME")
    private: bool = option(False, "create a private repo")
    revision: str | None = option(None, "push to this branch (created if needed)", metavar="BRANCH")
    dry_run: bool = option(False, "list the files and print the card")


def push(args: PushArguments) -> int:
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
    else:
        at = f"{args.repo_id}@{args.revision}" if args.revision else args.repo_id
        print(f"stepgap push: load it anywhere with --bundle {at}", file=sys.stderr)
    return 0


COMMANDS = [
    Command(
        "export",
        "one offline bundle: student (merged or adapter) + ONNX NLI, or an ONNX PRM, + "
        "checksummed manifest",
        (ExportArguments, TreeConfig),
        export,
    ),
    Command(
        "push",
        "upload a bundle and its model card to the Hugging Face Hub",
        (PushArguments,),
        push,
    ),
]
