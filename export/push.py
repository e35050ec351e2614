"""The model card (from the top-level MODEL_CARD.md template) and `stepgap push` to the Hub.

Only the files the manifest lists, the manifest and the generated card go up, in one commit:
caches, `.env` files and anything else lying in the folder never leave the machine. The token
comes from the environment (HF_TOKEN) through huggingface_hub, never from the command line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import yaml

from stepgap.hub_access import CARD, LICENSE, TEMPLATE, require_hub, upload_errors
from stepgap.student.prm import PRM_KIND

from .bundle import MANIFEST, verify_bundle

# stepgap eval's metric names -> Hub metric types
METRICS = {
    "sF1": "f1",
    "sP": "precision",
    "sR": "recall",
    "BA": "balanced_accuracy",
    "kappa": "cohen_kappa",
    "QF1": "f1",
}


def card_metadata(manifest: dict[str, Any], repo_id: str | None = None) -> dict[str, Any]:
    """YAML front matter: license, base_model, tags, pipeline tag, and metrics if evaluated."""
    student = manifest["student"]
    prm = student.get("kind") == PRM_KIND
    meta: dict[str, Any] = {
        "license": LICENSE,
        "library_name": "stepgap",
        "pipeline_tag": "token-classification" if prm else "text-generation",
        "tags": ["stepgap", "process-reward", "search-agent", "rag", "onnx", "grpo"]
        + (["prm"] if prm else ["nli"]),
    }
    if student.get("base_revision"):  # a hub base (a bundled one has no id to link to)
        meta["base_model"] = student["base"]
    results = _results(manifest.get("eval"))
    if results:
        meta["model-index"] = [{"name": repo_id or "stepgap-checker", "results": results}]
    return meta


def _results(summary: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not summary:
        return []
    metrics = [
        {"type": METRICS[k], "name": k, "value": float(v)}
        for k, v in summary.get("metrics", summary).items()
        if k in METRICS and isinstance(v, (int, float))
    ]
    if not metrics:
        return []
    dataset = summary.get("dataset", "stepgap gold steps")
    return [
        {
            "task": {"type": "text-classification", "name": "step-level gap detection"},
            "dataset": {"type": str(dataset), "name": str(dataset)},
            "metrics": metrics,
        }
    ]


def _eval_table(summary: dict[str, Any] | None, manifest: dict[str, Any]) -> str:
    if not summary:
        return "No evaluation summary was given at export (`stepgap export --eval-report`)."
    rows = [
        f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |"
        for k, v in summary.get("metrics", summary).items()
        if isinstance(v, (int, float, str))
    ]
    head = (
        f"The figures of checker `{summary.get('checker', '?')}` in the evaluation report "
        f"({summary.get('n_steps')} gold steps, {summary.get('n_traces')} traces); sF1, sP, sR "
        "and BA are binary (gap vs no gap), typed_accuracy counts the exact label.\n\n"
    )
    notes = list(summary.get("notes") or [])
    notes += [f"this bundle's {part}: {manifest[part]['note']}" for part in ("student", "nli")
              if (manifest.get(part) or {}).get("note")]  # fmt: skip
    warning = ""
    if notes:
        warning = (
            "\n\n**These figures do not measure a real checker**: they come from stand-in or "
            "replayed models:\n" + "\n".join(f"- {n}" for n in dict.fromkeys(notes))
        )
    return head + "| metric | value |\n| --- | --- |\n" + "\n".join(rows) + warning


PRM_CARD = """---
$metadata
---

# $title

A **stepgap** PRM: a token-classification model that reads a search agent's whole segmented
trace once, with a marker after each step, and predicts at each marker the step's label, no-gap,
**CC** (contradicted claim; repair: retract), **IE** (irrelevant evidence; repair: re-search) or
**MB** (missing bridge; repair: bridging search), and the stage of the teacher's decision tree
that fired. It was distilled from the hybrid checker (an LLM judge and an NLI model behind a
decision tree) and runs offline with neither: its verdicts carry the label, its repair, the
firing stage (a path of one step) and the label's probability, never a judge's quote or reasons.
A step whose marker falls past the model's window of $max_length tokens is a failed check,
never a guess.

## What is in this bundle

| part | source |
| --- | --- |
| PRM (label and firing-stage heads), ONNX | $student |
| stepgap | $stepgap_version |

Every file is listed with its sha256 in `manifest.json`; loading fails, naming the file, if
one was altered, and re-runs the parity probe on the execution provider that will serve.

## Evaluation

$eval_table

## Usage

$usage
"""


def render_prm_card(manifest: dict[str, Any], repo_id: str | None = None) -> str:
    """The card of a PRM's bundle: what it labels and keeps, its graphs and parity."""
    student = manifest["student"]
    parity = student["parity"].get("label_agreement_with_fp32")
    return Template(PRM_CARD).safe_substitute(
        metadata=yaml.safe_dump(card_metadata(manifest, repo_id), sort_keys=False).strip(),
        title=repo_id or "stepgap PRM",
        student=f"`{student['source']}` ({', '.join(student['precisions'])}; parity: "
        f"{json.dumps(parity) if parity else 'fp32 only'})"
        + (f". **{student['note']}**" if student.get("note") else ""),
        max_length=student["format"]["max_length"],
        stepgap_version=manifest["stepgap_version"],
        eval_table=_eval_table(manifest.get("eval"), manifest),
        usage=_usage(repo_id),
    )


def _usage(repo_id: str | None) -> str:
    return (
        "```bash\n"
        f"hf download {repo_id or 'USER/NAME'} --local-dir bundle\n"
        "stepgap check traces.jsonl --bundle bundle -o verdicts.jsonl\n"
        "stepgap serve --bundle bundle --port 8000   # /reward, /get_reward, /check\n"
        "```\n\n"
        "```python\n"
        "from stepgap.export import OfflineChecker\n"
        "from stepgap.serving import StepGapReward\n"
        'reward = StepGapReward(OfflineChecker.from_bundle("bundle"))\n'
        "```"
    )


def render_card(manifest: dict[str, Any], repo_id: str | None = None) -> str:
    if manifest["student"].get("kind") == PRM_KIND:
        return render_prm_card(manifest, repo_id)
    student, nli = manifest["student"], manifest["nli"]
    if student["merged"]:
        kind = "merged into its base"
    elif student.get("base_revision"):
        kind = f"LoRA adapter on `{student['base']}` at revision `{student['base_revision']}`"
    else:
        kind = f"LoRA adapter on `{student.get('base_source')}` (carried in `{student['base']}`)"
    usage = _usage(repo_id)
    template = re.sub(r"<!--.*?-->\n*", "", TEMPLATE.read_text(encoding="utf-8"), flags=re.S)
    return Template(template).safe_substitute(
        metadata=yaml.safe_dump(card_metadata(manifest, repo_id), sort_keys=False).strip(),
        title=repo_id or "stepgap checker",
        student=f"`{student['source']}`, {kind}"
        + (" (prompted with NLI features)" if student.get("nli_features") else "")
        + (f". **{student['note']}**" if student.get("note") else ""),
        nli=f"`{nli['source']}` ({', '.join(nli['precisions'])}; parity: "
        f"{json.dumps(nli['parity']['label_agreement_with_fp32']) or 'fp32 only'})"
        + (f". **{nli['note']}**" if nli.get("note") else ""),
        prompt_version=manifest["prompt_version"],
        stepgap_version=manifest["stepgap_version"],
        eval_table=_eval_table(manifest.get("eval"), manifest),
        usage=usage,
    )


@dataclass
class PushPlan:
    repo_id: str
    files: list[str]  # paths in the repo, the card included
    card: str


def plan_push(bundle: str | Path, repo_id: str) -> PushPlan:
    manifest = verify_bundle(bundle)
    files = sorted([*manifest["files"], MANIFEST, CARD])
    return PushPlan(repo_id, files, render_card(manifest, repo_id))


def push_bundle(
    bundle: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    dry_run: bool = False,
    api: Any = None,
) -> PushPlan:
    """Create the repo and upload the bundle and its card in one commit (or only plan it)."""
    plan = plan_push(bundle, repo_id)
    if dry_run:
        return plan
    from huggingface_hub import CommitOperationAdd, HfApi

    what = f"stepgap push to {repo_id}"
    if api is None:
        require_hub(what, "; --dry-run needs neither")
    api = api or HfApi()
    root = Path(bundle)
    operations = [
        CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(root / f))
        for f in plan.files
        if f != CARD
    ]
    operations.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=plan.card.encode()))
    with upload_errors(what):
        api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        api.create_commit(
            repo_id,
            operations=operations,
            commit_message=f"stepgap bundle ({len(operations)} files)",
            repo_type="model",
            revision=revision,
        )
    return plan
