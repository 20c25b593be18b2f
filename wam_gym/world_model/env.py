"""``WorldModelEnv``: a gymnasium env whose dynamics are a WAM's imagination.

Time runs in env steps, as in the dataset. The model imagines ``num_future_frames`` frames,
``frame_stride`` env steps apart, from the current frame and a chunk of actions, so it runs
once every ``steps_per_call = num_future_frames * frame_stride`` actions:

* ``step(action)`` with one action (A,) queues it; when ``steps_per_call`` actions are queued
  the model imagines their outcome and the observation jumps to the last imagined frame (and
  predicted state). Until then the observation holds (a policy that replans every
  ``steps_per_call`` steps, the default for a WAM agent, never looks at a held frame).
* ``step(chunk)`` with (n, A) runs the same over n actions in one call; actions after the
  ones being imagined are the model's look-ahead (as they are in training), instead of
  repeating the last action.

``info["imagined_frames"]`` holds the frames (F, H, W * cameras, 3) of a step in which the model
ran; score imagined videos against real ones with ``scripts/psnr_score.py``.

Where an episode starts: an episode of the LeRobot dataset at ``dataset=`` (its first frame,
state and instruction), or, with ``start_from=ENV_ID``, the real env's reset for the same seed
(its frames at the checkpoint's cameras and size, its state and instruction): the same episodes
a simulator evaluation starts from. Whether it succeeds: ``success_detector=DIR``
(``python -m wam_gym.world_model`` trains one) judges each imagined frame; the first one it judges
solved ends the episode (``is_success``, reward 1). Without one there is no success signal.
``privileged_from_simulator=True`` (with ``start_from``) steps the real env alongside with the
same actions, rendering nothing, and passes its ``privileged_state`` on: only scripted experts
read it, and they then act on the simulator's state while the world model draws the frames.

The model is loaded on the first reset (cheap construction for ``make_vec`` and the env
checker) and shared between copies in one process; ``predictor=`` routes calls elsewhere,
e.g. a :class:`wam_gym.broker.BrokerClient` of a broker serving a ``WorldModel``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.contract import instruction_space, pixel_space, vector_space
from envs.errors import MissingAssetsError
from envs.protocol import ACTION, INSTRUCTION, IS_SUCCESS, LEROBOT_ACTION, PIXELS, PRIVILEGED_STATE, STATE, stack_rows
from wam_gym.utils.metrics import resize_video
from wam_gym.utils.video import tile

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _shared_world_model(checkpoint: str, device: str, steps: int, sampler: str, shift: float):
    from agents.wam.inference_config import InferenceConfig
    from agents.wam.mot.world_model import WorldModel

    config = InferenceConfig.from_knobs(num_inference_steps=steps, sampler=sampler, shift=shift)
    return WorldModel.from_checkpoint(checkpoint, config, device=device, prompt_cache_size=8)


def model_config(checkpoint: str | Path):
    """The MoT config of a world model checkpoint, or an error naming what writes one."""
    from agents.wam.architectures import CONFIG_FILE
    from agents.wam.errors import MissingCheckpointError
    from agents.wam.mot.config import MoTConfig

    path = Path(checkpoint).expanduser() / CONFIG_FILE
    if not path.is_file():
        raise MissingCheckpointError(
            f"world model checkpoint {checkpoint} has no {CONFIG_FILE}; pass checkpoint= a directory written by "
            "`python -m training` (e.g. outputs/<task>/checkpoint)"
        )
    return MoTConfig.load(path)


class WorldModelEnv(gym.Env):
    """Imagined rollouts of a WAM checkpoint (see the module doc)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        checkpoint: str | None = None,
        dataset: str | None = None,
        episodes: Sequence[int] | None = None,
        predictor: Any = None,
        device: str = "cpu",
        num_inference_steps: int = 10,
        sampler: str = "unipc",
        shift: float = 5.0,
        frame_stride: int | None = None,
        render_mode: str | None = None,
        start_from: str | None = None,
        start_kwargs: dict[str, Any] | None = None,
        success_detector: str | None = None,
        privileged_from_simulator: bool = False,
    ):
        if checkpoint is None or (dataset is None) == (start_from is None):
            raise MissingAssetsError(
                "wam_gym/WorldModel-v0 needs checkpoint= (a WAM checkpoint directory) and dataset= (the LeRobot "
                "dataset its episodes start from; or instead start_from=ENV_ID, an env whose resets it starts from), "
                "e.g. gymnasium.make('wam_gym/WorldModel-v0', checkpoint='outputs/demo/train/checkpoint', "
                "dataset='outputs/demo/data')"
            )
        if privileged_from_simulator and start_from is None:
            raise ValueError("privileged_from_simulator=True steps the env of start_from= alongside: pass start_from")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be 'rgb_array' or None, got {render_mode!r}")

        self.checkpoint, self.device, self.render_mode = str(checkpoint), device, render_mode
        self.model_config = cfg = model_config(checkpoint)
        self.data = None if dataset is None else _dataset(dataset, cfg.cameras)
        self.simulator = None if start_from is None else _simulator(start_from, cfg, start_kwargs or {})
        self.privileged_from_simulator = privileged_from_simulator
        self.detector = None if success_detector is None else _detector(success_detector)
        if self.data is not None:
            self.episodes = list(range(self.data.num_episodes)) if episodes is None else [int(e) for e in episodes]
        self.frame_stride = int(frame_stride or cfg.default_frame_stride)
        self.steps_per_call = cfg.num_future_frames * self.frame_stride
        if not 1 <= self.steps_per_call <= cfg.action_horizon:
            raise ValueError(
                f"num_future_frames * frame_stride = {self.steps_per_call} must be in 1..action_horizon="
                f"{cfg.action_horizon}: the model imagines frames only as far as its action chunk reaches"
            )
        from agents.wam.inference_config import InferenceConfig

        InferenceConfig.from_knobs(num_inference_steps=num_inference_steps, sampler=sampler, shift=shift)  # now, not
        self._sampling = (int(num_inference_steps), sampler, float(shift))  # at the first reset, when the model loads
        self._predictor = predictor
        self.cameras = tuple(cfg.cameras)
        height, width = cfg.image_size
        observation = {PIXELS: pixel_space(self.cameras, height, width), STATE: vector_space(cfg.state_dim),
                       INSTRUCTION: instruction_space()}
        if privileged_from_simulator:
            observation[PRIVILEGED_STATE] = self.simulator.observation_space[PRIVILEGED_STATE]
        self.observation_space = spaces.Dict(observation)
        self.action_space = self.simulator.action_space if self.simulator else self._action_space(cfg.action_dim)
        self._obs: dict[str, Any] | None = None
        self._queued: list[np.ndarray] = []
        self._warned_state = False

    def _action_space(self, dim: int) -> spaces.Box:
        """The dataset's action range (its stats), else unbounded."""
        stats = self.data.stats.get(LEROBOT_ACTION, {}) if self.data.stats_path.is_file() else {}
        if "min" in stats and "max" in stats:
            return spaces.Box(np.asarray(stats["min"], np.float32), np.asarray(stats["max"], np.float32), (dim,), np.float32)
        return vector_space(dim)

    @property
    def predictor(self):
        if self._predictor is None:
            self._predictor = _shared_world_model(self.checkpoint, self.device, *self._sampling)
        return self._predictor

    # ----------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start from the simulator's reset for ``seed`` (``start_from``), or from ``options["episode_index"]``
        (default: one of ``episodes`` drawn from ``seed``) at ``options["start_frame"]`` (default 0)."""
        super().reset(seed=seed)
        self._queued, self._calls, self._solved = [], 0, False
        self._noise_base = int(self.np_random.integers(2**31))
        if self.simulator is not None:
            return self._reset_from_simulator(seed, options)
        options = dict(options or {})
        ep = int(options.get("episode_index", self.episodes[int(self.np_random.integers(len(self.episodes)))]))
        if not 0 <= ep < self.data.num_episodes:
            raise ValueError(f"episode_index={ep} out of range: the dataset has {self.data.num_episodes} episodes")
        table = self.data.episode_table(ep)
        t = int(options.get("start_frame", 0))
        if not 0 <= t < len(table["index"]):
            raise ValueError(f"start_frame={t} out of range: episode {ep} has {len(table['index'])} frames")
        pixels = {c: resize_video(self.data.episode_frames(ep, c)[t], self.model_config.image_size) for c in self.cameras}
        self._obs = {
            PIXELS: pixels,
            STATE: np.asarray(table["state"][t], np.float32),
            INSTRUCTION: self.data.task_of(ep),
        }
        self._episode, self._frame = ep, t
        return self._copy_obs(), self._info()

    def _reset_from_simulator(self, seed: int | None, options: dict[str, Any] | None):
        obs, _ = self.simulator.reset(seed=seed, options=options)
        self._obs = {PIXELS: {c: obs[PIXELS][c].copy() for c in self.cameras}, STATE: np.asarray(obs[STATE], np.float32),
                     INSTRUCTION: obs[INSTRUCTION]}
        if self.privileged_from_simulator:
            self._obs[PRIVILEGED_STATE] = np.asarray(obs[PRIVILEGED_STATE], np.float32)
        self._episode, self._frame = None, 0
        return self._copy_obs(), self._info()

    def step(self, action):
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        chunk = self._checked(action)
        imagined = []
        for i in range(len(chunk)):
            self._queued.append(chunk[i])
            self._frame += 1
            if self.privileged_from_simulator:  # the simulator's state, for agents that read it
                self._obs[PRIVILEGED_STATE] = np.asarray(self.simulator.step(chunk[i])[0][PRIVILEGED_STATE], np.float32)
            if len(self._queued) == self.steps_per_call:
                imagined.append(self._imagine(lookahead=chunk[i + 1 :]))
        if imagined and self.detector is not None:  # the first frame judged solved ends the episode
            frames = np.concatenate(imagined)
            self._solved = bool((self.detector.probability(frames) > 0.5).any())
        info = self._info()
        if imagined:
            info["imagined_frames"] = np.concatenate(imagined)
        return self._copy_obs(), float(self._solved), self._solved, False, info

    def render(self):
        if self.render_mode != "rgb_array" or self._obs is None:
            return None
        return tile([self._obs[PIXELS][c] for c in self.cameras])

    # ----------------------------------------------------------------- imagination
    def _checked(self, action) -> np.ndarray:
        dim = self.model_config.action_dim
        arr = np.asarray(action, dtype=np.float32)
        chunk = arr[None] if arr.ndim == 1 else arr
        if chunk.ndim != 2 or chunk.shape[1] != dim or len(chunk) == 0:
            raise ValueError(
                f"WorldModel action must be one action ({dim},) or a chunk (n, {dim}); got shape {arr.shape}. "
                f"For a batch of envs use a VectorEnv, which takes (num_envs, {dim})"
            )
        if not np.all(np.isfinite(chunk)):
            raise ValueError(f"WorldModel action contains NaN or inf: {arr}; send finite actions (check the policy output)")
        return chunk

    def _imagine(self, lookahead: np.ndarray) -> np.ndarray:
        """Run the model on the queued actions; the observation becomes the last imagined frame."""
        horizon = self.model_config.action_horizon
        actions = np.concatenate([np.stack(self._queued), lookahead])[:horizon]
        request = stack_rows([{**self._obs, ACTION: actions}])
        prediction = self.predictor.predict(request, noise_seeds=[self._noise_base + self._calls])
        self._calls += 1
        future = prediction.video[0, 1:]  # frame 0 reconstructs the present
        views = np.split(future[-1], len(self.cameras), axis=1)
        self._obs[PIXELS] = dict(zip(self.cameras, views))
        if prediction.states is not None:
            self._obs[STATE] = np.asarray(prediction.states[0, self.steps_per_call - 1], np.float32)
        elif not self._warned_state:
            logger.warning("%s has no state head: the state holds (train with model.action_expert.predict_state=true)",
                           self.checkpoint)
            self._warned_state = True
        self._queued = []
        return future

    def _copy_obs(self) -> dict[str, Any]:
        obs = self._obs
        copy = {PIXELS: {c: v.copy() for c, v in obs[PIXELS].items()}, STATE: obs[STATE].copy(),
                INSTRUCTION: obs[INSTRUCTION]}
        if PRIVILEGED_STATE in obs:
            copy[PRIVILEGED_STATE] = obs[PRIVILEGED_STATE].copy()
        return copy

    def _info(self) -> dict[str, Any]:
        return {IS_SUCCESS: self._solved, "episode_index": self._episode, "frame_index": self._frame,
                "world_model_calls": self._calls}

    def close(self) -> None:
        if self.simulator is not None:
            self.simulator.close()


def _dataset(root: str, cameras: Sequence[str]):
    """The LeRobot dataset episodes start from, checked to hold the checkpoint's cameras."""
    from training.data.lerobot import LeRobotDataset

    data = LeRobotDataset(root, require_stats=False)
    missing = [c for c in cameras if c not in data.cameras]
    if missing:
        raise ValueError(f"the checkpoint's cameras {missing} are not in the dataset at {root}: {list(data.cameras)}")
    return data


def _simulator(env_id: str, cfg, kwargs: dict[str, Any]):
    """The real env episodes start from: the checkpoint's cameras and size; only resets render."""
    import envs

    return envs.make(env_id, cameras=list(cfg.cameras), image_size=tuple(cfg.image_size), lazy_pixels=True, **kwargs)


@functools.lru_cache(maxsize=4)
def _detector(folder: str):
    from wam_gym.world_model.success_detector import SuccessDetector

    return SuccessDetector.load(folder)
