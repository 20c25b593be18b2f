"""Normalisation of proprio state and actions from a dataset's statistics file.

The file is LeRobot's ``meta/stats.json``: ``{"observation.state": {"mean", "std", "min",
"max", ...}, "action": {...}}``. State is standardised (mean/std); actions are mapped from
[min, max] to [-1, 1], the range the flow model is trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE

_EPS = 1e-6


@dataclass
class Normalizer:
    state_mean: np.ndarray | None = None
    state_std: np.ndarray | None = None
    action_min: np.ndarray | None = None
    action_max: np.ndarray | None = None

    @classmethod
    def from_stats_file(cls, path: str | Path) -> Normalizer:
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"dataset stats {path} not found; point EVALUATION.dataset_stats_path at the training "
                "dataset's meta/stats.json (training.collect writes it)"
            )
        stats = json.loads(path.read_text())
        missing = [k for k in (LEROBOT_STATE, LEROBOT_ACTION) if k not in stats]
        if missing:
            raise ValueError(f"{path} lacks statistics for {missing} (has {sorted(stats)})")

        def field(key: str, name: str) -> np.ndarray:
            return np.asarray(stats[key][name], dtype=np.float32)

        return cls(
            field(LEROBOT_STATE, "mean"), field(LEROBOT_STATE, "std"), field(LEROBOT_ACTION, "min"), field(LEROBOT_ACTION, "max")
        )

    def to_json(self) -> dict:
        def pack(**arrays):
            return {k: v.tolist() for k, v in arrays.items()}

        return {
            LEROBOT_STATE: pack(mean=self.state_mean, std=self.state_std),
            LEROBOT_ACTION: pack(min=self.action_min, max=self.action_max),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2))

    @property
    def identity(self) -> bool:
        return self.state_mean is None

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        if self.identity:
            return state.astype(np.float32)
        return ((state - self.state_mean) / np.maximum(self.state_std, _EPS)).astype(np.float32)

    def unnormalize_state(self, state: np.ndarray) -> np.ndarray:
        if self.identity:
            return state.astype(np.float32)
        return (state * np.maximum(self.state_std, _EPS) + self.state_mean).astype(np.float32)

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        if self.identity:
            return actions.astype(np.float32)
        span = np.maximum(self.action_max - self.action_min, _EPS)
        return (2 * (actions - self.action_min) / span - 1).astype(np.float32)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        if self.identity:
            return actions.astype(np.float32)
        return ((actions + 1) / 2 * (self.action_max - self.action_min) + self.action_min).astype(np.float32)
