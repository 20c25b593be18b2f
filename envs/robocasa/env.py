"""robocasa env class (the simulator is imported in the constructor, not at module level)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from envs.robocasa import (
    ASSET_DIRS,
    CAMERAS,
    HORIZONS,
    INSTALL_STEPS,
    ROBOT,
    STATE_KEYS,
    TASKS,
)


def _import_robocasa():
    """Import robocasa (it is not on PyPI), or say how to install it."""
    from envs.errors import MissingSimulatorError

    try:
        import robocasa
    except ImportError as exc:
        raise MissingSimulatorError(
            f"RoboCasa needs the 'robocasa' package, which is not importable ({exc}). It is not on PyPI; "
            f"install it in its own virtual environment: {INSTALL_STEPS}"
        ) from exc
    return robocasa


def _check_assets(package_dir: Path) -> None:
    from envs.errors import MissingAssetsError

    missing = [d for d in ASSET_DIRS if not (package_dir / d).is_dir() or not any((package_dir / d).iterdir())]
    if missing:
        raise MissingAssetsError(
            f"RoboCasa is installed at {package_dir} but its kitchen assets are missing ({', '.join(missing)}). "
            f"Download them (~5 GB, from utexas.box.com) with: python {package_dir}/scripts/download_kitchen_assets.py "
            f"then run: python {package_dir}/scripts/setup_macros.py"
        )


def _make_sim(task: str, cameras: Sequence[str], height: int, width: int):
    from envs.rendering import select_gl_backend

    select_gl_backend()  # before robosuite imports mujoco
    robocasa = _import_robocasa()
    _check_assets(Path(robocasa.__path__[0]))
    import robosuite
    from robosuite.controllers import load_composite_controller_config

    # the same settings as robocasa.utils.env_utils.create_env, RoboCasa's own eval entry point
    return robosuite.make(
        env_name=task,
        robots=ROBOT,
        controller_configs=load_composite_controller_config(controller=None, robot=ROBOT),
        camera_names=list(cameras),
        camera_heights=height,
        camera_widths=width,
        has_renderer=False,
        has_offscreen_renderer=True,
        use_camera_obs=True,
        use_object_obs=True,
        camera_depths=False,
        ignore_done=True,  # gymnasium's TimeLimit truncates
        translucent_robot=False,
        randomize_cameras=False,
    )


class RoboCasaEnv(SuiteEnv):
    """One RoboCasa atomic task with pixels, proprio state and the episode's instruction."""

    suite = "RoboCasa"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        task: str = "PnPCounterToCab",
        cameras: Sequence[str] = CAMERAS,
        image_size: int | Sequence[int] = 128,
        render_mode: str | None = None,
        lazy_pixels: bool = False,  # render only at reset and when asked (envs/contract.py)
    ):
        if task not in HORIZONS:
            raise ValueError(f"unknown RoboCasa task {task!r}; known tasks: {', '.join(TASKS)}")
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"unknown RoboCasa camera(s) {unknown}; choose from {CAMERAS}")
        from envs.contract import parse_image_size

        height, width = parse_image_size(image_size)
        self.task = task
        self._sim = _make_sim(task, cameras, height, width)
        self._sim_obs = self._sim.reset()
        low, high = self._sim.action_spec
        super().__init__(
            cameras=cameras,
            image_size=(height, width),
            state_dim=self._sim_state().shape[0],
            action_space=spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32),
            instruction=self._sim.get_ep_meta().get("lang", ""),
            render_mode=render_mode,
            lazy_pixels=lazy_pixels,
        )
        import robosuite.macros

        # robosuite's default "opengl" convention stores images bottom row first
        self._flip = robosuite.macros.IMAGE_CONVENTION == "opengl"

    def _sim_reset(self, seed: int | None, options: dict[str, Any]) -> None:
        # RoboCasa samples layout, style and objects from env.rng; reseed it from ours
        self._sim.rng = np.random.default_rng(int(self.np_random.integers(2**31)))
        self._sim_obs = self._sim.reset()
        self.instruction = self._sim.get_ep_meta().get("lang", "")

    def _sim_step(self, action: np.ndarray):
        low, high = self._sim.action_spec
        self._sim_obs, reward, _, info = self._sim.step(np.clip(action, low, high))
        return float(reward), bool(self._sim._check_success()), False, dict(info)

    def _sim_frames(self) -> dict[str, np.ndarray]:
        frames = {c: self._sim_obs[f"{c}_image"] for c in self.cameras}
        return {c: np.ascontiguousarray(f[::-1] if self._flip else f) for c, f in frames.items()}

    def _sim_state(self) -> np.ndarray:
        missing = [k for k in STATE_KEYS if k not in self._sim_obs]
        if missing:
            raise KeyError(f"RoboCasa observation lacks proprio keys {missing}; it has {sorted(self._sim_obs)}")
        return np.concatenate([np.ravel(self._sim_obs[k]) for k in STATE_KEYS]).astype(np.float32)

    def close(self) -> None:
        if hasattr(self, "_sim"):
            self._sim.close()
