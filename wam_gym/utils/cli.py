"""One-line errors for the Hydra command lines (``python -m wam_gym.eval``, ``python -m training``).

Hydra reports a bad override over several lines that end in a hint about HYDRA_FULL_ERROR (and
advises ``+key=value`` for a misspelt key of a dataclass, which cannot work). Here it is one
``error: ...`` line on stderr, with the nearest valid key, and exit status 1. Setting
HYDRA_FULL_ERROR=1 yourself still gives Hydra's full traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Callable, Mapping
from typing import NoReturn


def fail(message: object) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit 1."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def run_hydra(main: Callable[[], None], prog: str, moved: Mapping[str, str] | None = None) -> None:
    """Call a ``@hydra.main`` function; a config that does not compose is one line naming the fix (``moved``: old
    knob -> its new name, for the knobs a release renamed)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises the error instead of printing it
    try:
        main()
    except (HydraException, OmegaConfBaseException) as exc:
        fail(config_error(exc, prog, moved or {}))
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def config_error(exc: BaseException, prog: str, moved: Mapping[str, str] | None = None) -> str:
    """A Hydra/OmegaConf error as one line."""
    cause = exc.__cause__
    if cause is None:
        return _squash(str(exc))
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    key, parent = getattr(cause, "key", None), getattr(cause, "parent_node", None)
    unknown_key = isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and isinstance(key, str) and parent is not None
    if unknown_key and dataclasses.is_dataclass(getattr(cause, "object_type", None)):
        # A misspelt field of a structured config: "+key=" cannot add it, a near name can fix it.
        full_key = str(getattr(cause, "full_key", key))
        if full_key in (moved or {}):
            return f"{full_key} is now {moved[full_key]}: write {moved[full_key]}=... instead. Every key: {prog} --cfg job"
        prefix = full_key[: -len(key)] if full_key.endswith(key) else ""
        near = difflib.get_close_matches(key, [str(k) for k in parent.keys()], n=1, cutoff=0.6)
        hint = f" Did you mean {prefix}{near[0]}?" if near else ""
        return f"{_first_line(exc).rstrip('.')}: {_first_line(cause)}.{hint} Every key: {prog} --cfg job"
    rest = _squash("\n".join(str(exc).splitlines()[1:]))  # Hydra's advice, after the cause it is about
    return f"{_first_line(exc).rstrip('.')}: {_first_line(cause)}" + (f". {rest}" if rest else "")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _squash(text: str) -> str:
    """Hydra's multi-line message on one line; tab-indented lists (available options) joined by commas."""
    text = text.split("\nConfig search path:")[0]
    parts: list[str] = []
    for line in text.splitlines():
        if line.startswith("\t") and parts:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line.strip()
        elif line.strip():
            parts.append(line.strip())
    return ". ".join(p.rstrip(".") for p in parts)
