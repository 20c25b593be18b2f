"""Lazy package exports (PEP 562), for ``agents.wam`` and ``agents.wam.fastwam``.

A package lists the names it re-exports by source module; a module is imported on the first use of one of
its names, so importing a light submodule (a config) does not import diffusers and the models.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any], sources: Mapping[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` of the package whose ``globals()`` is ``namespace``;
    ``sources`` maps a module to the names the package re-exports from it."""
    module_of = {name: module for module, names in sources.items() for name in names}
    exported = sorted(module_of)

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name]), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return exported

    return exported, __getattr__, __dir__
