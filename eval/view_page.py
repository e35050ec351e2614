"""The `stepgap view` page: static and offline, no server, no CDN. The data is embedded as JSON in
a `<script type="application/json">` block (every `<`, `>` and `&` escaped, so no text can close
the block) and drawn by a small inline script (`view.js`) that only ever sets `textContent`:
evidence is untrusted text and stays text."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from .colours import css_variables


def _asset(name: str) -> str:
    return resources.files("stepgap.eval").joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON that is safe inside a `<script>` block: no `<`, `>` or `&` appears literally, so no
    string in it can close the block (`</script>`) or open a comment (`<!--`)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_html(data: Mapping[str, Any]) -> str:
    """The self-contained page for a `view_data` dict: inline CSS, script and data, no URL."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(str(data['title']))}</title>\n"
        f"<style>\n{css_variables()}{_asset('view.css')}</style>\n</head>\n<body>\n"
        "<noscript>This page draws its traces with JavaScript; enable it to see them.</noscript>\n"
        '<div id="app"></div>\n'
        f'<script type="application/json" id="stepgap-data">{embed_json(data)}</script>\n'
        f"<script>\n{_asset('view.js')}</script>\n</body>\n</html>\n"
    )
