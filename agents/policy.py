"""The Policy protocol: the one model call that the inference broker batches and serves.

Evaluation (``python -m wam_gym.eval``) and the policy server (``python -m wam_gym.serve``)
serve any object with::

    action_horizon: int                                  # actions per predicted chunk
    def predict(self, obs, noise_seeds=None): ...        # a batch -> action chunks
    num_inference_steps: int                             # optional: denoising steps per call (results' cost)

``obs`` is a batch in the env contract (envs/protocol.py): ``obs["pixels"][camera]`` is
``(B, H, W, 3)`` uint8, ``obs["state"]`` ``(B, state_dim)`` float, ``obs["instruction"]`` B
strings. ``noise_seeds`` (B ints, or None) seed each row's sampling noise, so a row's answer
does not depend on what it was batched with; a deterministic policy ignores them.
``predict`` returns a :class:`Prediction`, a dict with ``"actions"`` (and optionally
``"video"``, ``"states"``), or the actions array itself: ``(B, action_horizon, action_dim)``
in the env's units. :class:`agents.wam.WAMPolicy` is one such policy; ``EVALUATION.agent=python
EVALUATION.policy=pkg.module:factory`` serves your own (``factory(device)`` builds it inside
each model worker). A policy that remembers each episode between calls (LingBot-VA) subclasses
:class:`EpisodicPolicy`: the broker then keeps each episode on one model worker.

Numpy only: this module sits below every model, so a policy needs no torch to be served.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np

from envs.protocol import stack_rows, take_row


@dataclass
class Prediction:
    actions: np.ndarray  # (B, action_horizon, action_dim) float32, in the env's units
    video: np.ndarray | None = None  # (B, 1 + num_future_frames, H, W * cameras, 3) uint8
    states: np.ndarray | None = None  # (B, action_horizon, state_dim): the state after each action (world model)

    def row(self, i: int) -> Prediction:
        """Row ``i`` without its batch axis: one env's chunk, or one request's answer."""
        return Prediction(**take_row(_fields(self), i))

    @staticmethod
    def stack(rows: Sequence[Prediction]) -> Prediction:
        """Rows (e.g. answered by different model calls) -> one batch."""
        return Prediction(**stack_rows([_fields(r) for r in rows]))


def _fields(prediction: Any) -> dict[str, Any]:
    """The fields a Prediction carries, read off ``prediction`` (any object with those attributes)."""
    return {f.name: getattr(prediction, f.name, None) for f in fields(Prediction)}


@dataclass
class ModelCost:
    """What one episode's model calls cost, as its predictor measured them (None: not measured).

    ``model_s`` is device time: a batched call's seconds are shared equally by the requests in its
    batch, so summed over episodes it is the time the model workers spent, and "successes per
    model-second" compares checkpoints, samplers and batch settings on what they cost to serve.
    """

    model_s: float | None = None  # the model's seconds attributed to this episode's requests
    denoise_steps: int | None = None  # denoising steps run for this episode's requests (None: the policy does not say)

    def add(self, model_s: float | None, denoise_steps: int | None) -> None:
        if model_s is not None:
            self.model_s = (self.model_s or 0.0) + model_s
        if denoise_steps is not None:
            self.denoise_steps = (self.denoise_steps or 0) + denoise_steps


@runtime_checkable
class Policy(Protocol):
    action_horizon: int

    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Any: ...


class EpisodicPolicy(ABC):
    """A Policy that remembers each episode between its calls (an autoregressive WAM's KV cache, ...), and says
    so by subclassing this. Each row of its calls carries the episode's id (``obs["episode"]``, driven by
    :class:`agents.episode_memory.MemoryChunkAgent`). The inference broker then keeps every episode on the one
    model worker that holds its state, and calls :meth:`end_episode` there when the episode is over. Declared,
    not guessed from the methods a policy happens to have: a stateless policy with an ``end_episode`` of its own
    must not have its calls pinned to one worker.

    ``predict`` refuses a call (raises) before it changes any episode's state: a model worker whose call raises
    runs the call's rows again one by one, so that one bad row fails alone, and a row whose episode had already
    moved on would move on twice."""

    action_horizon: int
    # How many episodes it holds at once (its memory for their state, sized when it is built): the broker
    # places no more on its worker and queues new episodes past it until one ends.
    episode_capacity: int

    @abstractmethod
    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Any: ...

    @abstractmethod
    def end_episode(self, episode: int) -> None:
        """Let go of ``episode``'s state now: its env was reset, its actor is gone, or the run ends. An id not
        held (never seen, or let go already) is no error."""


def denoise_steps(policy: Policy) -> int | None:
    """The policy's denoising steps per call, for results' cost columns: optional in the protocol
    (a user's policy may have none to report), so this is the one place that reads it."""
    return getattr(policy, "num_inference_steps", None)


def as_prediction(result: Any, rows: int) -> Prediction:
    """A policy's answer for a batch of ``rows`` as a :class:`Prediction`, its actions checked:
    a wrong shape here would otherwise reach an env as a wrong action."""
    if isinstance(result, Mapping):
        if "actions" not in result:
            raise ValueError(f"the policy's predict returned a dict without 'actions' (keys {sorted(result)}); "
                             "return {'actions': (B, horizon, action_dim) array}")
        result = Prediction(**{f.name: result.get(f.name) for f in fields(Prediction)})
    elif not hasattr(result, "actions"):
        result = Prediction(actions=result)
    actions = np.asarray(result.actions)
    if actions.ndim != 3 or actions.shape[0] != rows or not np.issubdtype(actions.dtype, np.number):
        raise ValueError(f"the policy's predict returned actions {actions.dtype} {actions.shape} for a batch of "
                         f"{rows}; return a float array (B={rows}, horizon, action_dim)")
    if not np.isfinite(actions).all():
        raise ValueError("the policy's predict returned non-finite actions (NaN/inf); no action was sent")
    return Prediction(actions.astype(np.float32, copy=False), *(getattr(result, f) for f in ("video", "states")))


def load_policy_factory(target: str):
    """``pkg.module:factory`` -> the callable (checked: importable, callable). The module must
    be importable where the model workers run (on PYTHONPATH, or installed)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"EVALUATION.policy={target!r}: write it as pkg.module:factory, a callable factory(device)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"EVALUATION.policy={target!r}: cannot import {module_name} ({exc}); install it or put its "
                         "folder on PYTHONPATH") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"EVALUATION.policy={target!r}: {module_name} has no callable {attr!r}")
    return factory


def build_policy(target: str, device: str) -> Policy:
    """Build the policy ``target`` names on ``device`` (in a model worker), and check its shape."""
    policy = load_policy_factory(target)(device)
    horizon = getattr(policy, "action_horizon", None)
    if not callable(getattr(policy, "predict", None)) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"EVALUATION.policy={target!r} built {type(policy).__name__}, which is not a Policy: it needs "
                         "an int action_horizon >= 1 and predict(obs, noise_seeds=None) (see agents/policy.py)")
    return policy
