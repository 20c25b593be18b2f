"""Normalisation of proprio state and actions from a dataset's statistics file.

The file is LeRobot's ``meta/stats.json``: ``{"observation.state": {"mean", "std", "min", "max",
"q01", ..., "q99", ...}, "action": {...}}``. ``dataset.normalization`` picks how both are mapped
into the model's range, ``x' = (x - centre) / scale``:

- ``null`` (the default): state standardised (mean/std), actions mapped from [min, max] to [-1, 1];
- ``mean_std``: both standardised;
- ``min_max``: both mapped from [min, max] to [-1, 1];
- ``quantiles``: both mapped from [q01, q99] to [-1, 1] (LeRobot's QUANTILES, pi0.5's default):
  robust to the rare outliers that stretch min/max, and values beyond them stay beyond +-1;
- ``fastwam_min_max``: FastWAM's ``min/max`` (its LinearNormalizer): [min, max] to [-1, 1], a dimension
  narrower than 1e-4 only shifted by its min, the normalised state and actions clamped to [-5, 5] (what
  training reads; their un-normalisation of predicted actions does not clamp, nor does ours).

Each mode computes exactly what LeRobot 0.4.4's normalizer does, degenerate statistics included (a
zero std or width; tests/fixtures/lerobot_normalization.json holds its outputs).

A checkpoint's ``dataset_stats.json`` is the training dataset's statistics with the mode added
(``"normalization"``), so evaluation un-normalises the way training normalised. FastWAM's own
``dataset_stats.json`` (``{"state": {"default": {"global_min", ...}}, "action": {...}}``) reads as the
same statistics in ``fastwam_min_max`` (:func:`from_fastwam_layout`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE

_EPS = 1e-8  # LeRobot's NormalizerProcessorStep eps: added to std, or standing in for a zero width
MODES = ("mean_std", "min_max", "quantiles", "fastwam_min_max")
MODE_KEY = "normalization"  # where a checkpoint's stats file records its mode
_DEFAULT = {LEROBOT_STATE: "mean_std", LEROBOT_ACTION: "min_max"}  # normalization=null
_NEEDS = {"mean_std": ("mean", "std"), "min_max": ("min", "max"), "quantiles": ("q01", "q99"),
          "fastwam_min_max": ("min", "max")}
_FASTWAM_RANGE_TOL = 1e-4  # their SingleFieldLinearNormalizer.range_tol: narrower dimensions are only shifted
_CLAMP = {"fastwam_min_max": 5.0}  # their forward() clamps what it normalises (state and actions) to +-5


def check_mode(mode: str | None) -> str | None:
    if mode is not None and mode not in MODES:
        raise ValueError(f"dataset.normalization={mode!r}: choose one of {list(MODES)}, or null (state mean_std, "
                         "actions min_max)")
    return mode


def _affine(stats: Mapping[str, Any], mode: str, feature: str, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(centre, scale) of one feature under ``mode``."""
    missing = [name for name in _NEEDS[mode] if name not in stats]
    if missing:
        hint = " (recompute them: python -m training.collect --stats-only DIR)" if mode == "quantiles" else ""
        raise ValueError(f"{source} lacks {feature} {missing}, which dataset.normalization={mode} needs{hint}")
    low, high = (np.asarray(stats[name], dtype=np.float64) for name in _NEEDS[mode])
    if mode == "mean_std":
        return low, high + _EPS
    if mode == "fastwam_min_max":
        narrow = high - low < _FASTWAM_RANGE_TOL
        return np.where(narrow, low, (low + high) / 2), np.where(narrow, 1.0, (high - low) / 2)
    # LeRobot's 2 (x - low) / width - 1, with a width of exactly 0 (a constant dimension, such as a gripper
    # that never moves) taken as _EPS: its constant value maps to -1, as in LeRobot, not to 0.
    width = np.where(high - low == 0, _EPS, high - low)
    return low + width / 2, width / 2


@dataclass
class Normalizer:
    """State and actions into the model's range and back: ``x' = (x - centre) / scale`` per dimension."""

    state_centre: np.ndarray | None = None
    state_scale: np.ndarray | None = None
    action_centre: np.ndarray | None = None
    action_scale: np.ndarray | None = None
    mode: str | None = None  # dataset.normalization it was built with
    stats: dict[str, Any] = field(default_factory=dict)  # the statistics file it came from (saved with it)

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], mode: str | None = None, source: str = "the statistics") -> Normalizer:
        missing = [k for k in (LEROBOT_STATE, LEROBOT_ACTION) if k not in stats]
        if missing:
            raise ValueError(f"{source} lacks statistics for {missing} (has {sorted(stats)})")
        check_mode(mode)
        state = _affine(stats[LEROBOT_STATE], mode or _DEFAULT[LEROBOT_STATE], LEROBOT_STATE, source)
        action = _affine(stats[LEROBOT_ACTION], mode or _DEFAULT[LEROBOT_ACTION], LEROBOT_ACTION, source)
        kept = {k: v for k, v in stats.items() if k != MODE_KEY}
        return cls(*state, *action, mode=mode, stats=json.loads(json.dumps(kept, default=_listed)))

    @classmethod
    def from_stats_file(cls, path: str | Path, mode: str | None = None) -> Normalizer:
        """A dataset's ``meta/stats.json`` normalised with ``mode``, or a checkpoint's ``dataset_stats.json``
        with the mode it records (which wins: it is how the model was trained)."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"dataset stats {path} not found; point EVALUATION.dataset_stats_path at the training "
                "dataset's meta/stats.json (training.collect writes it)"
            )
        stats = json.loads(path.read_text())
        if not isinstance(stats, dict):
            raise ValueError(f"{path} is not a statistics file (a JSON object of features)")
        if is_fastwam_layout(stats):
            stats = from_fastwam_layout(stats, str(path))
        return cls.from_stats(stats, stats.get(MODE_KEY, mode), source=str(path))

    @staticmethod
    def recorded_mode(path: str | Path) -> str | None:
        """The mode a checkpoint's ``dataset_stats.json`` records (None: the default, or no file)."""
        path = Path(path)
        return json.loads(path.read_text()).get(MODE_KEY) if path.is_file() else None

    def to_json(self) -> dict:
        """The statistics it came from, with its mode: what a checkpoint keeps as ``dataset_stats.json``."""
        return {**self.stats, **({MODE_KEY: self.mode} if self.mode is not None else {})}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2))

    @property
    def identity(self) -> bool:
        return self.state_centre is None

    @property
    def state_dim(self) -> int:
        return int(self.state_centre.size)

    @property
    def action_dim(self) -> int:
        return int(self.action_centre.size)

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        if self.identity:
            return state.astype(np.float32)
        return self._clamped((state - self.state_centre) / self.state_scale)

    def unnormalize_state(self, state: np.ndarray) -> np.ndarray:
        if self.identity:
            return state.astype(np.float32)
        return (state * self.state_scale + self.state_centre).astype(np.float32)

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        if self.identity:
            return actions.astype(np.float32)
        return self._clamped((actions - self.action_centre) / self.action_scale)

    def _clamped(self, normalized: np.ndarray) -> np.ndarray:
        if self.mode in _CLAMP:
            normalized = np.clip(normalized, -_CLAMP[self.mode], _CLAMP[self.mode])
        return normalized.astype(np.float32)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        if self.identity:
            return actions.astype(np.float32)
        return (actions * self.action_scale + self.action_centre).astype(np.float32)


def is_fastwam_layout(stats: Mapping[str, Any]) -> bool:
    """Whether a statistics file is FastWAM's (``state`` and ``action`` groups of named fields)."""
    return LEROBOT_STATE not in stats and all(isinstance(stats.get(group), Mapping) for group in ("state", "action"))


def from_fastwam_layout(stats: Mapping[str, Any], source: str) -> dict[str, Any]:
    """FastWAM's ``dataset_stats.json`` -> LeRobot's layout, mode ``fastwam_min_max`` (their LIBERO default).

    Theirs: ``{"state": {<key>: {"global_min", "global_max", "global_mean", "global_std", "global_q01", ...,
    "stepwise_min", ...}}, "action": {...}}``, one key per group for a merged state and action (LIBERO's
    ``default``). The global statistics are what their processor normalises with (``use_stepwise_action_norm``
    false, as in their LIBERO config)."""
    converted = {}
    for group, feature in (("state", LEROBOT_STATE), ("action", LEROBOT_ACTION)):
        keys = sorted(stats[group])
        if len(keys) != 1:
            raise ValueError(f"{source}: FastWAM statistics with {group} keys {keys}: wam_gym reads one merged "
                             f"{group} (their LIBERO and RoboTwin configs' 'default'); merge them before training")
        fields = stats[group][keys[0]]
        converted[feature] = {name.removeprefix("global_"): value for name, value in fields.items()
                              if name.startswith("global_")}
    return {**converted, MODE_KEY: "fastwam_min_max"}


def affine_stats(stats: Mapping[str, Any], scale: np.ndarray, offset: np.ndarray) -> dict[str, Any]:
    """One feature's statistics after ``x -> scale * x + offset`` per dimension (a negative scale swaps
    min and max, and q01 with q99): what the dataset's statistics would have been in those units."""
    scale, offset = np.asarray(scale, dtype=np.float64), np.asarray(offset, dtype=np.float64)
    mapped = dict(stats)
    for name, value in stats.items():
        if name in ("mean", "min", "max") or (name.startswith("q") and name[1:].isdigit()):
            mapped[name] = scale * np.asarray(value, dtype=np.float64) + offset
        elif name == "std":
            mapped[name] = np.abs(scale) * np.asarray(value, dtype=np.float64)
    flipped = scale < 0
    for low, high in [("min", "max"), *((f"q{n:02d}", f"q{100 - n:02d}") for n in range(1, 50))]:
        if low in mapped and high in mapped:
            a, b = np.asarray(mapped[low]), np.asarray(mapped[high])
            mapped[low], mapped[high] = np.where(flipped, b, a), np.where(flipped, a, b)
    return {name: _listed(value) if isinstance(value, np.ndarray) else value for name, value in mapped.items()}


def unit_stats(state_dim: int, action_dim: int) -> dict[str, dict[str, list[float]]]:
    """Statistics under which the default normalisation changes nothing (state mean 0 and std 1,
    actions in [-1, 1]): a random-weight checkpoint's, in tests and benches."""
    state, action = [0.0] * state_dim, [1.0] * action_dim
    return {LEROBOT_STATE: {"mean": state, "std": [1.0] * state_dim}, LEROBOT_ACTION: {"min": [-1.0] * action_dim,
                                                                                        "max": action}}


def _listed(value: Any) -> Any:
    return np.asarray(value).tolist()
