"""maniskill env class (the simulator is imported in the constructor, not at module level)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.contract import SuiteEnv
from envs.maniskill import CONTROL_MODE, TASKS, VULKAN_FIX


class VulkanUnavailableError(RuntimeError):
    """SAPIEN found no usable Vulkan device, so ManiSkill cannot render."""


def _vulkan_error(exc: BaseException) -> VulkanUnavailableError:
    return VulkanUnavailableError(
        f"ManiSkill3 renders with Vulkan and none is usable here ({exc}). Without a GPU it needs Mesa's "
        f"lavapipe >= 25 (Debian 12 ships 22.3, which SAPIEN rejects with 'Failed to find a supported "
        f"physical device'). On Debian 12: {VULKAN_FIX}"
    )


def _is_vulkan_failure(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(k in text for k in ("vk::", "vulkan", "physical device", "incompatibledriver"))


def _make_sim(task: str, height: int, width: int, obs_mode: str):
    """The raw ManiSkill env (no gymnasium wrappers: our TimeLimit owns truncation)."""
    import ctypes.util

    if ctypes.util.find_library("vulkan") is None:
        raise _vulkan_error(OSError("libvulkan.so.1 not found"))
    import gymnasium as gym

    from envs.errors import import_simulator

    import_simulator("mani_skill.envs", "ManiSkill3", "maniskill")  # registers ManiSkill's ids
    try:
        wrapped = gym.make(
            f"{task}-v1",
            num_envs=1,
            sim_backend="cpu",
            obs_mode=obs_mode,
            control_mode=CONTROL_MODE,
            sensor_configs=dict(width=width, height=height),
        )
    except RuntimeError as exc:
        if _is_vulkan_failure(exc):
            raise _vulkan_error(exc) from exc
        raise
    return wrapped.unwrapped


def _first(x) -> np.ndarray:
    """Batch entry 0 of a (1, ...) torch tensor, as numpy."""
    return x[0].cpu().numpy()


def _scalar(x) -> float | bool | int:
    """A per-env value of a 1-env batch; some tasks return it unbatched (0-dim)."""
    return x.reshape(-1)[0].item() if hasattr(x, "reshape") else x


class ManiSkillEnv(SuiteEnv):
    """One ManiSkill3 task (1 env on the CPU backend) with pixels, proprio state and an instruction."""

    suite = "ManiSkill3"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        task: str = "PickCube",
        cameras: Sequence[str] | None = None,
        image_size: int | Sequence[int] = 128,
        render_mode: str | None = None,
        lazy_pixels: bool = False,  # render only at reset and when asked (envs/contract.py)
    ):
        if task not in TASKS:
            raise ValueError(f"unknown ManiSkill task {task!r}; known tasks: {', '.join(TASKS)}")
        from envs.contract import parse_image_size

        height, width = parse_image_size(image_size)
        self.task = task
        # A lazy env steps in ManiSkill's state_dict mode, which renders nothing, and renders its sensors
        # only when asked (get_sensor_images: the same frames as the rgb mode's observation).
        self._sim = _make_sim(task, height, width, "state_dict" if lazy_pixels else "rgb")
        available = tuple(self._sim._sensors)  # the task's sensor cameras, known once the scene is built
        cameras = available if cameras is None else tuple(cameras)
        unknown = [c for c in cameras if c not in available]
        if unknown:
            self._sim.close()
            raise ValueError(f"unknown ManiSkill camera(s) {unknown}; {task} has cameras {available}")
        self._sim_obs, self._sim_info = self._sim.reset(seed=0)
        low, high = self._sim.single_action_space.low, self._sim.single_action_space.high
        super().__init__(
            cameras=cameras,
            image_size=(height, width),
            state_dim=self._sim_state().shape[0],
            action_space=spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32),
            instruction=TASKS[task][0],
            privileged_state_dim=self._sim_privileged_state().shape[0],
            render_mode=render_mode,
            lazy_pixels=lazy_pixels,
        )

    def _sim_reset(self, seed: int | None, options: dict[str, Any]) -> None:
        # ManiSkill's seed drawn from ours: reset(seed=s) fixes this and every later episode
        self._sim_obs, self._sim_info = self._sim.reset(seed=int(self.np_random.integers(2**31)))

    def _sim_step(self, action: np.ndarray):
        self._sim_obs, reward, terminated, _, info = self._sim.step(action)
        self._sim_info = info
        extra = {k: _scalar(v) for k, v in info.items() if hasattr(v, "numel") and v.numel() == 1}
        return float(_scalar(reward)), bool(_scalar(info["success"])), bool(_scalar(terminated)), extra

    def _sim_frames(self) -> dict[str, np.ndarray]:
        data = self._sim.get_sensor_images() if self.lazy_pixels else self._sim_obs["sensor_data"]
        return {c: np.ascontiguousarray(_first(data[c]["rgb"])) for c in self.cameras}

    def _sim_control_hz(self) -> float:
        return float(self._sim.control_freq)

    def _sim_state(self) -> np.ndarray:
        agent = self._sim_obs["agent"]
        tcp = self._sim.agent.tcp.pose.raw_pose
        return np.concatenate([_first(agent["qpos"]), _first(agent["qvel"]), _first(tcp)]).astype(np.float32)

    def _sim_privileged_state(self) -> np.ndarray:
        return _first(self._sim.get_state()).astype(np.float32)

    def close(self) -> None:
        if hasattr(self, "_sim"):
            self._sim.close()
