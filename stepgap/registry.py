"""Backends named by spec strings (`KIND:ARG`): each kind's built-ins listed in code, and
plug-ins from other distributions found through Python entry points.

Each kind of backend is one `Registry`: judges (`teacher/judges`), NLI models (`teacher/nli`),
rollout policies and retrievers (`data_builders`) and baselines (`eval`). A registry lists its
layer's own backends in code (`builtin`: kind -> `module:attribute`, imported when a spec first
asks for it, in the manner of lm-evaluation-harness's `MODEL_MAPPING`); a layer above adds its
own with `register` (the student's `student:` judge, when `stepgap.student` is imported); a
plug-in package declares its backends under the registry's entry-point group (`stepgap.judges`,
`stepgap.nli`, `stepgap.policies`, `stepgap.retrievers`, `stepgap.baselines`). What a backend
builds must be an instance of the registry's `interface` (the abstract class of its kind).

Every spec parses the same way: `KIND:ARG`, or for kinds with a default backend (a bare hub id
for NLI and policies, an index folder for retrievers) the whole spec as that backend's ARG. A
backend is built as `factory(ARG, **options)`. An option its factory does not take is an error
naming the option and the backend; a value wrapped in `Default` (a setting the user left at its
default) goes only to backends that take it.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class UnknownBackendError(ValueError):
    """A spec whose kind no installed backend registers."""


class BackendTypeError(ValueError):
    """A backend whose factory built something that is not of its kind's interface."""


class BackendOptionError(ValueError):
    """An option the backend's factory does not take: `option`, and the ones `taken`."""

    def __init__(self, message: str, option: str = "", taken: frozenset[str] = frozenset()):
        super().__init__(message)
        self.option, self.taken = option, taken


@dataclass(frozen=True)
class Default(Generic[T]):
    """A setting left at its default: passed to a backend only when its factory takes it."""

    value: T


def taken_options(factory: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword options `factory(arg, **options)` takes; None when it takes any. A class
    whose `__init__` passes `**options` on takes what its bases' `__init__` take."""
    owners = (
        [c for c in factory.__mro__ if "__init__" in vars(c)] if inspect.isclass(factory) else []
    )
    callables: list[Callable[..., Any]] = [c.__init__ for c in owners] or [factory]  # type: ignore[misc]
    names: set[str] = set()
    for target in callables:
        params = list(inspect.signature(target).parameters.values())
        if owners:
            params = params[1:]  # self
        var_keyword = False
        for i, p in enumerate(params):
            if p.kind is p.VAR_KEYWORD:
                var_keyword = True
            elif i > 0 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                names.add(p.name)  # the first parameter is the spec's ARG
        if not var_keyword:
            return frozenset(names)
    return None


@dataclass
class Registry(Generic[T]):
    """One kind of backend: `what` names it in messages ("judge"), `group` is its entry-point
    group for plug-ins, `builtin` its own backends (kind -> `module:attribute`), `interface`
    the class every backend builds an instance of; `default` is the backend of a spec without a
    known `KIND:` prefix; `arg_required`: a spec must carry an ARG (a baseline's name alone is a
    whole spec)."""

    what: str
    group: str
    builtin: dict[str, str] = field(default_factory=dict)
    interface: type | None = None
    default: str | None = None
    arg_required: bool = True
    bare: str | None = None  # what a spec without `KIND:` may have meant, `{spec}` filled in
    _added: dict[str, Callable[..., T] | str] = field(default_factory=dict, repr=False)
    _found: tuple[tuple[str, ...], dict[str, str]] | None = field(default=None, repr=False)

    def plugins(self) -> dict[str, str]:
        """The backends other distributions declare under `group` (kind -> entry point); one
        that reuses a built-in kind is passed over, with a warning."""
        key = tuple(sys.path)  # a distribution added to sys.path is found on the next call
        if self._found is None or self._found[0] != key:
            found = {}
            for ep in entry_points(group=self.group):
                if ep.name in self.builtin:
                    log.warning(
                        "%s: the entry point %s = %s reuses stepgap's own %s kind %r; it is "
                        "passed over", self.group, ep.name, ep.value, self.what, ep.name,
                    )  # fmt: skip
                    continue
                found[ep.name] = ep.value
            self._found = (key, found)
        return self._found[1]

    def names(self) -> list[str]:
        """Every kind a spec may name: the built-ins, those registered here, the plug-ins."""
        return sorted({*self.builtin, *self._added, *self.plugins()})

    def register(self, name: str, factory: Callable[..., T] | str) -> None:
        """Add a backend for this process: a callable, or its import path `module:attr`."""
        self._added[name] = factory

    def parse(self, spec: str) -> tuple[str, str]:
        """`KIND:ARG` -> (KIND, ARG); a spec of no known kind goes to the default backend."""
        name, sep, arg = spec.partition(":")
        known = self.names()
        if name in known and (sep or not self.arg_required):
            return name, arg
        if self.default is not None:
            return self.default, spec
        shown = ", ".join(f"{k}:..." if self.arg_required else k for k in known)
        hint = f"; did you mean {self.bare.format(spec=spec)}?" if self.bare and not sep else ""
        raise UnknownBackendError(
            f"unknown {self.what} spec {spec!r}; expected one of {shown} (stepgap's own and the "
            f"plug-ins of the entry-point group {self.group}){hint}"
        )

    def factory(self, name: str) -> Callable[..., T]:
        """The factory of backend `name`, imported now."""
        entry = self.builtin.get(name) or self._added.get(name) or self.plugins().get(name)
        if entry is None:
            raise UnknownBackendError(f"no {self.what} backend {name!r} in {self.group}")
        return resolve(entry)

    def takes(self, name: str, option: str) -> bool:
        """Whether backend `name`'s factory takes `option`."""
        taken = taken_options(self.factory(name))
        return taken is None or option in taken

    def requires(self, name: str, option: str) -> bool:
        """Whether backend `name`'s factory cannot be built without `option`."""
        param = inspect.signature(self.factory(name)).parameters.get(option)
        return param is not None and param.default is param.empty

    def call(self, name: str, arg: str, **options: Any) -> T:
        """`factory(arg, **options)` of backend `name`, its options checked first (see
        `call_checked`), and what it built checked against `interface`."""
        what = f"the {self.what} backend {name!r}"
        built = call_checked(self.factory(name), arg, what, **options)
        return built if self.interface is None else of_interface(built, self.interface, what)

    def build(self, spec: str, **options: Any) -> T:
        """The backend a spec names, built with `options` (see `call`)."""
        name, arg = self.parse(spec)
        return self.call(name, arg, **options)


def call_checked(factory: Callable[..., T], arg: str, what: str, **options: Any) -> T:
    """`factory(arg, **options)`, its options checked first: None values, and `Default` values
    the factory does not take, are left out; any other option it does not take is a
    `BackendOptionError` naming it and `what` (the backend, in the message)."""
    taken = taken_options(factory)
    given: dict[str, Any] = {}
    for key, value in options.items():
        fallback = isinstance(value, Default)
        value = value.value if fallback else value
        if value is None or (fallback and taken is not None and key not in taken):
            continue
        if taken is not None and key not in taken:
            accepted = ", ".join(sorted(taken)) or "none"
            raise BackendOptionError(
                f"{what} takes no option {key!r} (it takes: {accepted})", option=key, taken=taken
            )
        given[key] = value
    return factory(arg, **given)


def of_interface(built: Any, interface: type, what: str) -> Any:
    """`built`, if it is an instance of `interface`; else a `BackendTypeError` naming `what`."""
    if not isinstance(built, interface):
        raise BackendTypeError(
            f"{what} built a {type(built).__name__}, which is not a "
            f"{interface.__module__}.{interface.__name__}: subclass it"
        )
    return built


def resolve(entry: str | Callable[..., Any]) -> Callable[..., Any]:
    """The callable an entry names: itself, or the object at `"module:attribute.path"`."""
    if callable(entry):
        return entry
    import importlib

    module, _, attribute = entry.partition(":")
    target: Any = importlib.import_module(module)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target
