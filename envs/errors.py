"""Errors that tell the user what to do next."""

from __future__ import annotations

import importlib
from types import ModuleType


class UnknownEnvError(ValueError):
    pass


class MissingSimulatorError(ImportError):
    pass


class MissingAssetsError(FileNotFoundError):
    pass


class SuiteHeaderError(ValueError):
    """A suite's header (envs/header.py) is not what the registry takes; the message says what to change."""


def import_simulator(module: str, suite: str, extra: str) -> ModuleType:
    """Import a simulator package, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingSimulatorError(
            f"{suite} needs the '{module}' package, which is not importable ({exc}). "
            f"Install it with: pip install 'wam_gym[{extra}]' (one simulator extra per virtual environment; "
            f"their MuJoCo pins clash)"
        ) from exc
