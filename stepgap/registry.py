"""Backends named by spec strings, wherever their code lives.

A registry (judge specs such as `student:PATH`, the offline checker behind `--bundle`) sits in
the layer that reads the spec. A backend from a layer above it is entered by its import path,
`"package.module:attribute"`, and imported when it is first asked for, as Python entry points
are: the registry's layer never imports the layers above it, and a user who never asks for the
backend never imports its dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def resolve(entry: str | Callable[..., Any]) -> Callable[..., Any]:
    """The callable an entry names: itself, or the object at `"module:attribute.path"`."""
    if callable(entry):
        return entry
    module, _, attribute = entry.partition(":")
    target: Any = importlib.import_module(module)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target
