"""Meta-World env class (the simulator is imported in the constructor, not here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from envs.metaworld import (
    _FLIPPED_CAMERAS,
    CAMERAS,
    INSTRUCTIONS,
    MAX_EPISODE_STEPS,
    TASKS,
)


class MetaWorldEnv(SuiteEnv):
    """One Meta-World task with pixels, proprio state and an instruction."""

    suite = "Meta-World"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}

    def __init__(
        self,
        task: str = "pick-place",
        cameras: Sequence[str] = ("corner", "gripperPOV"),
        image_size: int | Sequence[int] = 128,
        render_mode: str | None = None,
        lazy_pixels: bool = False,  # render only at reset and when asked (envs/contract.py)
        terminate_on_success: bool = True,
    ):
        if task not in INSTRUCTIONS:
            raise ValueError(f"unknown Meta-World task {task!r}; known tasks: {', '.join(TASKS)}")
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"unknown Meta-World camera(s) {unknown}; choose from {CAMERAS}")
        super().__init__(
            cameras=cameras,
            image_size=image_size,
            state_dim=4,
            action_space=spaces.Box(-1.0, 1.0, (4,), np.float32),
            instruction=INSTRUCTIONS[task],
            privileged_state_dim=39,
            render_mode=render_mode,
            lazy_pixels=lazy_pixels,
            terminate_on_success=terminate_on_success,
        )
        from envs.rendering import MujocoCameras, select_gl_backend

        select_gl_backend()  # before mujoco is imported
        from envs.errors import import_simulator

        env_dict = import_simulator("metaworld.env_dict", "Meta-World", "metaworld")
        import mujoco

        self._mujoco = mujoco
        self.task = task
        self._sim = env_dict.ALL_V3_ENVIRONMENTS[f"{task}-v3"]()
        self._sim._partially_observable = False  # goal position is part of privileged_state
        if "sawyer_observation_space" in vars(self._sim):
            del self._sim.sawyer_observation_space  # cached with the goal bounds zeroed; rebuild
        self._sim._freeze_rand_vec = False  # each reset draws new object/goal positions...
        self._sim.seeded_rand_vec = True  # ...from the env's seeded generator
        self._sim._set_task_called = True
        self._sim.max_path_length = MAX_EPISODE_STEPS + 1  # gymnasium's TimeLimit truncates, not Meta-World
        self._camera_rig = MujocoCameras(
            self._sim.model, self.cameras, self.height, self.width, flip_vertical=_FLIPPED_CAMERAS
        )
        self._sim_obs = np.zeros(39)

    def _sim_reset(self, seed: int | None, options: dict[str, Any]) -> None:
        if "init_state_id" in options:  # LIBERO's option; ignoring it would fake a pinned init state
            raise ValueError(
                f"Meta-World has no init states (reset got init_state_id={options['init_state_id']!r}): an episode "
                "is fixed by its seed alone; drop the option and pass reset(seed=...)"
            )
        # draw Meta-World's own seed from ours, so reset(seed=s) fixes the episode exactly
        self._sim.seed(int(self.np_random.integers(2**31)))
        # clear solver warm-starts and contacts left by the last episode, else a replayed seed
        # can differ in the last digit (seen as a one-level pixel difference)
        self._mujoco.mj_resetData(self._sim.model, self._sim.data)
        self._sim_obs, _ = self._sim.reset()

    def _sim_step(self, action: np.ndarray):
        self._sim_obs, reward, _, _, info = self._sim.step(np.clip(action, -1.0, 1.0))
        return reward, bool(info.get("success", 0.0)), False, dict(info)

    def _sim_frames(self) -> dict[str, np.ndarray]:
        return self._camera_rig.render(self._sim.data)

    def _sim_control_hz(self) -> float:
        return 1.0 / self._sim.dt  # MuJoCo timestep x frame_skip

    def _sim_state(self) -> np.ndarray:
        return self._sim_obs[:4]

    def _sim_privileged_state(self) -> np.ndarray:
        return self._sim_obs

    def close(self) -> None:
        if hasattr(self, "_camera_rig"):
            self._camera_rig.close()
        if hasattr(self, "_sim"):
            self._sim.close()
