"""SleepBench's env: a dot in numpy, and a sleep per step for the simulator it stands in for."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from sleepbench import CAMERAS

SPEED = 0.1  # arena half-widths per step at action 1
REACHED = 0.4  # distance to the middle that counts as success: a random agent gets there in some episodes


class SleepBenchEnv(SuiteEnv):
    """A dot to move to the middle; every step (and reset) sleeps ``step_ms``; ``hang_file``: see __init__."""

    suite = "SleepBench"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, cameras: Sequence[str] = CAMERAS, image_size: int | Sequence[int] = 32,
                 render_mode: str | None = None, lazy_pixels: bool = False, step_ms: float = 20.0,
                 hang_file: str | None = None):
        super().__init__(cameras=cameras, image_size=image_size, state_dim=2,
                         action_space=spaces.Box(-1.0, 1.0, (2,), np.float32), instruction="move the dot to the middle",
                         render_mode=render_mode, lazy_pixels=lazy_pixels)
        self.step_s = step_ms / 1000.0
        self.hang_file = hang_file  # a hung simulator, once: the first reset that finds this file removes it and hangs
        self._dot = np.zeros(2)

    def _sim_reset(self, seed: int | None, options: dict) -> None:
        time.sleep(self.step_s)
        if self.hang_file and os.path.exists(self.hang_file):
            os.unlink(self.hang_file)
            time.sleep(3600)
        self._dot = self.np_random.uniform(-1.0, 1.0, 2)

    def _sim_step(self, action: np.ndarray) -> tuple[float, bool, bool, dict]:
        time.sleep(self.step_s)
        self._dot = np.clip(self._dot + SPEED * action, -1.0, 1.0)
        distance = float(np.linalg.norm(self._dot))
        return -distance, distance < REACHED, False, {"distance": distance}

    def _sim_frames(self) -> dict[str, np.ndarray]:
        frame = np.full((self.height, self.width, 3), 255, np.uint8)
        row = int((1 - self._dot[1]) / 2 * (self.height - 1))
        col = int((self._dot[0] + 1) / 2 * (self.width - 1))
        frame[row, col] = (40, 80, 220)
        return {camera: frame.copy() for camera in self.cameras}

    def _sim_state(self) -> np.ndarray:
        return self._dot.astype(np.float32)
