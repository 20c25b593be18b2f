"""The one episode runner: reset, act, step until the episode ends, and its bookkeeping.

Evaluation actors, demo collection, benchmarks and the world-model interaction loop all run
episodes with :func:`run_episode`; what each records along the way (a video frame, a dataset
row, imagined frames) goes in through its hooks. Vectorised rollouts (wam_gym/eval/rollout.py)
keep one :class:`Episode` per env slot, so success, steps and reward are counted one way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.protocol import IS_SUCCESS

Observation = Mapping[str, Any]


@dataclass
class Episode:
    """What an episode came to so far."""

    seed: int | None = None
    steps: int = 0
    reward: float = 0.0
    success: bool = False  # at any step: benchmarks count an episode solved the first time it succeeds
    info: dict[str, Any] = field(default_factory=dict)  # the reset's info, updated by each step's (keeps e.g. init_state_id)
    env_s: float = 0.0  # seconds spent in the env's reset and steps (simulation and rendering): the episode's env cost

    def count_step(self, reward: float, success: bool) -> None:
        self.steps += 1
        self.reward += float(reward)
        self.success = self.success or bool(success)


def step_succeeded(info: Mapping[str, Any]) -> bool:
    return bool(info.get(IS_SUCCESS, False))


def run_episode(
    env,
    agent,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    max_steps: int | None = None,
    observe: Callable[[Observation, dict[str, Any]], None] | None = None,
    after_act: Callable[[Observation, np.ndarray], None] | None = None,
    lazy_pixels: bool = False,
    hooks_read_pixels: Callable[[], bool] | None = None,
) -> Episode:
    """One episode of ``agent`` in ``env`` (a single, non-vector env), reset with ``seed``/``options``.

    Runs until the env terminates or truncates, or after ``max_steps`` steps (default: the
    env's registered limit; none without one). Two optional hooks:
    ``observe(obs, info)`` gets what the reset and then every step return, before the agent
    acts on it; it may raise to abandon the episode (no model call, no step is wasted).
    ``after_act(obs, action)`` gets each action with the observation it answers, before the
    env steps (an env may reuse the buffers of its observation).

    ``lazy_pixels=True`` (the env was made with ``lazy_pixels=True``, envs/contract.py) renders
    only the observations someone reads: before each step, pixels are requested when the agent
    reads them at its next act (``Agent.reads_pixels``) or ``hooks_read_pixels()`` says a hook
    will (a video frame, an imagination target). Outcomes are the same either way.
    """
    start = time.perf_counter()
    obs, info = env.reset(seed=seed, options=options)
    episode = Episode(seed=seed, success=step_succeeded(info), info=info, env_s=time.perf_counter() - start)
    agent.reset()
    limit = max_steps if max_steps is not None else _registered_limit(env)
    if observe is not None:
        observe(obs, info)
    while limit is None or episode.steps < limit:
        action = agent.act(obs)
        if after_act is not None:
            after_act(obs, action)
        if lazy_pixels:
            env.unwrapped.pixels_requested = agent.reads_pixels() or (hooks_read_pixels is not None and hooks_read_pixels())
        start = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(action)
        episode.env_s += time.perf_counter() - start
        episode.count_step(reward, step_succeeded(info))
        episode.info = {**episode.info, **info}  # keys only the reset reports (LIBERO's init_state_id) stay
        if observe is not None:
            observe(obs, info)
        if terminated or truncated:
            break
    return episode


def _registered_limit(env) -> int | None:
    spec = getattr(env, "spec", None)
    return (spec.max_episode_steps or None) if spec is not None else None
