"""One offline bundle: the student (merged or adapter), the ONNX NLI model, a checksummed manifest.

    BUNDLE/
      manifest.json    format and stepgap versions, sources, thresholds, prompt version,
                       parity, eval summary, and the sha256 of every other file
      student/         merged safetensors shards + tokenizer and chat template, or the adapter
      nli/             model.onnx (+ model_quantized.onnx, model_fp16.onnx), tokenizer, config

Loading verifies every checksum first and refuses pickled weights, so a bundle copied to a
cluster either loads exactly what was exported or names the file that changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stepgap import __version__

from .onnx_nli import check_parity, export_onnx

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
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


def _export_student(
    student: str, base: str | None, out: Path, merge: bool, dtype: str | None
) -> dict:
    from stepgap.student.judge import STUDENT_META, is_adapter, load_student

    out.mkdir(parents=True)
    adapter = is_adapter(student)
    if merge or not adapter:
        tokenizer, model = load_student(student, base, device="cpu", dtype=dtype)
        tokenizer.padding_side = "left"
        model.save_pretrained(out, safe_serialization=True, max_shard_size="2GB")
        tokenizer.save_pretrained(out)
        if (Path(student) / STUDENT_META).is_file():
            shutil.copy2(Path(student) / STUDENT_META, out / STUDENT_META)
    else:
        for name in ADAPTER_FILES:
            if (Path(student) / name).is_file():
                shutil.copy2(Path(student) / name, out / name)
    meta_file = out / STUDENT_META
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    if adapter and base is None:
        base = json.loads((Path(student) / "adapter_config.json").read_text()).get(
            "base_model_name_or_path"
        )
    return {
        "path": "student",
        "merged": merge or not adapter,
        "source": student,
        "base": base,
        "nli_features": bool(meta.get("nli_features", False)),
    }


def export_bundle(
    student: str,
    nli: str,
    out_dir: str | Path,
    *,
    base: str | None = None,
    merge: bool = False,
    dtype: str | None = None,
    nli_quantize: str | None = None,
    nli_fp16: bool = False,
    probe: Sequence[tuple[str, str]] = (),
    parity_floor: float = 0.99,
    parity_atol: float = 1e-3,
    tree: dict[str, Any] | None = None,
    eval_summary: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Build the bundle in a temporary folder beside `out_dir`, then move it into place, so a
    failed parity check or a crash never leaves a half bundle that looks whole."""
    from stepgap.teacher.prompt import PROMPT_VERSION
    from stepgap.teacher.tree import TreeConfig

    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    if nli_quantize not in (None, "int8"):
        raise ValueError(f"--nli-quantize supports int8, not {nli_quantize!r}")
    work = out.with_name(out.name + ".partial")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        onnx_dir = export_onnx(nli, work / "nli", int8=nli_quantize == "int8", fp16=nli_fp16)
        precisions = [p for p, on in (("int8", nli_quantize == "int8"), ("fp16", nli_fp16)) if on]
        parity = check_parity(
            nli, onnx_dir, precisions, probe=probe, atol=parity_atol, floor=parity_floor
        )
        student_info = _export_student(student, base, work / "student", merge, dtype)
        config = json.loads((onnx_dir / "config.json").read_text())
        tree_cfg = TreeConfig(**(tree or {}))
        manifest = {
            "format_version": FORMAT_VERSION,
            "stepgap_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "prompt_version": PROMPT_VERSION,
            "student": student_info,
            "nli": {
                "path": "nli",
                "source": nli,
                "precisions": ["fp32", *precisions],
                "default_precision": "int8" if nli_quantize == "int8" else "fp32",
                "id2label": config.get("id2label"),
                "parity": parity.as_dict(),
            },
            "tree": {
                "entail_threshold": tree_cfg.entail_threshold,
                "contradict_threshold": tree_cfg.contradict_threshold,
                "hypothesis": tree_cfg.hypothesis,
            },
            "eval": eval_summary,
            "files": {
                str(p.relative_to(work)): sha256_file(p)
                for p in sorted(work.rglob("*"))
                if p.is_file()
            },
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def eval_summary(report: str | Path, checker: str | None = None) -> dict[str, Any]:
    """The headline metrics of one checker from `stepgap eval`'s report.json."""
    data = json.loads(Path(report).read_text(encoding="utf-8"))
    checkers = data.get("checkers", {})
    if not checkers:
        raise ValueError(f"{report}: no 'checkers' section; expected stepgap eval's report.json")
    name = checker or next(iter(checkers))
    if name not in checkers:
        raise ValueError(f"{report}: no checker {name!r}; it has {', '.join(checkers)}")
    row = checkers[name]
    keys = ("sP", "sR", "sF1", "BA", "kappa", "QF1", "wrong_rate", "healthy")
    return {
        "checker": name,
        "n_steps": data.get("n_steps"),
        "n_traces": data.get("n_traces"),
        "metrics": {k: row[k] for k in keys if row.get(k) is not None},
    }


def verify_bundle(path: str | Path) -> dict[str, Any]:
    """The manifest, after checking every file's sha256; raises BundleError naming the file."""
    root = Path(path)
    manifest_file = root / MANIFEST
    if not manifest_file.is_file():
        raise BundleError(f"{root}: no {MANIFEST}; not a stepgap bundle")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BundleError(f"{manifest_file}: not valid JSON ({exc})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(
            f"{manifest_file}: format_version {manifest.get('format_version')!r}, "
            f"this stepgap reads {FORMAT_VERSION}"
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
        if rel != MANIFEST and rel not in manifest["files"]:
            log.warning("%s: not part of the bundle; ignored", file)
    return manifest
