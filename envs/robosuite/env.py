"""robosuite env class (the simulator is imported in the constructor, not at module level)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from envs.robosuite import (
    _STEPS,
    ACTION_DIM,
    DEFAULT_CAMERAS,
    INSTRUCTIONS,
    MAX_EPISODE_STEPS,
    STATE_DIM,
    TASKS,
)


def _make_sim(task: str, reward_shaping: bool, horizon: int):
    from envs.errors import import_simulator

    suite = import_simulator("robosuite", "robosuite", "robosuite")
    from robosuite.utils.log_utils import ROBOSUITE_DEFAULT_LOGGER

    ROBOSUITE_DEFAULT_LOGGER.setLevel(logging.ERROR)  # it warns on every reset about unused controller parts
    return suite.make(
        task,
        robots="Panda",
        controller_configs=suite.load_composite_controller_config(controller="BASIC"),  # OSC_POSE arm
        has_renderer=False,
        has_offscreen_renderer=False,  # we render ourselves, upright
        use_camera_obs=False,
        reward_shaping=reward_shaping,
        hard_reset=False,  # keep one MjModel, so our renderer and the seeded samplers stay valid
        ignore_done=True,  # gymnasium's TimeLimit truncates, not robosuite
        horizon=horizon,
        seed=0,
    )


class RobosuiteEnv(SuiteEnv):
    """One robosuite task (Panda, OSC_POSE) with pixels, proprio state and an instruction."""

    suite = "robosuite"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}  # robosuite's default control_freq

    def __init__(
        self,
        task: str = "Lift",
        cameras: Sequence[str] = DEFAULT_CAMERAS,
        image_size: int | Sequence[int] = 128,
        reward_shaping: bool = False,
        render_mode: str | None = None,
        lazy_pixels: bool = False,  # render only at reset and when asked (envs/contract.py)
    ):
        if task not in INSTRUCTIONS:
            raise ValueError(f"unknown robosuite task {task!r}; known tasks: {', '.join(TASKS)}")
        super().__init__(
            cameras=cameras,
            image_size=image_size,
            state_dim=STATE_DIM,
            action_space=spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32),
            instruction=INSTRUCTIONS[task],
            render_mode=render_mode,
            lazy_pixels=lazy_pixels,
        )
        from envs.rendering import robosuite_cameras, select_gl_backend

        select_gl_backend()  # before mujoco is imported
        self.task = task
        self._sim = _make_sim(task, reward_shaping, horizon=_STEPS.get(task, MAX_EPISODE_STEPS) + 1)
        self._camera_rig = robosuite_cameras(self._sim, self.cameras, self.height, self.width)
        self._sim_obs: dict[str, np.ndarray] = {}

    def _sim_reset(self, seed: int | None, options: dict[str, Any]) -> None:
        # robosuite's samplers hold a reference to env.rng: reseed that generator in place
        sub_seed = int(self.np_random.integers(2**31))
        self._sim.rng.bit_generator.state = np.random.default_rng(sub_seed).bit_generator.state
        self._sim_obs = self._sim.reset()

    def _sim_step(self, action: np.ndarray):
        self._sim_obs, reward, _, info = self._sim.step(np.clip(action, -1.0, 1.0).astype(np.float64))
        return reward, bool(self._sim._check_success()), False, dict(info)

    def _sim_frames(self) -> dict[str, np.ndarray]:
        return self._camera_rig.render(self._sim.sim.data._data)

    def _sim_control_hz(self) -> float:
        return float(self._sim.control_freq)

    def _sim_state(self) -> np.ndarray:
        o = self._sim_obs
        return np.concatenate([o["robot0_eef_pos"], o["robot0_eef_quat"], o["robot0_gripper_qpos"]])

    def close(self) -> None:
        if hasattr(self, "_camera_rig"):
            self._camera_rig.close()
        if hasattr(self, "_sim"):
            self._sim.close()
