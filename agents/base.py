"""The agent interface shared by WAMs, scripted experts and baselines."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np


def batch_size(obs: Mapping[str, Any]) -> int | None:
    """Number of envs in a VectorEnv observation, or None for a single env's."""
    state = np.asarray(obs["state"])
    return state.shape[0] if state.ndim == 2 else None


def unbatch(obs: Mapping[str, Any], i: int) -> dict[str, Any]:
    """The i-th env's observation out of a VectorEnv batch."""
    out = {}
    for key, value in obs.items():
        out[key] = unbatch(value, i) if isinstance(value, Mapping) else value[i]
    return out


def select(obs: Mapping[str, Any], indices: list[int]) -> dict[str, Any]:
    """The sub-batch of a VectorEnv observation for the envs at ``indices``."""
    out = {}
    for key, value in obs.items():
        if isinstance(value, Mapping):
            out[key] = select(value, indices)
        elif isinstance(value, np.ndarray):
            out[key] = value[indices]
        else:  # instructions: a tuple of strings
            out[key] = tuple(value[i] for i in indices)
    return out


def as_batch(obs: Mapping[str, Any]) -> dict[str, Any]:
    """One env's observation as a VectorEnv batch of one."""
    out = {}
    for key, value in obs.items():
        if isinstance(value, Mapping):
            out[key] = as_batch(value)
        elif isinstance(value, str):
            out[key] = (value,)
        else:
            out[key] = np.asarray(value)[None]
    return out


class Agent(ABC):
    """Acts on observations that follow the env contract (see envs/contract.py).

    ``act`` takes one env's observation and returns one action, or a VectorEnv batch and
    returns one action per env (shape ``(num_envs, action_dim)``).
    """

    def reset(self, env_ids: list[int] | None = None) -> None:
        """Forget per-episode state (all envs, or only ``env_ids``)."""

    def replan(self, obs: Mapping[str, Any]) -> None:
        """Discard any queued actions so the next ``act`` plans from ``obs``."""

    @abstractmethod
    def act_one(self, obs: Mapping[str, Any], env_index: int) -> np.ndarray:
        """Action for one env's observation; ``env_index`` is its slot in a batch (0 alone)."""

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        n = batch_size(obs)
        if n is None:
            return self.act_one(obs, 0)
        return np.stack([self.act_one(unbatch(obs, i), i) for i in range(n)])
