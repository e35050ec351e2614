"""The one parser of stepgap's options: transformers' `HfArgumentParser`, with a configuration
file layer.

Every command (`stepgap COMMAND`, and `student/train.py` as `accelerate launch` runs it) is an
`ArgumentParser` over the dataclasses of its options (`stepgap.options`), and so is the reward
worker's JSON file (`parse_file`). `HfArgumentParser` makes a flag of each field (`--batch-size`
and `--batch_size`) and fills the dataclasses, as in TRL's and transformers' scripts. What this
class adds, which neither `HfArgumentParser` nor TRL's `TrlParser` has:

- `--config FILE.yaml` whose keys are the fields (dashes or underscores), checked as the flag
  would check the same text (TrlParser takes a file's values unchecked), an `env:` mapping set in
  the environment (as TrlParser does), flags on the command line winning over the file;
- one error line naming the file, the line and the key (`check.yaml:3: batch_size must be at
  least 1, got 0`), for a value the field's own check refuses too, and "did you mean" for a
  misspelt key or flag;
- `--print-config`: the resolved options as YAML that `--config` reads back; nothing runs;
- positional arguments (a field whose `option(..., positional=True)`), flag groups in `--help`
  (`group=`), a list flag that may be repeated (`--pred a=x --pred b=y`), and boolean flags that
  take no value unless asked (`flags_take_values`: TRL's `--bf16 true` for training recipes).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from stepgap.config_files import (
    config_yaml,
    key_lines,
    nearest_name,
    parse_sets,
    read_mapping,
    suggest_choice,
)


class DefaultsFormatter(argparse.HelpFormatter):
    """`--help` shows each flag's default, when it has a meaningful one, and a flag once, as
    its parser writes it (`--batch-size` for stepgap's commands, `--learning_rate` for TRL's
    keys; the other spelling is taken too)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown: list[str] = []
        for flag in action.option_strings:  # a flag's `_`/`-` twin after it is not shown
            if flag.replace("_", "-") not in {f.replace("_", "-") for f in shown}:
                shown.append(flag)
        if shown == action.option_strings:
            return super()._format_action_invocation(action)
        twin = copy.copy(action)
        twin.option_strings = shown
        return super()._format_action_invocation(twin)

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


class _Extend(argparse.Action):
    """A list flag: repeated or with several values; its first use on the command line replaces
    the default (a configuration file's list), later uses add to it."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        current = getattr(namespace, self.dest)  # its default, set as parsing began
        items = [] if current is None or current is self.default else list(current)
        items.extend(values)
        setattr(namespace, self.dest, items)


class ArgumentParser(HfArgumentParser):
    """`HfArgumentParser` over `dataclass_types`, with `--config`, `--print-config` and errors
    that say where a value came from. `what` names the owner of the keys in errors
    ("`stepgap check`"); `refused_keys` are keys never taken from a file, with what to do
    instead (an API key); `renamed_keys` are keys of earlier versions, with their new name;
    `resolve_config` turns `--config`'s value into a file (a packaged recipe's name); `sets`
    adds `--set KEY=VALUE` (a key as the file would give it); `print_defaults`: `--print-config`
    prints every field (or only the ones given)."""

    def __init__(
        self,
        dataclass_types: Iterable[type] = (),
        *,
        what: str = "this command",
        refused_keys: Mapping[str, str] | None = None,
        renamed_keys: Mapping[str, str] | None = None,
        flags_take_values: bool = False,
        resolve_config: Callable[[str], Path] | None = None,
        config_help: str = "read the options from a YAML file (keys: the flag names); flags on "
        "the command line override it",
        sets: bool = False,
        print_defaults: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        self.what = what
        self.refused_keys = dict(refused_keys or {})
        self.renamed_keys = dict(renamed_keys or {})
        self.flags_take_values = flags_take_values
        self.resolve_config = resolve_config or _existing_file
        self.print_defaults = print_defaults
        # the run's own flags, which are not option keys
        self._run_dests = {"help", "config", "print_config", *(["set"] if sets else [])}
        self._flag_groups: dict[str, Any] = {}
        self._key_origins: dict[
            str, tuple[str, int | None, str]
        ] = {}  # dest -> (source, line, key)
        self._positional_dests: list[str] = []
        self.env: dict[str, Any] = {}  # a configuration file's `env:` mapping, as TrlParser's
        self._config_path: str | None = None  # the configuration file read
        self._given: set[str] = set()  # the keys the command line set
        super().__init__(dataclass_types=list(dataclass_types), **kwargs)
        g = self.add_argument_group("configuration file")
        g.add_argument("--config", metavar="FILE.yaml", help=config_help)
        if sets:
            g.add_argument(
                "--set",
                action="append",
                default=[],
                metavar="KEY=VALUE",
                help="give a key as the file would (a YAML value: null, true, 3)",
            )
        g.add_argument(
            "--print-config",
            action="store_true",
            help="print the resolved options as YAML (a file --config reads back) and exit",
        )

    # ------------------------------------------------------------------ making the flags

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        """argparse's, reading stepgap's field metadata: `group`, `positional`; boolean flags
        without a value and list flags that may be repeated (see the class docstring)."""
        group = kwargs.pop("group", None)
        if not self.flags_take_values:  # `--batch-size` first, as usage and help show it
            names = tuple(sorted(names, key=lambda n: "_" in n))
        if kwargs.pop("positional", False):
            dest = names[0].lstrip("-")
            kwargs.pop("required", None)
            if "default" in kwargs and kwargs.get("nargs") is None:
                kwargs["nargs"] = "?"
            self._positional_dests.append(dest)
            return super().add_argument(dest, **kwargs)
        if kwargs.get("type") is string_to_bool and not self.flags_take_values:
            for key in ("type", "nargs", "const"):
                kwargs.pop(key, None)
            kwargs["action"] = "store_true"
        elif kwargs.get("nargs") == "+" and "action" not in kwargs:
            kwargs["action"] = _Extend
        if kwargs.get("choices") and all(isinstance(c, str) for c in kwargs["choices"]):
            kwargs["type"] = _dashes_as_underscores(kwargs["choices"], kwargs.get("type") or str)
        if group is None:
            return super().add_argument(*names, **kwargs)
        if group not in self._flag_groups:
            self._flag_groups[group] = self.add_argument_group(group)
        return self._flag_groups[group].add_argument(*names, **kwargs)

    def _dest_actions(self) -> dict[str, argparse.Action]:
        """The first action of each option key (the flag itself, not a `--no_` twin)."""
        found: dict[str, argparse.Action] = {}
        for action in self._actions:
            if action.dest not in self._run_dests and action.dest != argparse.SUPPRESS:
                found.setdefault(action.dest, action)
        return found

    # ------------------------------------------------------------------ errors

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        """A one-line usage (what the command requires; `--help` lists the rest) and the error
        line (`explain`ed), exit status 2: the error is what a user reads, not forty options."""
        self.exit(2, f"{self.short_usage()}\n{self.prog}: error: {self.explain(message)}\n")

    def short_usage(self) -> str:
        """`usage: PROG -o OUTPUT [options] INPUT (PROG --help lists them)`: the required flags
        and the positional arguments only."""
        parts = [self.prog]
        for action in self._actions:
            if action.option_strings and action.required:
                flag = min(action.option_strings, key=len)
                parts.append(f"{flag} {action.metavar or action.dest.upper()}")
        parts.append("[options]")
        parts += [str(a.metavar or a.dest) for a in self._actions if not a.option_strings]
        return f"usage: {' '.join(parts)} ({self.prog} --help lists the options)"

    def explain(self, message: str) -> str:
        """argparse's error message with the flag a misspelt one was likely meant to be
        (`--entail-treshold`: did you mean --entail-threshold?), naming a flag once, as users
        write it (`--batch-size`, not `--batch-size/--batch_size`)."""
        message = re.sub(r"^argument (-[^/\s:]+)(?:/-[^\s:]+)+:", r"argument \1:", message)
        message = suggest_choice(message)
        if message.startswith("unrecognized arguments: "):
            known = [o for o in self._option_string_actions if o.startswith("--")]
            for token in message.removeprefix("unrecognized arguments: ").split():
                flag = token.split("=", 1)[0]
                close = nearest_name(flag, known)
                if flag.startswith("--") and close:
                    message += f" (did you mean {close}?)"
                    break
        return message

    def _unknown_flags(self, argv: Sequence[str]) -> list[str]:
        """The flags in `argv` this parser does not have (nor begins, as argparse allows): said
        first, so a mistyped flag is not hidden behind "the following arguments are required"."""
        known = list(self._option_string_actions)
        unknown = []
        for token in argv:
            if token == "--":
                break
            flag = token.split("=", 1)[0]
            if not flag.startswith("-") or flag == "-" or flag[1:2].isdigit() or flag[1:2] == ".":
                continue  # a value: a positional, a negative number
            if flag not in known and not any(k.startswith(flag) for k in known if flag[:2] == "--"):
                unknown.append(token)
        return unknown

    def unknown_key(self, key: str) -> str:
        """Why `key` is not taken, with the key it was likely meant to be."""
        if key in self.renamed_keys:
            return f"not a key of {self.what}: it is named {self.renamed_keys[key]} now"
        known = sorted(self._dest_actions())
        close = nearest_name(key, known, cutoff=0.6)
        if close:
            return f"not a key of {self.what}; did you mean {close}?"
        return f"not a key of {self.what} (its keys: {', '.join(known)})"

    def located(self, exc: Exception, given: Iterable[str] = ()) -> ValueError:
        """A value error raised by a field's check, prefixed by where that field's value came
        from: a file's line, `--set KEY`, or the flag (`given`: the keys set on the command
        line). The field is the one the message starts with (stepgap's checks), else the first
        flag it names (TRL's)."""
        message = str(exc)
        actions = self._dest_actions()
        match = re.match(r"([A-Za-z_]\w*)\b:? ?(.*)", message, re.S)
        leads = bool(match and match.group(1) in actions)  # the message starts with the key
        if leads:
            name, rest = match.group(1), match.group(2)  # type: ignore[union-attr]
        else:
            named = re.search(r"--([A-Za-z][\w-]*)", message)
            name, rest = (named.group(1).replace("-", "_") if named else ""), message
        if name in given and name in actions:
            return ValueError(f"argument {self._flag(actions[name])}: {rest}" if leads else message)
        origin = self._key_origins.get(name)
        if origin is None:
            return ValueError(message)
        source, line, key = origin
        if line is None:
            return ValueError(f"{source} {key}: {rest}")
        return ValueError(
            f"{source}:{line}: {message}" if leads else f"{source}:{line}: {key}: {message}"
        )

    def source_of(self, key: str) -> str:
        """Where `key` was given, to start an error about it: `FILE:LINE: KEY`, `--set KEY`,
        its flag, or the key."""
        origin = self._key_origins.get(key)
        if origin is not None:
            source, line, shown = origin
            return f"{source}:{line}: {shown}" if line is not None else f"{source} {shown}"
        action = self._dest_actions().get(key)
        if action is not None and key in self._given:
            return self._flag(action)
        return f"{self._config_path}: {key}" if self._config_path else key

    @staticmethod
    def _flag(action: argparse.Action) -> str:
        """The flag of an action as its help shows it (`--batch-size`, TRL's `--max_steps`)."""
        return action.option_strings[0] if action.option_strings else action.dest

    # ------------------------------------------------------------------ values from files

    def apply_file(self, path: str | Path, *, kind: str = "yaml") -> None:
        """Make the values of a configuration file (YAML, or JSON) the parser's defaults."""
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"{path}: file not found")
        self._config_path = str(path)
        text = file.read_text(encoding="utf-8")
        data = read_mapping(text, path, kind)
        lines = key_lines(text)
        env = data.pop("env", None)
        if env is not None:
            if not isinstance(env, dict):
                raise ValueError(f"{path}:{lines.get('env', 1)}: env: expected a mapping")
            for name, value in env.items():
                os.environ[str(name)] = str(value)
            self.env = {str(k): v for k, v in env.items()}
        self.apply_values(data, lambda key: (str(path), lines.get(key, 1), key))

    def apply_values(
        self, data: Mapping[str, Any], origin: Callable[[str], tuple[str, int | None, str]]
    ) -> None:
        """Make `data` (key -> value) the parser's defaults, each value checked as its flag
        would check the same text; `origin(key)` says where a key was given (file, line, key)."""
        actions = self._dest_actions()
        checked: dict[str, Any] = {}
        for key, value in data.items():
            source, line, shown = origin(str(key))
            where = f"{source}:{line}: {shown}" if line is not None else f"{source} {shown}"
            name = str(key).lstrip("-").replace("-", "_")
            if name in self.refused_keys:
                raise ValueError(f"{where}: {self.refused_keys[name]}")
            action = actions.get(name)
            if action is None:
                raise ValueError(f"{where}: {self.unknown_key(name)}")
            checked[name] = convert(action, value, where, mappings=self.flags_take_values)
            self._key_origins[name] = (source, line, shown)
        self.set_defaults(**checked)  # every action of that key (a flag and its --no_ twin)
        for action in self._actions:
            if action.dest in checked:
                action.required = False
                if not action.option_strings:  # a positional argument the file gave
                    action.nargs = {None: "?", "+": "*"}.get(action.nargs, action.nargs)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ parsing

    def parse(self, argv: Sequence[str] | None = None) -> tuple[Any, ...] | None:
        """The dataclasses of a command line, with its `--config` file's values and `--set`
        keys; None once `--print-config` has printed them (nothing is to run). A flag error
        exits as argparse's do; a file's error is a ValueError naming the file, line and key."""
        argv = list(sys.argv[1:] if argv is None else argv)
        config, sets, rest = self.run_flags(argv)
        if config is not None:
            self.apply_file(self.resolve_config(config))
        if sets:
            values = parse_sets(sets)
            self.apply_values(values, lambda key: ("--set", None, key))
        if unknown := self._unknown_flags(rest):
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        namespace = self.parse_args(rest)
        given = self._given = self.given_on_command_line(rest, namespace)
        self.namespace_ready(namespace, given)
        try:
            parsed = self.parse_dict(vars(namespace), allow_extra_keys=True)
        except (ValueError, TypeError) as exc:
            raise self.located(exc, given) from None
        if namespace.print_config:
            keys = None if self.print_defaults else {*self._key_origins, *given}
            if self.env:
                print(yaml.safe_dump({"env": self.env}, sort_keys=False), end="")
            print(config_yaml(parsed, keys), end="")
            return None
        return parsed

    def namespace_ready(self, namespace: argparse.Namespace, given: set[str]) -> None:
        """Called with the parsed flags before the dataclasses are made: a subclass fills a
        default that depends on other values (a training recipe's bf16). Nothing here."""

    def run_flags(self, argv: list[str]) -> tuple[str | None, list[str], list[str]]:
        """(`--config`'s value, the `--set` values, the rest): read before the rest is parsed,
        since the file's values become the parser's defaults."""
        config, sets, rest = None, [], []
        has_set = "--set" in self._option_string_actions
        args = list(argv)
        while args:
            token = args.pop(0)
            name, eq, value = token.partition("=")
            if token == "--":
                rest.extend([token, *args])
                break
            if name == "--config" or (name == "--set" and has_set):
                if not eq:
                    if not args:
                        self.error(f"argument {name}: expected one argument")
                    value = args.pop(0)
                if name == "--config":
                    config = value
                else:
                    sets.append(value)
            else:
                rest.append(token)
        return config, sets, rest

    def given_on_command_line(self, argv: Sequence[str], namespace: argparse.Namespace) -> set[str]:
        """The keys that `argv` set: its flags', and the positional arguments whose value is
        not the one a file gave."""
        given = set()
        for token in argv:
            action = self._option_string_actions.get(token.split("=", 1)[0])
            if token.startswith("-") and action is not None:
                given.add(action.dest)
        for dest in self._positional_dests:
            if dest not in self._key_origins or getattr(namespace, dest) != self.get_default(dest):
                given.add(dest)
        return given

    def parse_file(self, path: str | Path, *, kind: str = "json") -> tuple[Any, ...]:
        """The dataclasses of a configuration file alone (a reward worker's JSON file): the
        same keys, checks and error lines as a command's `--config`."""
        self.apply_file(path, kind=kind)
        namespace = self.parse_args([])
        try:
            return self.parse_dict(vars(namespace), allow_extra_keys=True)
        except (ValueError, TypeError) as exc:
            raise self.located(exc) from None


def _existing_file(path: str) -> Path:
    return Path(path)


def convert(action: argparse.Action, value: Any, where: str, *, mappings: bool = False) -> Any:
    """A configuration value checked and converted as its flag would be on the command line:
    a boolean flag takes true or false, a list flag a list or one value. `mappings`: a text
    key may hold a mapping or a list, which its dataclass reads (a training recipe's
    `model_init_kwargs`, `report_to`)."""
    if value is None:  # `--print-config` writes an unset key as null
        return None
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(action, _Extend) or action.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        return [flag_value(action, v, where) for v in items]
    if mappings and isinstance(value, list | dict) and action.type in (None, str):
        return value
    return flag_value(action, value, where)


def flag_value(action: argparse.Action, value: Any, where: str) -> Any:
    """One value of a configuration key, checked and converted as its flag (`action`) would
    check the same text on the command line. Errors start with `where` (file, line and key)."""
    if isinstance(value, list | dict):
        raise ValueError(f"{where}: expected a single value, got {type(value).__name__}")
    convert_text = action.type
    if isinstance(value, bool) and convert_text is not string_to_bool:
        wanted = "text" if convert_text in (None, str) else "a number"  # `cache: false`
        raise ValueError(f"{where}: expected {wanted}, got {str(value).lower()}")
    if callable(convert_text):
        try:  # the value as the command line gives it, as text: 2.5 is no int, true no number
            value = convert_text(value if isinstance(value, str) else str(value))
        except Exception as exc:  # TypeError, ValueError, argparse's ArgumentTypeError
            raise ValueError(f"{where}: {value!r} is not a valid value ({exc})") from None
    elif not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def _dashes_as_underscores(choices: Sequence[str], convert: Callable[[str], Any]) -> Any:
    """A choice's type that also takes its dashed spelling (`typed-shape` for `typed_shape`),
    as every flag name does."""

    def choice(value: str) -> Any:
        dashed = value.replace("-", "_")
        return convert(dashed if value not in choices and dashed in choices else value)

    return choice
