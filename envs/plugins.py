"""Suites from other packages: the entry points of the group ``wam_gym.suites``.

A package adds a benchmark by naming its suite's header module (envs/header.py) in its pyproject.toml::

    [project.entry-points."wam_gym.suites"]
    mybench = "mybench"

and the registry loads it after the built-in suites (docs/evaluate/add-a-benchmark.md). A plugin that fails to
import, or whose header the registry refuses, is skipped with one logged line naming its entry point and the fix:
an installed package must never take the built-in suites (or ``import gymnasium``, whose hook builds the registry)
down with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType

from envs.errors import SuiteHeaderError

GROUP = "wam_gym.suites"
log = logging.getLogger(__name__)


def load_plugins(add: Callable[[ModuleType], object]) -> dict[str, str]:
    """``add`` each plugin's header module, in entry-point name order; return each skipped one's name and why."""
    skipped = {}
    for entry in sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        try:
            add(_header(entry))
        except Exception as exc:  # whatever a plugin raises, the built-in suites stay
            skipped[entry.name] = _skipped(entry, exc)
            log.warning(skipped[entry.name])
    return skipped


def _header(entry: EntryPoint) -> ModuleType:
    loaded = entry.load()
    if not isinstance(loaded, ModuleType):
        raise SuiteHeaderError(f"it names {type(loaded).__name__} {entry.value!r}, not a module: point it at the "
                               f"suite's header module, {entry.name} = \"{entry.module}\"")
    return loaded


def _skipped(entry: EntryPoint, exc: Exception) -> str:
    """One line: which entry point, from which package, what went wrong, and what to do."""
    dist = getattr(entry, "dist", None)
    package = dist.metadata["Name"] if dist is not None else None
    source = f" of package {package!r}" if package else ""
    reason = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, SuiteHeaderError):
        fix = "fix its header as said"
    else:
        reason = f"{type(exc).__name__}: {reason}"
        fix = f"see why with: python -c 'import {entry.module}'"
    uninstall = f", or uninstall it: pip uninstall {package}" if package else ""
    return (f"wam_gym: skipped suite plugin {entry.name} = {entry.value!r} ({GROUP} entry point{source}): {reason}; "
            f"{fix}{uninstall}")
