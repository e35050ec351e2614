"""`--config FILE.yaml` for every command: its flags as keys, flags on the command line win.

This follows TRL's parser (`TrlParser`): the file's values become the command's defaults, then the
command line is parsed as usual, so a run is reproducible from one file and any flag can still be
changed for one run. Keys are the flags' names (`entail_threshold` or `entail-threshold`),
positional arguments included (`input`); values are checked by the flag's own type and choices,
and an unknown key is an error naming the file, the line and the key. `--print-config` prints the
resolved configuration as YAML (a file `--config` reads back) and runs nothing.

A command that defines its own `--config` (`train`, whose config is the training recipe) keeps it,
and gets its command line as typed (`args.argv`): its own parser (TRL's) reads the recipe's keys
as flags, so flags this parser does not know are not errors here.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

import yaml

from stepgap.configs import flag_value, key_lines, nearest_name, read_yaml_mapping
from stepgap.io import plain_reason
from stepgap.teacher.build import REFUSED_KEYS

_SKIP_DESTS = {"help", "config", "print_config", "_run"}


class _ReplaceAppend(argparse._AppendAction):
    """`append` whose first command-line value replaces a list that came from a config file."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        if getattr(namespace, self.dest, None) is self.default and self.default:
            setattr(namespace, self.dest, [])
        super().__call__(parser, namespace, values, option_string)


class DefaultsFormatter(argparse.HelpFormatter):
    """`--help` shows each flag's default (when it has a meaningful one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" not in text
            and action.option_strings
            and default not in (None, False, argparse.SUPPRESS)
            and not (isinstance(default, list) and not default)
            and action.nargs != 0
        ):
            text += " (default: %(default)s)"
        return text


class ConfigParser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands accept `--config` and `--print-config`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "append", _ReplaceAppend)

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        """argparse's usage and error line, with the flag a misspelt one was likely meant to be
        (`--entail-treshold`: did you mean --entail-threshold?)."""
        if message.startswith("unrecognized arguments: "):
            known = [o for o in self._option_string_actions if o.startswith("--")]
            for token in message.removeprefix("unrecognized arguments: ").split():
                flag = token.split("=", 1)[0]
                close = nearest_name(flag, known)
                if flag.startswith("--") and close:
                    message += f" (did you mean {close}?)"
                    break
        super().error(message)

    def add_subparsers(self, **kwargs: Any):  # type: ignore[override]
        sub = super().add_subparsers(**kwargs)
        original = sub.add_parser

        def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
            kw.setdefault("formatter_class", DefaultsFormatter)
            return original(name, **kw)

        sub.add_parser = add_parser  # type: ignore[method-assign]
        return sub


def add_config_options(p: argparse.ArgumentParser) -> None:
    """`--config` and `--print-config` for a subcommand; one that declares its own `--config`
    (train: the training recipe) keeps it and resolves `--print-config` itself."""
    p.own_config = any("--config" in a.option_strings for a in p._actions)  # type: ignore[attr-defined]
    g = p.add_argument_group("configuration file")
    if not p.own_config:  # type: ignore[attr-defined]
        g.add_argument(
            "--config",
            metavar="FILE.yaml",
            help="read this command's flags from a YAML file (keys = flag names); flags given "
            "on the command line override it",
        )
    g.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration as YAML and exit",
    )


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_and_config(
    argv: list[str], commands: dict[str, argparse.ArgumentParser]
) -> tuple[str | None, str | None]:
    """The subcommand in argv, and the value of its `--config`, without parsing the rest."""
    name = next((a for a in argv if a in commands), None)
    if name is None:
        return None, None
    rest = argv[argv.index(name) + 1 :]
    for i, arg in enumerate(rest):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(rest):
            return name, rest[i + 1]
        if arg.startswith("--config="):
            return name, arg.split("=", 1)[1]
    return name, None


def _convert(action: argparse.Action, value: Any, where: str) -> Any:
    """A config value checked and converted as the flag would be on the command line."""
    if value is None:  # `--print-config` writes an unset flag as null
        return None
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*")
    if many:
        items = value if isinstance(value, list) else [value]
        return [flag_value(action, v, where) for v in items]
    return flag_value(action, value, where)  # a list or mapping: "expected a single value"


def apply_config(p: argparse.ArgumentParser, command: str, path: str) -> None:
    """Make the file's values the defaults of subcommand parser `p`."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--config {path}: file not found")
    data, text = read_yaml_mapping(file, "flag names to values")
    apply_values(p, data, path, text, f"`stepgap {command}` has no such flag")


def apply_values(
    p: argparse.ArgumentParser, data: dict[str, Any], path: str | Path, text: str, unknown: str
) -> None:
    """Make `data` (flag name -> value, read from file `path` whose text is `text`: YAML or
    JSON) the defaults of parser `p`. An unknown key is an error ending with `unknown`, a value
    the flag would refuse an error; both name the file, the line and the key."""
    lines = key_lines(text)
    by_dest = {a.dest: a for a in p._actions if a.dest not in _SKIP_DESTS}
    for key, value in data.items():
        where = f"{path}:{lines.get(str(key), 1)}: {key}"
        name = str(key).lstrip("-").replace("-", "_")
        action = by_dest.get(name)
        if action is None:
            if name in REFUSED_KEYS:
                raise ValueError(f"{where}: {REFUSED_KEYS[name]}")
            known = ", ".join(sorted(by_dest))
            raise ValueError(f"{where}: {unknown} (keys: {known})")
        action.default = _convert(action, value, where)
        origins = p.__dict__.setdefault("config_origins", {})
        origins[action.dest] = where  # a later check of the value names where it came from
        action.required = False
        if not action.option_strings:  # a positional argument given by the file
            action.nargs = {None: "?", "+": "*"}.get(action.nargs, action.nargs)  # type: ignore[arg-type]


def resolved(args: argparse.Namespace, p: argparse.ArgumentParser) -> dict[str, Any]:
    """The command's flags and their values, as a `--config` file would hold them."""
    out = {}
    for action in p._actions:
        if action.dest in _SKIP_DESTS or action.dest == argparse.SUPPRESS:
            continue
        value = getattr(args, action.dest, None)
        out[action.dest] = str(value) if isinstance(value, Path) else value
    return out


def _unknown_flags(p: argparse.ArgumentParser, rest: list[str]) -> list[str]:
    """The flags in `rest` that subcommand `p` does not have (nor begins, as argparse allows):
    named first, so a mistyped flag is not hidden behind "the following arguments are
    required"."""
    known = [s for a in p._actions for s in a.option_strings]
    unknown = []
    for token in rest:
        if token == "--":
            break
        flag = token.split("=", 1)[0]
        if not flag.startswith("-") or flag == "-" or flag[1:2].isdigit() or flag[1:2] == ".":
            continue  # a value: a positional, a negative number
        if flag not in known and not any(k.startswith(flag) for k in known if flag[:2] == "--"):
            unknown.append(token)
    return unknown


def error_line(exc: BaseException, args: argparse.Namespace) -> str:
    """One line for a refused value: a pydantic error as `field: reason` (not its block of
    lines), and a value that a `--config` file gave prefixed by that file's line and key."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"] if not isinstance(part, int))
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = f"{field}: {plain_reason(first['msg'])}{more}"
    else:
        message = str(exc)
    for dest, where in getattr(args, "_from_config", {}).items():
        if message.startswith((f"{dest} ", f"{dest}:")):
            return f"{where.rsplit(': ', 1)[0]}: {message}"
    return message


def parse_with_config(
    parser: argparse.ArgumentParser, argv: list[str]
) -> argparse.Namespace | None:
    """Parse argv with its command's `--config` applied; None when `--print-config` printed."""
    commands = _subparsers(parser)
    name, config = _command_and_config(argv, commands)
    sub = commands.get(name) if name else None
    own = getattr(sub, "own_config", False)
    if sub is not None and config is not None and not own:
        apply_config(sub, name, config)  # type: ignore[arg-type]
    rest = argv[argv.index(name) + 1 :] if sub is not None else []
    if sub is not None and not own and (unknown := _unknown_flags(sub, rest)):
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")  # before "required" errors
    args, unknown = parser.parse_known_args(argv)
    if unknown and not (own and set(unknown) <= set(rest)):  # the command's usage, not the top's
        (sub or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if own:  # its own parser reads the whole of it
        args.argv = rest
    if sub is not None:  # the values the file gave (not overridden on the command line)
        origins = getattr(sub, "config_origins", {})
        args._from_config = {
            dest: where
            for dest, where in origins.items()
            if getattr(args, dest, None) == sub.get_default(dest)
        }
    if getattr(args, "print_config", False) and sub is not None and not own:
        print(yaml.safe_dump(resolved(args, sub), sort_keys=False, allow_unicode=True), end="")
        return None
    return args
