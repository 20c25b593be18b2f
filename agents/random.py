"""Uniform random actions: the floor every trained agent must beat."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from agents.base import Agent


class RandomAgent(Agent):
    def __init__(self, action_space: spaces.Box, seed: int | None = None):
        self.action_space = action_space
        self.rng = np.random.default_rng(seed)

    def reads_pixels(self, env_index: int = 0) -> bool:
        return False  # draws actions without looking

    def act_one(self, obs, env_index: int) -> np.ndarray:
        low, high = self.action_space.low, self.action_space.high
        return self.rng.uniform(low, high).astype(self.action_space.dtype)
