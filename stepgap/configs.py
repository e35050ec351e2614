"""Reading configuration files (a command's `--config FILE.yaml`, a training recipe, a reward
worker's JSON file) so that a mistake is one line naming the file, the line and the key: the
line of each key, the key a misspelt one was meant to be, and a value checked as its flag would
check the same text on the command line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def key_lines(text: str) -> dict[str, int]:
    """Top-level key -> 1-based line of a YAML or JSON mapping, for error messages that name
    the line of a configuration file's key."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if hasattr(k, "value")}


def nearest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name a misspelt one was most likely meant to be, if one is close enough
    (`--entail-treshold` -> `--entail-threshold`), for a "did you mean" in an error line."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return close[0] if close else None


def read_yaml_mapping(path: str | Path, what: str = "keys to values") -> tuple[dict[str, Any], str]:
    """(the mapping, the text) of a YAML configuration file (empty for an empty file); one error
    line naming the file when it is not YAML or not a mapping of `what`."""
    import yaml

    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    if data is None:
        return {}, text
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of {what}")
    return data, text


def flag_value(action: Any, value: Any, where: str) -> Any:
    """One value of a configuration file's key, checked and converted as its argparse flag
    (`action`) would check the same text on the command line: a parser takes its defaults
    unchecked. Errors start with `where` (the file, line and key, or `--set KEY`). Used by
    `stepgap COMMAND --config` and by the student's training recipes."""
    if value is None:
        return None
    if isinstance(value, list | dict):
        raise ValueError(f"{where}: expected a single value, got {type(value).__name__}")
    convert = action.type
    if isinstance(value, bool) and getattr(convert, "__name__", "") != "string_to_bool":
        wanted = "text" if convert in (None, str) else "a number"  # `cache: false` is no file name
        raise ValueError(f"{where}: expected {wanted}, got {str(value).lower()}")
    if callable(convert):
        try:  # the value as the command line gives it, as text: 2.5 is no int, true no number
            value = convert(value if isinstance(value, str) else str(value))
        except Exception as exc:  # TypeError, ValueError, argparse's ArgumentTypeError
            raise ValueError(f"{where}: {value!r} is not a valid value ({exc})") from None
    elif not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value
