"""What every card and upload to the Hugging Face Hub shares: the model card template (the
top-level MODEL_CARD.md, shipped as stepgap/MODEL_CARD.md), the card's file name and license,
the checks before an upload (a token, a reachable Hub) and one line for an upload that fails.
The bundle's card and push (`stepgap.export.push`), the trained adapter's card and push
(`stepgap.student`) and the SFT data's push (`stepgap sft-data --push-to-hub`) all use it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
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


class HubUploadError(RuntimeError):
    """An upload to the Hub that cannot start or that failed; the message says what to do."""


_HUB_PROBE: dict[str, str | None] = {}


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hub's endpoint (`HF_ENDPOINT`) cannot be reached (a TCP connection within
    `timeout`), or None; asked once per process and endpoint."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    if endpoint not in _HUB_PROBE:
        url = urlsplit(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname or "", port), timeout=timeout).close()
            _HUB_PROBE[endpoint] = None
        except OSError as exc:
            _HUB_PROBE[endpoint] = f"{endpoint}: {exc.strerror or exc}"
    return _HUB_PROBE[endpoint]


def require_hub(what: str, hint: str = "") -> None:
    """Before any work of a run that uploads: a token (`require_hub_token`) and a Hub that
    answers, else one `HubUploadError` (the command line prints it and exits 2)."""
    require_hub_token(what, hint)
    if down := hub_unreachable():
        raise HubUploadError(
            f"{what}: the Hugging Face Hub cannot be reached ({down}); run it where there is "
            f"network{hint}"
        )


def _upload_failures() -> tuple[type[BaseException], ...]:
    """What huggingface_hub and the HTTP client under it raise when an upload fails: the client
    is httpx in huggingface_hub 1.x and httpx2 in 2.x (requests before 1.0)."""
    from huggingface_hub.errors import HfHubHTTPError

    kinds: list[type[BaseException]] = [HfHubHTTPError, ConnectionError, TimeoutError]
    with contextlib.suppress(ImportError):
        import httpx

        kinds.append(httpx.HTTPError)
    with contextlib.suppress(ImportError):
        import httpx2

        kinds.append(httpx2.HTTPError)
    with contextlib.suppress(ImportError):
        import requests

        kinds.append(requests.RequestException)
    return tuple(kinds)


@contextlib.contextmanager
def upload_errors(what: str) -> Iterator[None]:
    """An upload's failure as one `HubUploadError` line (what failed, the server's first line,
    what to do) instead of the HTTP client's traceback."""
    try:
        yield
    except HubUploadError:
        raise
    except _upload_failures() as exc:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise HubUploadError(
            f"{what} failed: {first[:300]}. Check that HF_TOKEN has write access to the "
            "repository and that the Hub can be reached, then run it again"
        ) from exc


def require_hub_token(what: str, hint: str = "") -> None:
    """Fail before any work when no Hub token is set: huggingface_hub reads HF_TOKEN (or a
    `hf auth login`) itself, and stepgap never takes one as an option or a file key."""
    from huggingface_hub import get_token

    if not get_token():
        raise ValueError(
            f"{what} needs a Hugging Face token with write access: set HF_TOKEN in the "
            f"environment (or run `hf auth login`){hint}"
        )
