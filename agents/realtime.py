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
machine's load, a fixed one does not.

That is the ``hold`` strategy. agents/realtime_strategies.py has the others (``naive``, ``ensemble``, and
``rtc``, whose calls carry the committed actions so the model's sampler continues them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from agents import rtc
from agents.chunk_queue import ChunkQueueAgent
from agents.predictor import Predictor
from agents.realtime_strategies import Anchored, kept
from agents.realtime_strategies import strategy as realtime_strategy
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
    chunk: Anchored  # the answer, anchored at the step it was asked for
    arrives: int  # the step it takes over


class RealtimeChunkAgent(ChunkQueueAgent):
    """A chunk-queue agent on one env whose model calls take simulated time (see the module doc); ``strategy``
    merges the chunks (agents/realtime_strategies.py: hold, naive, ensemble, rtc)."""

    def __init__(
        self,
        predictor: Predictor,
        latency: Latency,
        action_horizon: int | None = None,
        replan_steps: int | None = None,
        action_space: spaces.Box | None = None,
        strategy: str = "hold",
    ):
        super().__init__(predictor, action_horizon, replan_steps, action_space)
        self.latency = latency
        self.strategy = realtime_strategy(strategy)
        self.control_hz: float | None = None  # the env's steps per second: set by the runner for each env
        self.held_steps = 0  # steps that repeated an action because no chunk had one (this episode)
        self.reset()

    def reset(self, env_ids: list[int] | None = None) -> None:
        super().reset(env_ids)
        self._chunks: list[Anchored] = []  # arrived chunks the strategy may still read, oldest first
        self._t = 0  # this episode's step
        self._next_call = 0  # the step the next call is issued at
        self._in_flight: _InFlight | None = None
        self._delay = 0  # the last call's delay: a measured latency's estimate of the next
        self.held_steps = 0

    def reads_pixels(self, env_index: int = 0) -> bool:
        return not self._chunks or self._t >= self._next_call

    def replan(self, obs: Mapping[str, Any]) -> None:
        raise NotImplementedError("a real-time agent replans on its own clock; call act(obs) every step")

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        if batch_size(obs) is not None:
            raise ValueError("a real-time agent runs one env (its clock is that env's): pass one env's observation")
        if self.control_hz is None:
            raise ValueError("set control_hz (the env's steps per second, env.unwrapped.control_hz) before acting")
        t = self._t
        if self._in_flight is not None and self._in_flight.arrives <= t:
            self._arrive(self._in_flight.chunk)
        if not self._chunks or t >= self._next_call:
            first = not self._chunks  # the episode's first chunk is awaited: the robot starts from rest
            chunk, self._delay = self._call(obs, t)
            delay = 0 if first else self._delay
            if delay == 0:
                self._arrive(chunk)
            else:
                self._in_flight = _InFlight(chunk, t + delay)
            self._next_call = t + self.strategy.next_call_in(self._replan_steps(), len(chunk.actions), delay, self._delay)
        action, held = self.strategy.action(self._chunks, t)
        self.held_steps += held
        self._t += 1
        return action

    def _call(self, obs: Mapping[str, Any], t: int) -> tuple[Anchored, int]:
        """The model's chunk for ``obs`` (clipped), anchored at ``t``, and the steps that pass before it arrives."""
        if self.strategy.carries_prefix and self._chunks:  # the first call has nothing committed: a plain call
            obs = {**obs, **self._rtc_entries(t)}
        start = time.perf_counter()
        prediction = self.predictor.predict_row(obs)
        delay = self.latency.steps(time.perf_counter() - start, self.control_hz)
        self.num_model_calls += 1
        self._check_chunk(prediction.actions.shape)
        self.last_prediction[0] = prediction
        chunk = prediction.actions[: self.action_horizon].astype(np.float32)
        if self.action_space is not None:
            chunk = np.clip(chunk, self.action_space.low, self.action_space.high)
        return Anchored(t, chunk), delay

    def _rtc_entries(self, t: int) -> dict[str, Any]:
        """What the call at ``t`` carries for real-time chunking: the actions committed from ``t`` on."""
        horizon = self.predictor.action_horizon or self.action_horizon  # padded to the model's chunk length
        if horizon is None:
            raise ValueError("EVALUATION.realtime_strategy=rtc pads the committed actions to the model's chunk length, "
                             "which this predictor does not know: set EVALUATION.action_horizon")
        delay = self.latency.steps(0.0, self.control_hz) if self.latency.fixed_ms is not None else self._delay
        rest = self.strategy.committed(self._chunks, t, min(delay, horizon))
        return rtc.entries(rest, min(delay, len(rest), horizon), horizon, rest.shape[1])

    def _arrive(self, chunk: Anchored) -> None:
        self._chunks = kept([*self._chunks, chunk], self._t, self.strategy)
        self._in_flight = None

    def _replan_steps(self) -> int:
        return self.replan_steps or self.action_horizon or 1
