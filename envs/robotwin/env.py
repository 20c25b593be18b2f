"""robotwin env class (the simulator is imported in the constructor, not at module level)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from envs.robotwin import (
    ASSET_DIRS,
    CAMERAS,
    EXPERT_SEED_TRIES,
    INSTALL_STEPS,
    ROOT_ENV,
    TASKS,
)


def _robotwin_root() -> Path:
    """The RoboTwin checkout, or an error that says how to get one."""
    from envs.errors import MissingAssetsError, MissingSimulatorError

    raw = os.environ.get(ROOT_ENV)
    root = Path(raw).expanduser() if raw else None
    if root is None or not (root / "envs" / "_base_task.py").is_file():
        where = f"{ROOT_ENV}={raw!r} is not a RoboTwin checkout" if raw else f"{ROOT_ENV} is not set"
        raise MissingSimulatorError(f"RoboTwin 2.0 is not on PyPI and {where}. Install it: {INSTALL_STEPS}")
    try:
        import mplib  # noqa: F401  (RoboTwin's planner)
        import sapien  # noqa: F401
    except ImportError as exc:
        raise MissingSimulatorError(
            f"RoboTwin's checkout is at {root} but its Python dependencies are missing ({exc}). "
            f"Run: cd {root} && bash script/_install.sh"
        ) from exc
    missing = [d for d in ASSET_DIRS if not (root / d).is_dir() or not any((root / d).iterdir())]
    if missing:
        raise MissingAssetsError(
            f"RoboTwin's assets are missing under {root} ({', '.join(missing)}). "
            f"Download them (from Hugging Face) with: cd {root} && bash script/_download_assets.sh"
        )
    return root


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    # RoboTwin opens its assets and configs by paths relative to the checkout
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _robotwin_package(root: Path):
    """RoboTwin's ``envs`` package, imported as ``robotwin_envs`` (``envs`` is ours)."""
    if "robotwin_envs" in sys.modules:
        return sys.modules["robotwin_envs"]
    for extra in (root, root / "description" / "utils"):  # appended: our `envs` keeps priority
        if str(extra) not in sys.path:
            sys.path.append(str(extra))
    init = root / "envs" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "robotwin_envs", init if init.is_file() else None, submodule_search_locations=[str(root / "envs")]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["robotwin_envs"] = package
    if init.is_file():
        spec.loader.exec_module(package)
    return package


def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml

    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _task_args(root: Path, task: str, task_config: str) -> dict[str, Any]:
    """setup_demo's keyword arguments, built as script/eval_policy.py builds them."""
    configs = root / "task_config"
    args = _load_yaml(configs / f"{task_config}.yml")
    args.update(task_name=task, task_config=task_config, render_freq=0, eval_mode=True, eval_video_log=False)
    camera = _load_yaml(configs / "_camera_config.yml")[args["camera"]["head_camera_type"]]
    args["head_camera_h"], args["head_camera_w"] = camera["h"], camera["w"]
    embodiments = _load_yaml(configs / "_embodiment_config.yml")
    kinds = args["embodiment"]
    files = [embodiments[k]["file_path"] for k in (kinds[:1] * 2 if len(kinds) == 1 else kinds[:2])]
    args["left_robot_file"], args["right_robot_file"] = files
    args["dual_arm_embodied"] = len(kinds) == 1
    if len(kinds) == 3:
        args["embodiment_dis"] = kinds[2]
    args["left_embodiment_config"] = _load_yaml(Path(files[0]) / "config.yml")
    args["right_embodiment_config"] = _load_yaml(Path(files[1]) / "config.yml")
    return args


def _resize(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    if frame.shape[:2] == (height, width):
        return np.ascontiguousarray(frame)
    from PIL import Image

    return np.asarray(Image.fromarray(frame).resize((width, height), Image.BILINEAR))


class RoboTwinEnv(SuiteEnv):
    """One RoboTwin 2.0 task with pixels, joint state and a generated instruction."""

    suite = "RoboTwin 2.0"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        task: str = "beat_block_hammer",
        cameras: Sequence[str] = ("head_camera", "left_camera", "right_camera"),
        image_size: int | Sequence[int] = 128,
        task_config: str = "demo_clean",
        instruction_type: str = "unseen",
        render_mode: str | None = None,
        lazy_pixels: bool = False,  # render only at reset and when asked (envs/contract.py)
    ):
        if task not in TASKS:
            raise ValueError(f"unknown RoboTwin task {task!r}; known tasks: {', '.join(TASKS)}")
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"unknown RoboTwin camera(s) {unknown}; choose from {CAMERAS}")
        if instruction_type not in ("seen", "unseen"):
            raise ValueError(f"instruction_type must be 'seen' or 'unseen', got {instruction_type!r}")
        self._root = _robotwin_root()
        self._args = _task_args(self._root, task, task_config)
        left, right = self._args["left_embodiment_config"], self._args["right_embodiment_config"]
        arm_dims = (len(left["arm_joints_name"][0]), len(right["arm_joints_name"][1]))
        super().__init__(
            cameras=cameras,
            image_size=image_size,
            state_dim=arm_dims[0] + arm_dims[1] + 2,
            action_space=self._qpos_space(*arm_dims),
            instruction="",
            render_mode=render_mode,
            lazy_pixels=lazy_pixels,
        )
        self.task, self.instruction_type = task, instruction_type
        with _in_dir(self._root):
            _robotwin_package(self._root)
            self._task_module = importlib.import_module(f"robotwin_envs.{task}")
            self._describe = importlib.import_module("generate_episode_instructions").generate_episode_descriptions
        self._sim = None
        self._sim_obs: dict[str, Any] = {}

    @staticmethod
    def _qpos_space(left_arm: int, right_arm: int) -> spaces.Box:
        # joints are limited by the URDF (RoboTwin clips nothing); grippers take an opening in [0, 1]
        low = np.r_[np.full(left_arm, -np.pi), 0.0, np.full(right_arm, -np.pi), 0.0].astype(np.float32)
        high = np.r_[np.full(left_arm, np.pi), 1.0, np.full(right_arm, np.pi), 1.0].astype(np.float32)
        return spaces.Box(low, high, dtype=np.float32)

    def _new_task(self):
        return getattr(self._task_module, self.task)()

    def _expert_solves(self, seed: int) -> dict[str, Any] | None:
        """Run RoboTwin's scripted expert on ``seed``; its episode info if it succeeds."""
        unstable = getattr(sys.modules.get("robotwin_envs.utils.create_actor"), "UnStableError", ())
        task, info, solved = self._new_task(), None, False
        try:
            task.setup_demo(now_ep_num=0, seed=seed, is_test=True, **self._args)
            info = task.play_once()
            solved = bool(task.plan_success and task.check_success())
        except unstable:
            pass  # objects settled badly on this seed: RoboTwin's eval skips it too
        finally:
            task.close_env()
        return info if solved else None

    def _sim_reset(self, seed: int | None, options: dict[str, Any]) -> None:
        if self._sim is not None:
            self._sim.close_env(clear_cache=True)
        start = int(self.np_random.integers(2**31 - EXPERT_SEED_TRIES))
        with _in_dir(self._root):
            for robotwin_seed in range(start, start + EXPERT_SEED_TRIES):
                info = self._expert_solves(robotwin_seed)
                if info is not None:
                    break
            else:
                raise RuntimeError(f"RoboTwin's expert solved none of seeds {start}..{robotwin_seed} for {self.task}")
            self._sim = self._new_task()
            self._sim.setup_demo(now_ep_num=0, seed=robotwin_seed, is_test=True, **self._args)
            descriptions = self._describe(self.task, [info["info"]], 1)[0][self.instruction_type]
        self.instruction = str(descriptions[int(self.np_random.integers(len(descriptions)))])
        self._sim.set_instruction(instruction=self.instruction)
        self._sim_obs = self._sim.get_obs()

    def _sim_step(self, action: np.ndarray):
        self._sim.take_action(action.astype(np.float64), action_type="qpos")
        self._sim_obs = self._sim.get_obs()
        success = bool(self._sim.eval_success)
        out_of_steps = self._sim.step_lim is not None and self._sim.take_action_cnt >= self._sim.step_lim
        return float(success), success, success or out_of_steps, {"robotwin_step": self._sim.take_action_cnt}

    def _sim_frames(self) -> dict[str, np.ndarray]:
        views = self._sim_obs["observation"]
        return {c: _resize(views[c]["rgb"], self.height, self.width) for c in self.cameras}

    def _sim_state(self) -> np.ndarray:
        return np.asarray(self._sim_obs["joint_action"]["vector"], dtype=np.float32)

    def close(self) -> None:
        if getattr(self, "_sim", None) is not None:
            self._sim.close_env(clear_cache=True)
            self._sim = None
