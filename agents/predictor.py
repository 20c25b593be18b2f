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

from agents.policy import ModelCost, Policy, Prediction, as_prediction, denoise_steps
from envs.protocol import batch_size, stack_rows


class Predictor(Protocol):
    """Answers observations with action chunks, episode by episode."""

    action_horizon: int | None  # actions per chunk; None: known only from its answers (execute each chunk whole)
    cost: ModelCost  # what this episode's calls cost, as the predictor measured them (reset by begin_episode)
    on_wait: Callable[[], None] | None  # called about once a second while an answer is awaited (None: nobody)

    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Prediction:
        """A batch of observations (env contract, batch axis first) -> its chunks, (B, horizon, action_dim)."""
        ...

    def predict_row(self, obs: Mapping[str, Any], noise_seed: int | None = None) -> Prediction:
        """One env's observation (no batch axis) -> its chunk (horizon, action_dim)."""
        return self.predict(stack_rows([obs]), None if noise_seed is None else [noise_seed]).row(0)

    def begin_episode(self, seed: int, task: str) -> None:
        """An episode starts: its seed (sampling noise derives from it) and its task's name."""
        self.cost = ModelCost()

    def end_episode(self, success: bool) -> None:
        """The episode ended (a policy server may hear how)."""

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
        start = time.perf_counter()
        prediction = as_prediction(self.policy.predict(obs, noise_seeds=noise_seeds), batch_size(obs))
        self.cost.add(time.perf_counter() - start, denoise_steps(self.policy))
        return prediction
