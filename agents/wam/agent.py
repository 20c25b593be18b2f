"""A World Action Model as an agent: action chunks, executed from per-env queues.

The model predicts ``action_horizon`` actions; the agent executes the first
``replan_steps`` of them, then asks again. Each env of a batch has its own queue, so envs
reset at different times replan at different steps, and only the envs whose queue ran dry
send their observation to the model (through any object with ``predict(obs) -> Prediction``:
a local :class:`WAMPolicy`, or the inference broker's client).
"""

from __future__ import annotations

import logging
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from agents.base import Agent, as_batch, batch_size, select
from agents.wam.policy import InferenceConfig, Prediction, WAMPolicy

logger = logging.getLogger(__name__)


class Predictor(Protocol):
    action_horizon: int

    def predict(self, obs: Mapping[str, Any]) -> Prediction: ...


@dataclass
class WAMAgentConfig:
    """What an evaluation needs to build a WAM agent (EVALUATION.* in the Hydra config)."""

    checkpoint: str | None = None  # a directory written by save_pretrained / python -m training
    dataset_stats_path: str | None = None  # else the checkpoint's dataset_stats.json
    action_horizon: int | None = None  # actions kept per prediction; null = the model's horizon
    replan_steps: int | None = None  # actions executed before replanning; null = action_horizon
    device: str = "cpu"
    inference: InferenceConfig = field(default_factory=InferenceConfig)


class WAMAgent(Agent):
    def __init__(
        self,
        predictor: Predictor,
        action_horizon: int | None = None,
        replan_steps: int | None = None,
        action_space: spaces.Box | None = None,
    ):
        self.predictor = predictor
        self.action_horizon = _horizon(action_horizon, predictor.action_horizon)
        self.replan_steps = _replan_steps(replan_steps, self.action_horizon)
        self.action_space = action_space
        self._queues: dict[int, deque[np.ndarray]] = {}
        self.last_prediction: dict[int, Prediction] = {}  # per env: its latest chunk (and video)
        self.num_model_calls = 0

    @classmethod
    def from_config(cls, config: WAMAgentConfig, action_space: spaces.Box | None = None) -> WAMAgent:
        if config.checkpoint is None:
            raise ValueError("WAMAgentConfig.checkpoint is required: pass the directory a training run saved")
        policy = WAMPolicy.from_checkpoint(
            config.checkpoint, config.inference, config.dataset_stats_path, device=config.device
        )
        return cls(policy, config.action_horizon, config.replan_steps, action_space)

    def reset(self, env_ids: list[int] | None = None) -> None:
        for i in list(self._queues) if env_ids is None else env_ids:
            self._queues.pop(i, None)
            self.last_prediction.pop(i, None)

    def replan(self, obs: Mapping[str, Any]) -> None:
        """Drop every queued action and predict new chunks from ``obs`` now."""
        single = batch_size(obs) is None
        batch = as_batch(obs) if single else obs
        n = np.asarray(batch["state"]).shape[0]
        self._plan(batch, list(range(n)))

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        single = batch_size(obs) is None
        batch = as_batch(obs) if single else obs
        n = np.asarray(batch["state"]).shape[0]
        dry = [i for i in range(n) if not self._queues.get(i)]
        if dry:
            self._plan(select(batch, dry) if len(dry) < n else batch, dry)
        actions = np.stack([self._queues[i].popleft() for i in range(n)])
        return actions[0] if single else actions

    def act_one(self, obs: Mapping[str, Any], env_index: int) -> np.ndarray:
        return self.act(obs)

    def _plan(self, obs: Mapping[str, Any], env_ids: list[int]) -> None:
        prediction = self.predictor.predict(obs)
        self.num_model_calls += 1
        chunk = prediction.actions[:, : self.replan_steps]
        if self.action_space is not None:
            chunk = np.clip(chunk, self.action_space.low, self.action_space.high)
        for row, env_id in enumerate(env_ids):
            self._queues[env_id] = deque(chunk[row].astype(np.float32))
            video = None if prediction.video is None else prediction.video[row]
            self.last_prediction[env_id] = Prediction(prediction.actions[row], video)


def _horizon(requested: int | None, model_horizon: int) -> int:
    if requested is None:
        return model_horizon
    if not 1 <= requested <= model_horizon:
        raise ValueError(f"action_horizon={requested}: the model predicts 1..{model_horizon} actions per call")
    return requested


def _replan_steps(requested: int | None, horizon: int) -> int:
    if requested is None:
        return horizon
    if requested < 1:
        raise ValueError(f"replan_steps={requested} must be >= 1")
    if requested > horizon:
        warnings.warn(f"replan_steps={requested} > action_horizon={horizon}: clipped to {horizon}", stacklevel=3)
        return horizon
    return requested
