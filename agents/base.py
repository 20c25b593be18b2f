"""The agent interface shared by WAMs, scripted experts and baselines."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.protocol import batch_size, take_row


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

    def reads_pixels(self, env_index: int = 0) -> bool:
        """Whether the next ``act`` reads env ``env_index``'s pixels (runners render only what is read,
        envs/contract.py ``lazy_pixels``). True unless an agent knows better: agents that never look
        at pixels (scripted, random) and agents between replans (chunk queues) say False."""
        return True

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        n = batch_size(obs)
        if n is None:
            return self.act_one(obs, 0)
        return np.stack([self.act_one(take_row(obs, i), i) for i in range(n)])
