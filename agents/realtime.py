"""Real-time chunk execution: the robot does not pause while the model thinks.

A synchronous evaluation freezes the world during each model call. On a real robot the arm
keeps moving, so a WAM whose call takes 300 ms at 20 Hz acts on an observation 6 steps old.
:class:`RealtimeChunkAgent` replays that in simulated time, one env at a time:

* A call is issued with the observation of step ``t`` and **arrives** ``d`` steps later,
  ``d = ceil(latency x control_hz)``: the latency is the call's measured time, or a fixed
  :attr:`Latency.fixed_ms` (reproducible), and ``control_hz`` the simulator's steps per second.
* Until it arrives the env keeps stepping on **the rest of the previous chunk**; once that runs
  out, it **holds**: the chunk's last action is repeated (the hold rule).
* The new chunk takes over at ``t + d`` with its action ``d``: the actions whose time has passed
  are skipped.
* The next call is issued ``max(replan_steps, d)`` steps after the last one: every
  ``replan_steps`` steps, as synchronously, but never while a call is in flight (one at a time).
* An episode's first chunk is awaited: the robot starts from rest when it arrives.

With ``d = 0`` (``fixed_ms=0``) every step is what :class:`~agents.chunk_queue.ChunkQueueAgent`
does. The simulator is paused while the call runs, so a measured latency changes with the
machine's load, a fixed one does not. The next chunk is not conditioned on the actions already
committed (real-time chunking's prefix inpainting): each call sees only its observation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from agents.chunk_queue import ChunkQueueAgent
from agents.predictor import Predictor
from envs.protocol import batch_size


@dataclass(frozen=True)
class Latency:
    """How long a model call takes in simulated time."""

    fixed_ms: float | None = None  # None: each call's measured wall time

    def steps(self, measured_s: float, control_hz: float) -> int:
        """The env steps that pass while a call of ``measured_s`` seconds runs."""
        seconds = measured_s if self.fixed_ms is None else self.fixed_ms / 1000.0
        return math.ceil(seconds * control_hz - 1e-9)

    def describe(self) -> str:
        return "each call's measured time" if self.fixed_ms is None else f"fixed {self.fixed_ms:g} ms"


HOLD_RULE = "until a new chunk arrives, the rest of the previous chunk, then its last action repeated"


@dataclass
class _InFlight:
    chunk: np.ndarray  # the answer, (horizon, action_dim)
    steps_left: int  # until it arrives
    skip: int  # its actions whose time will have passed when it arrives


class RealtimeChunkAgent(ChunkQueueAgent):
    """A chunk-queue agent on one env whose model calls take simulated time (see the module doc)."""

    def __init__(
        self,
        predictor: Predictor,
        latency: Latency,
        action_horizon: int | None = None,
        replan_steps: int | None = None,
        action_space: spaces.Box | None = None,
    ):
        super().__init__(predictor, action_horizon, replan_steps, action_space)
        self.latency = latency
        self.control_hz: float | None = None  # the env's steps per second: set by the runner for each env
        self.held_steps = 0  # steps that repeated an action because no chunk had one (this episode)
        self.reset()

    def reset(self, env_ids: list[int] | None = None) -> None:
        super().reset(env_ids)
        self._chunk: np.ndarray | None = None  # the chunk being executed
        self._position = 0  # its next action's index
        self._until_call = 0  # steps until the next call is issued
        self._in_flight: _InFlight | None = None
        self.held_steps = 0

    def reads_pixels(self, env_index: int = 0) -> bool:
        return self._chunk is None or self._until_call == 0

    def replan(self, obs: Mapping[str, Any]) -> None:
        raise NotImplementedError("a real-time agent replans on its own clock; call act(obs) every step")

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        if batch_size(obs) is not None:
            raise ValueError("a real-time agent runs one env (its clock is that env's): pass one env's observation")
        if self.control_hz is None:
            raise ValueError("set control_hz (the env's steps per second, env.unwrapped.control_hz) before acting")
        if self._chunk is None:  # the episode's first chunk is awaited
            chunk, _ = self._call(obs)
            self._take(chunk, 0)
            self._until_call = self._replan(chunk)
        else:
            if self._in_flight is not None and self._in_flight.steps_left == 0:  # it arrives now
                self._take(self._in_flight.chunk, self._in_flight.skip)
                self._in_flight = None
            if self._until_call == 0:
                chunk, delay = self._call(obs)
                if delay == 0:
                    self._take(chunk, 0)
                else:
                    self._in_flight = _InFlight(chunk, delay, delay)
                self._until_call = max(self._replan(chunk), delay)
        return self._next_action()

    def _call(self, obs: Mapping[str, Any]) -> tuple[np.ndarray, int]:
        """The model's chunk for ``obs`` (clipped) and the steps that pass before it arrives."""
        start = time.perf_counter()
        prediction = self.predictor.predict_row(obs)
        delay = self.latency.steps(time.perf_counter() - start, self.control_hz)
        self.num_model_calls += 1
        self._check_chunk(prediction.actions.shape)
        self.last_prediction[0] = prediction
        chunk = prediction.actions[: self.action_horizon].astype(np.float32)
        if self.action_space is not None:
            chunk = np.clip(chunk, self.action_space.low, self.action_space.high)
        return chunk, delay

    def _take(self, chunk: np.ndarray, position: int) -> None:
        self._chunk, self._position = chunk, position

    def _replan(self, chunk: np.ndarray) -> int:
        return min(self.replan_steps or len(chunk), len(chunk))

    def _next_action(self) -> np.ndarray:
        if self._position < len(self._chunk):
            action = self._chunk[self._position]
        else:
            action = self._chunk[-1]
            self.held_steps += 1
        self._position += 1
        self._until_call -= 1
        if self._in_flight is not None:
            self._in_flight.steps_left -= 1
        return action
