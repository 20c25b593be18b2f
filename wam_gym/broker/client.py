"""An actor's end of the broker: its request pipe, its reply pipe and its shared-memory slot."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

from agents.policy import ModelCost, Prediction
from agents.predictor import Predictor
from envs.protocol import batch_size, take_row
from wam_gym.broker.batching import Request
from wam_gym.broker.errors import BrokerError, EpisodeLost, RemoteInferenceError
from wam_gym.broker.model_worker import decode, send
from wam_gym.broker.shared_obs import ObservationSlot

# A client waiting for an answer wakes this often: to call its on_wait hook and to see if its manager died.
CLIENT_WAIT_SLICE_S = 1.0


class BrokerClient(Predictor):
    """An actor's handle on the broker; a :class:`~agents.predictor.Predictor` for the chunk-queue agent.

    Holds the actor's own request pipe and reply pipe; pass it to the process that uses it
    as a ``Process`` argument, then call :meth:`close` in the parent (the broker then sees
    EOF, not a half message, if that process is killed while sending). Noise seeds derive
    from the episode seed and the call count, so an episode's noise does not depend on which
    requests its calls were batched with (its actions do only in the last float bits, unless
    ``batch_invariant`` is set).
    """

    def __init__(self, actor_id: int, requests, replies, action_horizon: int):
        self.actor_id, self.requests, self.replies, self.action_horizon = actor_id, requests, replies, action_horizon
        self._ids = itertools.count()
        self.cost = ModelCost()  # this episode's model time and denoising steps, from the workers' answers
        self.slot = ObservationSlot()  # created in the process that predicts, at its first call
        # Called about once a second while waiting for an answer: a rollout actor reports that it is
        # alive, only waiting (the eval manager's stall watchdog must not kill it for a slow model).
        self.on_wait: Callable[[], None] | None = None

    def __str__(self) -> str:
        return "the model (served by the broker's workers)"

    def close(self) -> None:
        """Drop this process's copy of the pipes (after handing the client to another, or when done)."""
        self.requests.close()
        self.replies.close()

    def release_episode(self, episode: int) -> None:
        """The broker lets episode ``episode`` go on the worker holding it (its env was reset)."""
        try:
            send(self.requests, ("release", self.actor_id, int(episode)))
        except (BrokenPipeError, OSError):  # the broker is gone, and its workers with the episode
            pass

    def predict(self, obs, noise_seeds=None) -> Prediction:
        n = batch_size(obs)
        answers = self._ask([take_row(obs, row) for row in range(n)], noise_seeds)
        return Prediction.stack(answers)

    def predict_row(self, obs, noise_seed=None) -> Prediction:
        """One env's observation as one request: no batch to wrap it in and split again."""
        return self._ask([obs], None if noise_seed is None else [noise_seed])[0]

    def _ask(self, rows: list, noise_seeds) -> list:
        """One model call's rows, each a request the broker may batch with others; their answers in order."""
        noise_seeds = self.call_seeds(len(rows), noise_seeds)
        ids = []
        for row, shared in enumerate(self.slot.share(rows)):
            rid = next(self._ids)
            ids.append(rid)
            request = Request(self.actor_id, rid, shared, noise_seeds[row], time.monotonic(), self.slot.name)
            try:
                send(self.requests, ("request", request, None))
            except (BrokenPipeError, OSError):
                raise BrokerError("the inference broker has shut down; this actor stops") from None
        answers = self._collect(set(ids))
        return [answers[r] for r in ids]

    def _collect(self, pending: set[int]) -> dict[int, Any]:
        answers = {}
        parent = os.getppid()
        while pending:
            if not self.replies.poll(CLIENT_WAIT_SLICE_S):
                if self.on_wait is not None:
                    self.on_wait()
                if os.getppid() != parent:  # the manager (and its broker) is gone
                    raise BrokerError("the evaluation manager exited; this actor stops") from None
                continue
            try:
                rid, row, error, model_s, denoise_steps, lost = decode(self.replies.recv_bytes())
            except (EOFError, OSError):
                raise BrokerError("the inference broker has shut down; this actor stops") from None
            if rid not in pending:
                continue  # a late answer to a call abandoned after an error
            if error is not None:
                raise (EpisodeLost if lost else RemoteInferenceError)(error)
            answers[rid] = row
            pending.discard(rid)
            self.cost.add(model_s, denoise_steps)
        return answers
