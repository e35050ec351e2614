"""Backends named by spec strings (`KIND:ARG`): each kind's built-ins listed in code, and
plug-ins from other distributions found through Python entry points.

Each kind of backend is one `Registry`: judges (`teacher/judges`), NLI models (`teacher/nli`),
rollout policies and retrievers (`data_builders`) and baselines (`eval`). A registry knows its
layer's own backends (`Registry.builtins()` lists them): a table in code (`builtin`: kind ->
`module:Class`, imported when a spec first asks for it, in the manner of lm-evaluation-harness's
`MODEL_MAPPING`), or the backend modules of a package (`package`: the judges, where a new judge is
one file; `backends_in`); a layer above adds its own with `register` (the student's `student:`
judge, when `stepgap.student` is imported); a plug-in package declares its backends under the
registry's entry-point group (`stepgap.judges`, `stepgap.nli`, `stepgap.policies`,
`stepgap.retrievers`, `stepgap.baselines`).

A backend is a subclass of its kind's abstract class (`interface`), itself a `Backend`: it
declares its options as a dataclass of its own (`options_class`, `stepgap.options`), and a spec
builds it with `from_spec(ARG, options, **context)`. Every spec parses the same way: `KIND:ARG`,
or for kinds with a default backend (a bare hub id for NLI and policies, an index folder for
retrievers) the whole spec as that backend's ARG. An option the backend's class does not have is
an error naming the option and the backend.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import sys
from abc import ABC
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import FunctionType
from typing import Any, ClassVar, Generic, TypeVar

from stepgap.options import Options

B = TypeVar("B", bound="Backend")

log = logging.getLogger(__name__)


class UnknownBackendError(ValueError):
    """A spec whose kind no installed backend registers."""


class BackendTypeError(ValueError):
    """A backend that is not a subclass of its kind's interface."""


class BackendOptionError(ValueError):
    """An option the backend does not take: `option`, and the ones it takes (`taken`)."""

    def __init__(self, message: str, option: str = "", taken: tuple[str, ...] = ()):
        super().__init__(message)
        self.option, self.taken = option, taken


class Backend(ABC):  # noqa: B024 - abstract through its kinds' interfaces, not here
    """What every backend a spec names is, whatever its kind: the options it takes, as a
    dataclass of its own, and how a spec builds it."""

    #: the options it takes (flags and configuration keys); the base `Options` has none
    options_class: ClassVar[type[Options]] = Options

    @classmethod
    def from_spec(cls, arg: str, options: Options, **context: Any) -> Backend:
        """The backend a spec `KIND:ARG` names, with its options; `context` is what its kind
        gives every backend beside the options (a judge: whether it serves online).
        `cls(arg, options)` by default."""
        return cls(arg, options)  # type: ignore[call-arg]


def make_options(
    backend: type[Backend], given: Options | Mapping[str, Any] | None, what: str
) -> Options:
    """The options object of `backend`: `given` as it is (an instance of its options class), or
    made from a mapping of field names, an unknown name an error naming it and `what`."""
    wanted = backend.options_class
    if given is None:
        return wanted()
    if isinstance(given, Options):
        if not isinstance(given, wanted):
            raise BackendOptionError(
                f"{what} takes {wanted.__name__}, not {type(given).__name__}", taken=wanted.names()
            )
        return given
    given = {k: v for k, v in given.items() if v is not None}  # None: not set
    for key in given:
        if key not in wanted.names():
            taken = ", ".join(wanted.names()) or "none"
            raise BackendOptionError(
                f"{what} takes no option {key!r} (it takes: {taken})",
                option=key,
                taken=wanted.names(),
            )
    return wanted(**given)


def options_for(
    config: Options, backend: type[Backend], among: Iterable[type[Options]], what: str
) -> Options:
    """The options of `backend` taken by name from `config`, a configuration that holds those of
    several backends of one kind (`among`: their options classes); a field of theirs that is set
    but that `backend` does not take is an error naming the option (as a key and a flag, for
    Python and the command line alike) and those it takes: `option engine (--engine) does not
    apply to the judge openai:m; it takes: base_url, ...`."""
    wanted = backend.options_class
    of_kind = {name for options in among for name in options.names()}
    for name in config.changed():
        if name in of_kind and name not in wanted.names():
            takes = ", ".join(wanted.names()) or "no options"
            raise BackendOptionError(
                f"option {name} ({flag(name)}) does not apply to {what}; it takes: {takes}",
                option=name,
                taken=wanted.names(),
            )
    return wanted.take(config)


def flag(name: str) -> str:
    """The flag of an option key: `--base-url` for `base_url`."""
    return "--" + name.replace("_", "-")


@dataclass
class Registry(Generic[B]):
    """One kind of backend: `what` names it in messages ("judge"), `group` is its entry-point
    group for plug-ins, `interface` the abstract class every backend subclasses, `builtin` its
    own backends as a table (kind -> `module:Class`) and `package` a package whose modules
    define its own backends (`backends_in`); `default` is the backend of a spec without a known
    `KIND:` prefix; `arg_required`: a spec must carry an ARG (a baseline's name alone is a whole
    spec); `bare` what a spec without `KIND:` may have meant, `{spec}` filled in."""

    what: str
    group: str
    interface: type[B]
    builtin: dict[str, str] = field(default_factory=dict)
    default: str | None = None
    arg_required: bool = True
    bare: str | None = None
    package: str | None = None
    _added: dict[str, type[B] | str] = field(default_factory=dict, repr=False)
    _found: tuple[tuple[str, ...], dict[str, str]] | None = field(default=None, repr=False)
    _in_package: dict[str, type[B]] | None = field(default=None, repr=False)

    def builtins(self) -> dict[str, type[B] | str]:
        """stepgap's own backends of this kind (kind -> class or `module:Class`), in kind order:
        the `builtin` table and the backends `package` defines (found once per process)."""
        if self.package is not None and self._in_package is None:
            self._in_package = backends_in(self.package, self.interface, self.what)
        return dict(sorted({**self.builtin, **(self._in_package or {})}.items()))

    def options_classes(self) -> tuple[type[Options], ...]:
        """The options classes of stepgap's own backends of this kind (`builtins`, imported
        now), in kind order: each backend's `options_class`, and every other options class its
        module defines beside it, for a backend a layer above builds on it (the student judge's
        `StudentJudgeOptions`, beside the local judge's). The base `Options`, which holds no
        field, is left out. A configuration that holds the options of every backend of the kind
        derives from these (`CheckerConfig`, with `stepgap.options.bases_of`)."""
        found: dict[type[Options], None] = {}
        for entry in self.builtins().values():
            backend = resolve(entry)
            found[backend.options_class] = None
            module = sys.modules[backend.__module__]
            for obj in vars(module).values():
                if _options_class_of(obj, module.__name__):
                    found[obj] = None
        return tuple(c for c in found if c is not Options)

    def own(self) -> dict[str, type[B] | str]:
        """stepgap's own backends of this kind: `builtins`, and those a layer above registered
        in this process (the student's judge, once `stepgap.student` is imported); no plug-in."""
        return {**self.builtins(), **self._added}

    def plugins(self) -> dict[str, str]:
        """The backends other distributions declare under `group` (kind -> entry point); one
        that reuses a built-in kind is passed over, with a warning."""
        key = tuple(sys.path)  # a distribution added to sys.path is found on the next call
        if self._found is None or self._found[0] != key:
            found = {}
            for ep in entry_points(group=self.group):
                if ep.name in self.builtins():
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
        return sorted({*self.builtins(), *self._added, *self.plugins()})

    def register(self, name: str, backend: type[B] | str) -> None:
        """Add a backend for this process: its class, or its import path `module:Class`."""
        self._added[name] = backend

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

    def backend(self, name: str) -> type[B]:
        """The class of backend `name`, imported now; one that does not subclass `interface`
        is an error naming the class to subclass."""
        own = self.builtins().get(name) or self._added.get(name)
        entry = own or self.plugins().get(name)
        if entry is None:
            raise UnknownBackendError(f"no {self.what} backend {name!r} in {self.group}")
        found = resolve(entry)
        if not (isinstance(found, type) and issubclass(found, self.interface)):
            shown = found.__name__ if isinstance(found, type | FunctionType) else repr(found)
            raise BackendTypeError(
                f"the {self.what} backend {name!r} is {shown}, which is not a subclass of "
                f"{self.interface.__module__}.{self.interface.__name__}: subclass it"
            )
        return found

    def backend_of(self, spec: str) -> type[B]:
        """The class of the backend a spec names."""
        return self.backend(self.parse(spec)[0])

    def build(
        self, spec: str, options: Options | Mapping[str, Any] | None = None, **context: Any
    ) -> B:
        """The backend a spec names, built with `options` (an instance of its options class,
        or a mapping of its field names; none: its defaults) and its kind's `context`."""
        name, arg = self.parse(spec)
        backend = self.backend(name)
        what = f"the {self.what} backend {name!r}"
        return backend.from_spec(arg, make_options(backend, options, what), **context)  # type: ignore[return-value]


# A class-level `name = ...` (or `name: str = ...`) line: the mark of a module that may define a
# backend, read from its source so that helper modules are never imported to find out.
_NAMES_A_KIND = re.compile(r"^    name(?:: [^=\n]+)? = ", re.M)


def backends_in(package: str, interface: type[B], what: str = "backend") -> dict[str, type[B]]:
    """The backends the modules of `package` define, by kind: each class that subclasses
    `interface`, is defined in its module, is not abstract and sets its own `name` (the KIND of
    its specs). Adding a backend is adding its module: no table to edit. Only the modules whose
    source sets a class-level `name` are imported (the others are helpers, and one may import
    a heavy library such as transformers at module level). Two backends of one kind are an
    error naming both."""
    found: dict[str, type[B]] = {}
    for folder in importlib.import_module(package).__path__:
        for path in sorted(Path(folder).glob("*.py")):
            if path.name.startswith("_") or not _NAMES_A_KIND.search(path.read_text("utf-8")):
                continue
            module = importlib.import_module(f"{package}.{path.stem}")
            for obj in vars(module).values():
                if not _backend_of(obj, interface, module.__name__):
                    continue
                if obj.name in found:  # type: ignore[attr-defined]
                    other = found[obj.name]  # type: ignore[attr-defined]
                    raise TypeError(
                        f"two {what} backends of kind {obj.name!r}: "  # type: ignore[attr-defined]
                        f"{other.__module__}.{other.__qualname__} and "
                        f"{obj.__module__}.{obj.__qualname__}; give one another name"
                    )
                found[obj.name] = obj  # type: ignore[attr-defined]
    return found


def _backend_of(obj: Any, interface: type, module: str) -> bool:
    """Whether `obj` is a backend that module `module` defines under a kind of its own."""
    return (
        isinstance(obj, type)
        and issubclass(obj, interface)
        and obj is not interface
        and obj.__module__ == module
        and "name" in vars(obj)
        and not inspect.isabstract(obj)
    )


def _options_class_of(obj: Any, module: str) -> bool:
    """Whether `obj` is an options class that module `module` defines."""
    return isinstance(obj, type) and issubclass(obj, Options) and obj.__module__ == module


def resolve(entry: str | Callable[..., Any] | type) -> Any:
    """The object an entry names: itself, or the object at `"module:attribute.path"`."""
    if not isinstance(entry, str):
        return entry

    module, _, attribute = entry.partition(":")
    target: Any = importlib.import_module(module)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target
