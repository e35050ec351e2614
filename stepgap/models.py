"""Helpers for loading models by hub id or local path, with errors a user can act on."""

from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_ref(ref: str) -> str:
    """Return `ref` if it is an existing folder, a `.gguf` file or looks like a hub id, else raise clearly.

    Without this, a mistyped local path reaches huggingface_hub and fails as an invalid repo id.
    """
    if os.path.isdir(ref) or (ref.endswith(".gguf") and os.path.isfile(ref)):
        return ref
    looks_local = ref.startswith((".", "/", "~")) or os.sep in ref.strip("/").replace("/", "", 1)
    if looks_local or not _HUB_ID.match(ref):
        raise FileNotFoundError(f"model folder not found: {ref} (and it is not a hub id)")
    return ref
