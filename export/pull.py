"""A pushed bundle loaded back by its Hub id, `USER/NAME[@REVISION]`: `stepgap push`'s other half.

`locate_bundle(ref)` is where a bundle named by folder or by id is on this machine. A folder of
that name wins, as in transformers. Otherwise huggingface_hub's `snapshot_download` fetches
exactly the files the bundle's manifest lists (the manifest first, then those files) into the
Hugging Face cache, or finds them there: with `HF_HUB_OFFLINE=1`, or when the Hub cannot be
reached, only the cache is read. The checksums are then verified as for any folder
(`read_bundle`), and the commit loaded is logged and recorded in every verdict's provenance.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bundle import MANIFEST, BundleError

log = logging.getLogger(__name__)

# a Hub model id, `user/name`, and a revision after `@` (a branch, tag or commit)
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")


@dataclass(frozen=True)
class BundleSource:
    """Where a bundle is on this machine, and for one from the Hub, what was asked and loaded."""

    path: Path
    repo_id: str | None = None
    revision: str | None = None  # as asked (None: the default branch)
    commit: str | None = None  # the commit loaded

    def provenance(self) -> dict[str, str | None] | None:
        """What a verdict records of the bundle's origin (None for a local folder)."""
        if self.repo_id is None:
            return None
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}


def locate_bundle(ref: str | Path) -> BundleSource:
    """The bundle `ref` names: a folder, or else a Hub id fetched into (or found in) the cache."""
    path = Path(ref)
    match = HUB_ID.fullmatch(str(ref))
    if path.exists() or match is None:
        return BundleSource(path)  # `read_bundle` names a folder that is not there
    repo_id, revision = match["repo"], match["revision"]
    local_only, why = _cache_only()
    try:
        _snapshot(repo_id, revision, [MANIFEST], local_only)
        folder = Path(_snapshot(repo_id, revision, _manifest_files(repo_id, revision), local_only))
    except BundleError:
        raise
    except Exception as exc:
        raise BundleError(_hub_failure(str(ref), repo_id, revision, exc, why)) from None
    source = BundleSource(folder, repo_id, revision, folder.name)
    log.info("bundle %s: revision %s, commit %s", repo_id, revision or "main", folder.name)
    return source


def _cache_only() -> tuple[bool, str | None]:
    """(whether only the cache may be read, and why): `HF_HUB_OFFLINE`, or a Hub that does not
    answer (asked once, fast, instead of after the Hub client's own retries)."""
    from huggingface_hub import constants

    from stepgap.hub_access import hub_unreachable

    if constants.HF_HUB_OFFLINE:
        return True, "HF_HUB_OFFLINE is set"
    down = hub_unreachable()
    return down is not None, (f"the Hub cannot be reached: {down}" if down else None)


def _snapshot(repo_id: str, revision: str | None, files: list[str], local_only: bool) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(
        repo_id,
        revision=revision,
        allow_patterns=files,
        local_files_only=local_only,
    )


def _manifest_files(repo_id: str, revision: str | None) -> list[str]:
    """The manifest (fetched already) and every file it lists."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, MANIFEST, revision=revision)
    if not isinstance(cached, str):
        raise BundleError(f"{repo_id}: the Hub repo has no {MANIFEST}; not a stepgap bundle")
    try:
        manifest: dict[str, Any] = json.loads(Path(cached).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BundleError(f"{cached}: not valid JSON ({exc})") from None
    return [MANIFEST, *manifest.get("files", {})]


def _hub_failure(
    ref: str, repo_id: str, revision: str | None, exc: Exception, why: str | None
) -> str:
    """One line for a bundle id that cannot be loaded: what failed and what to do."""
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}@{revision}" if revision else repo_id
    if isinstance(exc, RevisionNotFoundError):
        return f"{at}: the Hub repo has no revision {revision!r} (a branch, tag or commit)"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"{ref}: neither a folder here nor a model repo on the Hub that this token may read "
            "(a private repo needs HF_TOKEN)"
        )
    if isinstance(exc, LocalEntryNotFoundError):
        return (
            f"{ref}: no such folder, and {at} is not in the Hugging Face cache ({why or 'offline'})"
            f"; load it once where the Hub can be reached, or give the bundle's folder"
        )
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{at}: the bundle could not be fetched from the Hub ({type(exc).__name__}: {first})"
