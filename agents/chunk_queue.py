"""The chunk-queue agent: a predictor's action chunks, executed from per-env queues.

The predictor (agents/predictor.py: a WAM checkpoint through the inference broker, your own
policy, a policy server) answers ``action_horizon`` actions; the agent executes the first
``replan_steps`` of them, then asks again. A predictor whose ``action_horizon`` is None (a
remote policy server, whose chunk length is known only from its answers) has every chunk
executed whole, unless ``action_horizon``/``replan_steps`` cap it. Each env of a batch has its
own queue, so envs reset at different times replan at different steps, and only the envs whose
queue ran dry send their observation to the model; one env's observation goes as one row
(``Predictor.predict_row``), never wrapped into a batch to be split again.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from agents.base import Agent
from agents.policy import Prediction  # not agents.wam's policy: no torch for remote/python agents
from agents.predictor import Predictor
from envs.protocol import batch_size, select_rows


class ChunkQueueAgent(Agent):
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

    def reset(self, env_ids: list[int] | None = None) -> None:
        for i in list(self._queues) if env_ids is None else env_ids:
            self._queues.pop(i, None)
            self.last_prediction.pop(i, None)

    def replan(self, obs: Mapping[str, Any]) -> None:
        """Drop every queued action and predict new chunks from ``obs`` now."""
        n = batch_size(obs)
        if n is None:
            self._plan_one(obs)
        else:
            self._plan(obs, list(range(n)))

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        n = batch_size(obs)
        if n is None:  # one env's observation
            if not self._queues.get(0):
                self._plan_one(obs)
            return self._queues[0].popleft()
        dry = [i for i in range(n) if not self._queues.get(i)]
        if dry:  # only envs whose queue ran dry send their observation to the model
            self._plan(select_rows(obs, dry) if len(dry) < n else obs, dry)
        return np.stack([self._queues[i].popleft() for i in range(n)])

    def act_one(self, obs: Mapping[str, Any], env_index: int) -> np.ndarray:
        return self.act(obs)

    def reads_pixels(self, env_index: int = 0) -> bool:
        """Only an env whose queue is empty sends its next observation to the model."""
        return not self._queues.get(env_index)

    def _plan(self, obs: Mapping[str, Any], env_ids: list[int]) -> None:
        prediction = self.predictor.predict(obs)
        self.num_model_calls += 1
        self._check_chunk(prediction.actions.shape[1:])
        for row, env_id in enumerate(env_ids):
            self._queue(env_id, prediction.row(row))

    def _plan_one(self, obs: Mapping[str, Any]) -> None:
        prediction = self.predictor.predict_row(obs)
        self.num_model_calls += 1
        self._check_chunk(prediction.actions.shape)
        self._queue(0, prediction)

    def _queue(self, env_id: int, prediction: Prediction) -> None:
        """Env ``env_id``'s queue: the first replan_steps actions of its chunk, clipped to the action space."""
        chunk = prediction.actions[: self.replan_steps]  # replan_steps None: the whole chunk
        if self.action_space is not None:
            chunk = np.clip(chunk, self.action_space.low, self.action_space.high)
        self._queues[env_id] = deque(chunk.astype(np.float32))
        self.last_prediction[env_id] = prediction

    def _check_chunk(self, shape: tuple[int, ...]) -> None:
        """A chunk of ``shape`` (steps, *action) the env cannot take is refused here, naming who sent it,
        not as a numpy error steps later."""
        if shape[0] < 1:
            raise ValueError(f"{self.predictor} answered a chunk of no actions ({shape}); every answer needs "
                             "at least one action per env")
        if self.action_space is not None and shape[1:] != self.action_space.shape:
            raise ValueError(f"{self.predictor} answered actions of {shape[1:]} per step; the env takes "
                             f"{self.action_space.shape}: the policy was made for another env (or another key map)")


def _horizon(requested: int | None, model_horizon: int | None) -> int | None:
    if requested is None:
        return model_horizon
    if model_horizon is None:  # unknown: the request caps whatever the chunks turn out to be
        if requested < 1:
            raise ValueError(f"action_horizon={requested} must be >= 1")
        return requested
    if not 1 <= requested <= model_horizon:
        raise ValueError(f"action_horizon={requested}: the model predicts 1..{model_horizon} actions per call")
    return requested


def _replan_steps(requested: int | None, horizon: int | None) -> int | None:
    if requested is None:
        return horizon
    if requested < 1:
        raise ValueError(f"replan_steps={requested} must be >= 1")
    if horizon is not None and requested > horizon:
        warnings.warn(f"replan_steps={requested} > action_horizon={horizon}: clipped to {horizon}", stacklevel=3)
        return horizon
    return requested
