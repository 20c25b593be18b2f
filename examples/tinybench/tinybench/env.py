"""TinyBench's env: the dot, the target and the camera are a few lines of numpy, where a real suite drives its
simulator. SuiteEnv (wam_gym's base class) builds the spaces and keeps the observation contract; an env fills in
the ``_sim_*`` hooks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from tinybench import CAMERAS, INSTRUCTIONS

SPEED = 0.1  # arena half-widths per step at action 1
REACHED = 0.1  # distance to the target that counts as success


class TinyBenchEnv(SuiteEnv):
    """One TinyBench task with its camera's pixels, the dot's position and an instruction."""

    suite = "TinyBench"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        task: str = "Reach",
        cameras: Sequence[str] = CAMERAS,
        image_size: int | Sequence[int] = 64,
        render_mode: str | None = None,
        lazy_pixels: bool = False,
        terminate_on_success: bool = True,
    ):
        if task not in INSTRUCTIONS:
            raise ValueError(f"unknown TinyBench task {task!r}: choose one of {list(INSTRUCTIONS)}")
        if any(c not in CAMERAS for c in cameras):
            raise ValueError(f"TinyBench cameras are {CAMERAS}, got {list(cameras)}")
        super().__init__(
            cameras=cameras,
            image_size=image_size,
            state_dim=2,
            action_space=spaces.Box(-1.0, 1.0, (2,), np.float32),
            instruction=INSTRUCTIONS[task],
            render_mode=render_mode,
            lazy_pixels=lazy_pixels,
            terminate_on_success=terminate_on_success,
        )
        self.task = task
        self._dot = np.zeros(2)
        self._target = np.zeros(2)

    def _sim_reset(self, seed: int | None, options: dict) -> None:
        self._dot = self.np_random.uniform(-1.0, 1.0, 2)  # SuiteEnv.reset seeded np_random from the seed
        self._target = self.np_random.uniform(-0.8, 0.8, 2) if self.task == "Reach" else np.zeros(2)

    def _sim_step(self, action: np.ndarray) -> tuple[float, bool, bool, dict]:
        self._dot = np.clip(self._dot + SPEED * action, -1.0, 1.0)
        distance = float(np.linalg.norm(self._dot - self._target))
        return -distance, distance < REACHED, False, {"distance": distance}

    def _sim_frames(self) -> dict[str, np.ndarray]:
        frame = np.full((self.height, self.width, 3), 255, np.uint8)
        frame[self._disc(self._target)] = (220, 40, 40)
        frame[self._disc(self._dot)] = (40, 80, 220)
        return {camera: frame.copy() for camera in self.cameras}

    def _disc(self, xy: np.ndarray) -> np.ndarray:
        """The pixels within a sixteenth of the image of ``xy`` (y up, so upright as the contract wants)."""
        rows, cols = np.ogrid[: self.height, : self.width]
        row, col = (1 - xy[1]) / 2 * (self.height - 1), (xy[0] + 1) / 2 * (self.width - 1)
        return (rows - row) ** 2 + (cols - col) ** 2 <= (max(self.height, self.width) / 16) ** 2

    def _sim_state(self) -> np.ndarray:
        return self._dot.astype(np.float32)
