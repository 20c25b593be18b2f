"""The Predictor interface: who answers a chunk-queue agent's model calls, one episode at a time.

A :class:`~agents.chunk_queue.ChunkQueueAgent` asks a predictor for action chunks; an eval actor
also tells it where each episode begins and ends, and reads what the episode's calls cost. Three
predictors ship: the inference broker's client (``wam_gym.broker.BrokerClient``), a policy server's
client (``wam_gym.remote.RemotePolicy``) and :class:`PolicyPredictor`, a :class:`~agents.policy.Policy`
(a :class:`~agents.wam.WAMPolicy`, or your own) called in this process. Subclass :class:`Predictor`
to write another: ``action_horizon`` and :meth:`Predictor.predict` are required, the rest have
defaults.

Numpy only, like agents/policy.py: a remote or python agent needs no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agents.policy import EpisodicPolicy, ModelCost, Policy, Prediction, as_prediction, denoise_steps
from envs.protocol import batch_size, stack_rows


def noise_seed(episode_seed: int, call: int, row: int = 0) -> int:
    """The sampling-noise seed of row ``row`` of an episode's ``call``-th model call: a function of
    the episode alone, so its noise never depends on what its requests were batched with."""
    return (episode_seed * 1_000_003 + call * 7919) % 2**62 + row


class Predictor(Protocol):
    """Answers observations with action chunks, episode by episode.

    Every predictor seeds its calls' sampling noise the same way (:meth:`call_seeds`): from the
    episode's seed and the call's number, so an episode gets the same actions in this process,
    through the broker or from a policy server.
    """

    action_horizon: int | None  # actions per chunk; None: known only from its answers (execute each chunk whole)
    cost: ModelCost  # what this episode's calls cost, as the predictor measured them (reset by begin_episode)
    on_wait: Callable[[], None] | None  # called about once a second while an answer is awaited (None: nobody)
    episode_seed: int = 0  # the episode's seed (begin_episode): its calls' noise derives from it
    calls: int = 0  # model calls made this episode

    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Prediction:
        """A batch of observations (env contract, batch axis first) -> its chunks, (B, horizon, action_dim)."""
        ...

    def predict_row(self, obs: Mapping[str, Any], noise_seed: int | None = None) -> Prediction:
        """One env's observation (no batch axis) -> its chunk (horizon, action_dim)."""
        return self.predict(stack_rows([obs]), None if noise_seed is None else [noise_seed]).row(0)

    def begin_episode(self, seed: int, task: str | None = None) -> None:
        """An episode starts: its seed (sampling noise derives from it) and its task's name."""
        self.episode_seed, self.calls, self.cost = seed, 0, ModelCost()

    def call_seeds(self, rows: int, noise_seeds: Sequence[int] | None = None) -> list[int]:
        """One call's noise seeds, ``rows`` of them: as given, else derived from the episode and the call; counts the call."""
        if noise_seeds is None:
            noise_seeds = [noise_seed(self.episode_seed, self.calls, row) for row in range(rows)]
        self.calls += 1
        return [int(seed) for seed in noise_seeds]

    def end_episode(self, success: bool) -> None:
        """The episode ended (a policy server may hear how)."""

    def release_episode(self, episode: int) -> None:
        """The model may let go of what it remembers of episode ``episode`` (the id its calls carried,
        agents/episode_memory.py): its env was reset. Nothing to let go of by default."""

    def close(self) -> None:
        """Release what this process holds (connections, pipes)."""


class PolicyPredictor(Predictor):
    """A Policy called in this process; ``cost`` is the wall time of its calls and their denoising steps."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.action_horizon = policy.action_horizon
        self.cost = ModelCost()
        self.on_wait = None  # a call in this process runs in the caller's own time

    def __str__(self) -> str:
        return f"the policy {type(self.policy).__name__}"

    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Prediction:
        rows = batch_size(obs)
        seeds = self.call_seeds(rows, noise_seeds)
        start = time.perf_counter()
        prediction = as_prediction(self.policy.predict(obs, noise_seeds=seeds), rows)
        self.cost.add(time.perf_counter() - start, denoise_steps(self.policy))
        return prediction

    def release_episode(self, episode: int) -> None:
        if isinstance(self.policy, EpisodicPolicy):
            self.policy.end_episode(episode)
