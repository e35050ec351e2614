"""Options as data, in one style: frozen dataclasses whose fields carry their help.

Every set of options stepgap has is a dataclass of this kind, in the style of TRL's and
transformers' argument classes: a command's flags (`stepgap.cli`), a backend's options (each
judge, NLI model, policy and retriever declares its own class, `options_class`), the tree's
thresholds (`TreeConfig`), the checker's configuration (`CheckerConfig`) and the reward's
(`RewardOptions`). One parser, `stepgap.arguments.ArgumentParser` (transformers'
`HfArgumentParser`), makes flags, `--config FILE.yaml` keys and reward-file keys from the
fields, so a field's name is its key everywhere: in Python, on the command line (dashes or
underscores) and in a file.

A field is declared with `option(default, help, ...)`. Values are checked in `__post_init__`,
whichever way they came, with a message that starts with the field's name (`batch_size must be
at least 1, got 0`), so the parser can say where a wrong value came from (a file's line, a flag).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

O = TypeVar("O", bound="Options")  # noqa: E741


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    metavar: str | None = None,
    group: str | None = None,
    positional: bool = False,
    aliases: list[str] | None = None,
    nargs: str | None = None,
    const: Any = None,
) -> Any:
    """A dataclass field that is also a flag and a configuration key: its default, its help
    (`--help`), and how the command line shows it (`metavar`, its `group` of flags in `--help`,
    `positional`: an argument given without a flag, `aliases`: more flags such as `-o`,
    `nargs="?"` with `const`: a flag that may be given without its value). A list default is
    copied for each instance."""
    metadata: dict[str, Any] = {"help": help}
    if nargs is not None:
        metadata.update(nargs=nargs, const=const)
    if metavar is not None:
        metadata["metavar"] = metavar
    if group is not None:
        metadata["group"] = group
    if positional:
        metadata["positional"] = True
    if aliases:
        metadata["aliases"] = aliases
    if isinstance(default, list):
        items = list(default)
        return dataclasses.field(default_factory=lambda: list(items), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Options:
    """The base of every options class: no fields of its own (a backend that takes no options
    has this one), checks that chain (`__post_init__` of each class in turn, so a class made of
    several option classes checks them all), and the field-wise helpers below."""

    def __post_init__(self) -> None:
        """Check the values; a subclass checks its own fields, then calls this."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Its fields' names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each field's default value."""
        return {f.name: _default(f) for f in dataclasses.fields(cls)}

    def changed(self) -> dict[str, Any]:
        """The fields whose value is not the default: what was set."""
        defaults = self.defaults()
        return {n: getattr(self, n) for n in self.names() if getattr(self, n) != defaults[n]}

    @classmethod
    def take(cls: type[O], source: Options | Mapping[str, Any]) -> O:
        """This class's fields, taken by name from a larger options object (a `CheckerConfig`
        holds every judge's options) or a mapping; the ones `source` lacks keep their default."""
        values = dict(source) if isinstance(source, Mapping) else vars(source)
        return cls(**{n: values[n] for n in cls.names() if n in values})


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def bases_of(*classes: type[Options]) -> tuple[type[Options], ...]:
    """The bases of one options class that holds the fields of all `classes` (`CheckerConfig`
    holds every judge's): each class once, in the order given, less those another one extends
    (its fields come with it) and the base `Options`. A field that two of them declare must
    agree, the same type and default (the flag has one of each): otherwise a TypeError at
    import that names the field and both classes."""
    kept = [c for c in dict.fromkeys(classes) if c is not Options]
    kept = [c for c in kept if not any(o is not c and issubclass(o, c) for o in kept)]
    seen: dict[str, tuple[type[Options], Any, Any]] = {}
    for cls in kept:
        for f in dataclasses.fields(cls):
            mine = (cls, f.type, _default(f))
            other = seen.setdefault(f.name, mine)
            if other[1:] != mine[1:]:
                raise TypeError(
                    f"option {f.name!r} is declared twice, differently: "
                    f"{_described(other, f.name)} and {_described(mine, f.name)}; give one "
                    "another name, or the same type and default"
                )
    return tuple(kept)


def _described(declared: tuple[type[Options], Any, Any], name: str) -> str:
    cls, kind, default = declared
    return f"{cls.__module__}.{cls.__qualname__}.{name}: {kind} = {default!r}"


def overrides_of(cls: type[Options], name: str, note: str = "") -> type[Options]:
    """The same fields as `cls` with no defaults of their own (None: not given), for a command
    that changes only what it is told (`relabel` starts from the tree each verdict recorded);
    `note` is added to each field's help. Given values are checked as `cls` checks them."""

    def check(self: Options) -> None:
        given = {n: v for n, v in vars(self).items() if v is not None}
        if given:
            dataclasses.replace(cls(), **given)  # the checks of `cls`, raised as it raises them

    fields = [
        (
            f.name,
            f.type,
            dataclasses.field(
                default=None, metadata={**f.metadata, "help": f.metadata.get("help", "") + note}
            ),
        )
        for f in dataclasses.fields(cls)
    ]
    made = dataclasses.make_dataclass(
        name, fields, bases=(Options,), frozen=True, namespace={"__post_init__": check}
    )
    made.__module__ = cls.__module__
    return made


# Checks for `__post_init__`: each raises a ValueError that starts with the field's name.


def at_least_one(name: str, value: int | None) -> None:
    """A count (a batch, a limit, requests in flight): None (not set) or 1 and more."""
    if value is not None and (isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be at least 1, got {value}")


def more_than_zero(name: str, value: float | None) -> None:
    """An amount (GiB, seconds): None (not set) or more than 0."""
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be more than 0, got {value}")


def one_of(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """A value of a `Literal` field, for Python callers (the parser checks the flag's choices)."""
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {shown}, got {value!r}")
