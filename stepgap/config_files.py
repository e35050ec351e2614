"""Configuration files, as the parser (`stepgap.arguments`) reads and writes them: a mapping of
YAML or JSON with the line of each key (so an error names it), the key a misspelt one was likely
meant to be, `--set KEY=VALUE` values read as the file would read them, and the options written
back as YAML that reads back."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import yaml


def parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` strings; values are read as YAML scalars (numbers, booleans, null)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def config_yaml(parsed: Sequence[Any], keys: set[str] | None = None) -> str:
    """The dataclasses' fields as YAML (`keys`: only those), a file `--config` reads back."""
    out: dict[str, Any] = {}
    for instance in parsed:
        if not dataclasses.is_dataclass(instance):
            continue
        for f in dataclasses.fields(instance):
            if f.init and (keys is None or f.name in keys):
                out.setdefault(f.name, _plain(getattr(instance, f.name)))
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def read_mapping(text: str, path: str | Path, kind: str = "yaml") -> dict[str, Any]:
    """The mapping of a configuration file's text (JSON or YAML; empty for an empty YAML
    file); one error line naming the file when it is not one."""
    import json

    if kind == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}:{exc.lineno}: not JSON ({exc.msg}, column {exc.colno})"
            ) from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from None
        if data is None:
            return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values")
    return data


def key_lines(text: str) -> dict[str, int]:
    """Top-level key -> 1-based line of a YAML or JSON mapping, for error lines."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def nearest_name(name: str, known: Iterable[str], cutoff: float = 0.75) -> str | None:
    """The known name a misspelt one was most likely meant to be, if one is close enough."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def suggest_choice(message: str) -> str:
    """argparse's "invalid choice: 'chek' (choose from ...)" with the choice it was likely meant
    to be, as a misspelt flag gets."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if found is None:
        return message
    choices = re.findall(r"'([^']*)'", found.group(2)) or found.group(2).split(", ")
    close = nearest_name(found.group(1), choices)
    return f"{message} (did you mean {close}?)" if close else message
