"""The statistics file a converted FastWAM un-normalises its actions with, found and checked before it is kept.

Taken only from where the user points: ``--stats``, or beside their ``.pt`` (``<name>_dataset_stats.json``, as
their release names it, or ``dataset_stats.json``); never from a folder above, where another run's may lie.
Their layout (``{"state": {"default": {"global_min", "global_max", ...}}, "action": {...}}``) or LeRobot's with
``"normalization": "fastwam_min_max"`` (what wam_gym's FastWAM training keeps) is read: FastWAM normalises with
global min/max, so a file recording another normalisation (a z-score's mean/std) would un-normalise the
actions wrongly and is refused. Every refusal is one line naming the file, the field and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.wam.normalization import MODE_KEY, is_fastwam_layout
from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE

FIX = "pass --stats with their dataset_stats.json of this checkpoint (it ships beside their .pt)"
NAME = "dataset_stats.json"


class StatsFileError(ValueError):
    """A statistics file that cannot be what the checkpoint's actions are un-normalised with."""


def stats_beside(checkpoint: Path) -> Path | None:
    """Their statistics beside ``checkpoint``: ``<stem>_dataset_stats.json`` (their release's name) or
    ``dataset_stats.json``; both there is refused, as either could be the one."""
    found = [p for p in (checkpoint.with_name(f"{checkpoint.stem}_{NAME}"), checkpoint.with_name(NAME)) if p.is_file()]
    if len(found) > 1:
        raise StatsFileError(f"{checkpoint.parent} holds both {found[0].name} and {found[1].name} beside "
                             f"{checkpoint.name}: pass --stats with the one of this checkpoint")
    return found[0] if found else None


@dataclass(frozen=True)
class TheirStats:
    """A statistics file read and checked: where it is, and the (field, min, max) of the state and the actions."""

    path: Path
    ranges: dict[str, tuple[str, list[float], list[float]]]  # "state" / "action" -> (field, min, max)

    def check_fits(self, action_dim: int, state_dim: int) -> None:
        """Refuse statistics of other sizes than the checkpoint's actions and state."""
        for group, dim in (("action", action_dim), ("state", state_dim)):
            field, low, _ = self.ranges[group]
            if len(low) != dim:
                raise StatsFileError(f"{self.path}: {field} has {len(low)} values and the checkpoint has {dim}-d "
                                     f"{group}s: {FIX}")


def read_their_stats(path: str | Path) -> TheirStats:
    """Read and check a statistics file: JSON, a layout that records FastWAM's min/max, finite values, min <= max."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise StatsFileError(f"{path} is not a file: {FIX}")
    try:
        stats = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StatsFileError(f"{path} is not JSON ({_one_line(exc)}): {FIX}") from None
    if not isinstance(stats, dict):
        raise StatsFileError(f"{path} holds a JSON {type(stats).__name__}, not a statistics object: {FIX}")
    if (where := _non_finite(stats, "")) is not None:
        raise StatsFileError(f"{path}: {where} is not a finite number: {FIX}")
    fields = _their_fields(stats, path) if is_fastwam_layout(stats) else _lerobot_fields(stats, path)
    ranges = {group: _range(node, path, prefix) for group, (node, prefix) in fields.items()}
    return TheirStats(path, ranges)


def _their_fields(stats: dict, path: Path) -> dict[str, tuple[Any, str]]:
    """Each group's statistics in their layout, and the prefix of its fields (``state.default.global_``)."""
    fields = {}
    for group in ("state", "action"):
        keys = sorted(stats[group])
        if len(keys) != 1:
            raise StatsFileError(f"{path}: {group} has keys {keys}, and wam_gym reads one merged {group} (their LIBERO "
                                 f"config's 'default'): {FIX}")
        fields[group] = (stats[group][keys[0]], f"{group}.{keys[0]}.global_")
    return fields


def _lerobot_fields(stats: dict, path: Path) -> dict[str, tuple[Any, str]]:
    """LeRobot's layout, which must record FastWAM's normalisation (a checkpoint wam_gym's training wrote)."""
    if not all(isinstance(stats.get(f), dict) for f in (LEROBOT_STATE, LEROBOT_ACTION)):
        raise StatsFileError(f"{path} holds neither their statistics ('state' and 'action' groups) nor LeRobot's "
                             f"('{LEROBOT_STATE}' and '{LEROBOT_ACTION}'; it has {sorted(stats)[:6]}): {FIX}")
    mode = stats.get(MODE_KEY)
    if mode != "fastwam_min_max":
        recorded = "not recorded (LeRobot's default: the state by mean/std, a z-score)" if mode is None else f"{mode!r}"
        raise StatsFileError(f"{path}: {MODE_KEY} is {recorded}, and FastWAM normalises with min/max "
                             f"('fastwam_min_max'): {FIX}")
    return {"state": (stats[LEROBOT_STATE], f"{LEROBOT_STATE}."), "action": (stats[LEROBOT_ACTION], f"{LEROBOT_ACTION}.")}


def _range(node: Any, path: Path, prefix: str) -> tuple[str, list[float], list[float]]:
    """The (field, min, max) of one group's statistics ``node``, each a list of numbers; ``prefix`` names its fields
    (``state.default.global_``: their ``global_min`` and ``global_max``)."""
    stem = prefix.rsplit(".", 1)[-1]
    values = []
    for name in ("min", "max"):
        field = f"{prefix}{name}"
        value = node.get(f"{stem}{name}") if isinstance(node, dict) else None
        if not isinstance(value, list) or not value or not all(_is_number(v) for v in value):
            shown = "missing" if value is None else f"{json.dumps(value)[:60]}"
            raise StatsFileError(f"{path}: {field} is {shown}, not a list of numbers: {FIX}")
        values.append([float(v) for v in value])
    low, high = values
    if len(low) != len(high):
        raise StatsFileError(f"{path}: {prefix}min has {len(low)} values and {prefix}max {len(high)}: {FIX}")
    if inverted := [i for i, (a, b) in enumerate(zip(low, high)) if a > b]:
        raise StatsFileError(f"{path}: {prefix}min exceeds {prefix}max at dimension(s) {inverted[:5]} (they would flip "
                             f"the actions): {FIX}")
    return f"{prefix}min", low, high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _non_finite(value: Any, field: str) -> str | None:
    """The dotted field of the first NaN or infinite number (Python's json reads NaN and Infinity), else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return field or "a value"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        inner = f"{field}.{key}" if isinstance(key, str) else f"{field}[{key}]"
        if (found := _non_finite(item, inner.lstrip("."))) is not None:
            return found
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
