"""Backends named by spec strings (`KIND:ARG`): each kind's built-ins listed in code, and
plug-ins from other distributions found through Python entry points.

Each kind of backend is one `Registry`: judges (`teacher/judges`), NLI models (`teacher/nli`),
rollout policies and retrievers (`data_builders`) and baselines (`eval`). A registry lists its
layer's own backends in code (`builtin`: kind -> `module:Class`, imported when a spec first asks
for it, in the manner of lm-evaluation-harness's `MODEL_MAPPING`); a layer above adds its own
with `register` (the student's `student:` judge, when `stepgap.student` is imported); a plug-in
package declares its backends under the registry's entry-point group (`stepgap.judges`,
`stepgap.nli`, `stepgap.policies`, `stepgap.retrievers`, `stepgap.baselines`).

A backend is a subclass of its kind's abstract class (`interface`), itself a `Backend`: it
declares its options as a dataclass of its own (`options_class`, `stepgap.options`), and a spec
builds it with `from_spec(ARG, options, **context)`. Every spec parses the same way: `KIND:ARG`,
or for kinds with a default backend (a bare hub id for NLI and policies, an index folder for
retrievers) the whole spec as that backend's ARG. An option the backend's class does not have is
an error naming the option and the backend.
"""

from __future__ import annotations

import logging
import sys
from abc import ABC
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
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
    own backends (kind -> `module:Class`); `default` is the backend of a spec without a known
    `KIND:` prefix; `arg_required`: a spec must carry an ARG (a baseline's name alone is a whole
    spec); `bare` what a spec without `KIND:` may have meant, `{spec}` filled in."""

    what: str
    group: str
    interface: type[B]
    builtin: dict[str, str] = field(default_factory=dict)
    default: str | None = None
    arg_required: bool = True
    bare: str | None = None
    _added: dict[str, type[B] | str] = field(default_factory=dict, repr=False)
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
        entry = self.builtin.get(name) or self._added.get(name) or self.plugins().get(name)
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


def resolve(entry: str | Callable[..., Any] | type) -> Any:
    """The object an entry names: itself, or the object at `"module:attribute.path"`."""
    if not isinstance(entry, str):
        return entry
    import importlib

    module, _, attribute = entry.partition(":")
    target: Any = importlib.import_module(module)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target
