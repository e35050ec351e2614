"""What every card and upload to the Hugging Face Hub shares: the model card template (the
top-level MODEL_CARD.md, shipped as stepgap/MODEL_CARD.md), the card's file name and license, and
the token check. The bundle's card and push (`stepgap.export.hub`) and the trained adapter's
card and push (`stepgap.student`) both use it.
"""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATE = Path(__file__).with_name("MODEL_CARD.md")
CARD = "README.md"
LICENSE = "apache-2.0"  # stepgap's weights and cards; a base model's own license applies too


def template_section(title: str) -> str:
    """The body of the template's `## title` section, for another card that says the same (the
    student adapter's card quotes the method's limitations from here: one text for both)."""
    text = TEMPLATE.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    if match is None:
        raise KeyError(f"{TEMPLATE.name} has no section '## {title}'")
    return match.group(1).strip()


def require_hub_token(what: str, hint: str = "") -> None:
    """Fail before any work when no Hub token is set: huggingface_hub reads HF_TOKEN (or a
    `huggingface-cli login`) itself, and stepgap never takes one as an option or a file key."""
    from huggingface_hub import get_token

    if not get_token():
        raise ValueError(
            f"{what} needs a Hugging Face token with write access: set HF_TOKEN in the "
            f"environment (or run `huggingface-cli login`){hint}"
        )
