"""Closed-loop episodes of an agent in a VectorEnv, one exact seed per episode.

The vector env must not autoreset (``AutoresetMode.DISABLED``): each finished slot is reset
here with the next episode's own seed, so episode ``k`` is the same episode whichever slot,
worker or run it lands in. Each slot counts its episode with agents.episode.Episode, as the
single-env runner (agents.episode.run_episode) does.

With envs made with ``lazy_pixels=True`` (``envs.make_vec(id, n, lazy_pixels=True)``), pass
``lazy_pixels=True``: before each step, each env renders only if the agent reads its next
observation (a chunk-queue agent: when that env's queue runs dry).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from agents.base import Agent
from agents.episode import Episode
from envs.protocol import IS_SUCCESS


@dataclass(frozen=True)
class EpisodeResult:
    episode: int
    seed: int
    success: bool
    steps: int
    reward: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Slot:
    """The episode an env slot is running: its index in ``seeds`` and its tally."""

    index: int
    tally: Episode

    def result(self) -> EpisodeResult:
        return EpisodeResult(self.index, self.tally.seed, self.tally.success, self.tally.steps, self.tally.reward)


def _check_no_autoreset(vec_env: VectorEnv) -> None:
    mode = vec_env.metadata.get("autoreset_mode")
    if mode != AutoresetMode.DISABLED:
        raise ValueError(
            f"run_episodes needs a vector env with autoreset disabled (got {mode}); "
            "create it with envs.make_vec(...) or vector_kwargs={'autoreset_mode': AutoresetMode.DISABLED}"
        )


def run_episodes(
    vec_env: VectorEnv,
    agent: Agent,
    seeds: Sequence[int],
    on_episode: Callable[[EpisodeResult], None] | None = None,
    lazy_pixels: bool = False,
) -> list[EpisodeResult]:
    """Run one episode per seed (episode index = position in ``seeds``); results in episode order."""
    _check_no_autoreset(vec_env)
    n = vec_env.num_envs
    pending = deque(enumerate(seeds))
    slots: list[_Slot | None] = [None] * n
    results: list[EpisodeResult] = []

    def start(mask: np.ndarray):
        # a finished env cannot be stepped, so slots with no episode left are reset too and idle
        seed_list: list[int | None] = [None] * n
        for i in np.flatnonzero(mask):
            if pending:
                index, seed = pending.popleft()
                slots[i] = _Slot(index, Episode(seed=seed))
                seed_list[i] = seed
        agent.reset([int(i) for i in np.flatnonzero(mask)])
        # a masked reset returns the whole batch: reset slots fresh, the others as stepped
        return vec_env.reset(seed=seed_list, options={"reset_mask": mask})[0]

    if not pending:
        return results
    obs = start(np.ones(n, bool))
    idle_action = np.zeros(vec_env.action_space.shape, vec_env.action_space.dtype)
    while any(slots):
        actions = np.where(np.array([s is not None for s in slots])[:, None], agent.act(obs), idle_action)
        if lazy_pixels:
            vec_env.set_attr("pixels_requested", [agent.reads_pixels(i) for i in range(n)])
        next_obs, rewards, terminated, truncated, infos = vec_env.step(actions)
        done = np.zeros(n, bool)
        for i, slot in enumerate(slots):
            if slot is None:
                continue
            slot.tally.count_step(rewards[i], infos[IS_SUCCESS][i])
            if terminated[i] or truncated[i]:
                result = slot.result()
                results.append(result)
                if on_episode:
                    on_episode(result)
                slots[i] = None
                done[i] = True
        obs = start(done) if done.any() and any(slots + [pending]) else next_obs
    return sorted(results, key=lambda r: r.episode)
