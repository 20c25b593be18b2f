"""A model worker: one model copy on one device, serving batches of requests.

The same ``ModelServer`` runs inside a local process (``serve_forever``: batches in on a pipe,
results out on the worker's own pipe) and inside a Ray actor (see wam_gym/ray_backend.py).
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agents.policy import as_prediction
from envs.protocol import stack_rows
from wam_gym.batching import Request
from wam_gym.shared_obs import AttachedSegments

# Builds the policy inside the worker, given its device ("cpu", "cuda:1"): a checkpoint
# load, or any callable multiprocess/Ray can pickle (dill: closures and lambdas work).
PolicyFactory = Callable[[str], Any]

# How often an idle worker checks that the broker's process still exists.
ORPHAN_CHECK_S = 2.0


def encode(message) -> bytes:
    """A message between the broker's own processes, pickled by the C pickler: a multiprocess
    pipe's own ``send`` pickles with dill, in pure Python (4 ms for a batch's 16 answers, against
    0.1 ms)."""
    return pickle.dumps(message, pickle.HIGHEST_PROTOCOL)


def decode(data: bytes):
    """What ``encode`` wrote. The only unpickling in the source (tests/test_security.py allows it
    here alone): the bytes come down anonymous pipes and queues from this process tree's own
    processes, the same bytes multiprocess's ``recv`` and ``Queue.get`` unpickle anyway; nothing
    read from a file or a socket ever reaches it."""
    return pickle.loads(data)


def send(connection, message) -> None:
    """One message on one of the broker's pipes."""
    connection.send_bytes(encode(message))


def receive(connection):
    """The next message ``send`` wrote on ``connection``."""
    return decode(connection.recv_bytes())


@dataclass
class BatchResult:
    """What a worker sends back for one batch."""

    batch_id: int
    worker_id: int
    # (actor, request, that request's row of the Prediction or None, its error or None): a request
    # that fails (bad input, NaN output) fails alone; the rest of its batch is answered.
    replies: list[tuple[int, int, Any, str | None]]
    model_seconds: float
    denoise_steps: int | None = None  # per request: the policy's num_inference_steps, when it has one


class ModelServer:
    """Runs batches on one model copy. With ``batch_invariant`` each request runs alone (a batch of
    one): batched matmuls sum in an order that depends on the batch size, so a row's floats differ
    in the last bits with what it was batched with; alone, they never do.

    A batch served by one call has its large arrays stacked into memory the next batch reuses: a
    policy reads them during ``predict`` and must not keep them (its answer is sent before the
    next batch). Requests run alone (batch_invariant, or after a failed call) get memory of their
    own, so an answer that views its input stays intact until the whole batch is answered."""

    def __init__(self, factory: PolicyFactory, device: str, worker_id: int, threads: int | None = None,
                 batch_invariant: bool = False):
        if threads is None and device == "cpu":
            # CPU workers share the cores with env actors; OpenMP threads that spin-wait for
            # each other then stall (a call took 8x longer with torch's 2 threads than with 1).
            threads = 1
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.worker_id = worker_id
        self.device = device
        self.batch_invariant = batch_invariant
        self.policy = factory(device)
        self.segments = AttachedSegments()  # the actors' observation slots
        self._batch_memory: dict = {}  # stack_rows's reused memory for whole batches

    @property
    def action_horizon(self) -> int:
        return self.policy.action_horizon

    def run(self, batch_id: int, requests: Sequence[Request]) -> BatchResult:
        start = time.perf_counter()
        groups = [[r] for r in requests] if self.batch_invariant else [list(requests)]
        reuse = self._batch_memory if len(groups) == 1 else None
        replies = [reply for group in groups for reply in self._answer(group, reuse)]
        return BatchResult(batch_id, self.worker_id, replies, time.perf_counter() - start,
                           getattr(self.policy, "num_inference_steps", None))

    def _answer(self, requests: list[Request], reuse: dict | None = None) -> list[tuple[int, int, Any, str | None]]:
        """One model call on ``requests``. If it raises, each request runs alone, so one client's bad
        observation (a missing camera, a wrong state size) fails only that client's request."""
        try:
            return [(r.actor_id, r.request_id, row, None) for r, row in zip(requests, self._predict(requests, reuse))]
        except Exception as exc:  # reported to the requester, who raises it; the worker lives on
            if len(requests) > 1:
                return [reply for r in requests for reply in self._answer([r])]
            return [(requests[0].actor_id, requests[0].request_id, None, f"{type(exc).__name__}: {exc}")]

    def _predict(self, requests: Sequence[Request], reuse: dict | None) -> list[Any]:
        """One model call on ``requests``: each request's row of the Prediction."""
        obs = stack_rows([self.segments.resolve(r.obs) for r in requests], reuse)  # copies out of the slots
        seeds = [r.noise_seed for r in requests]
        prediction = as_prediction(self.policy.predict(obs, noise_seeds=None if None in seeds else seeds), len(requests))
        return [prediction.row(i) for i in range(len(requests))]


def serve_forever(factory: PolicyFactory, device: str, worker_id: int, threads: int | None, inbox, outbox,
                  batch_invariant: bool = False) -> None:
    """Process entry point: build the model, announce it, serve batches from ``inbox`` (a pipe)
    until ``None``.

    ``outbox`` is this worker's own pipe to the broker, so a SIGKILL here can cut short only
    its own message. The worker also stops when the broker's process is gone (killed, so it
    never sent ``None``): an orphaned model copy would hold its GPU memory forever.
    """
    broker = os.getppid()
    try:
        server = ModelServer(factory, device, worker_id, threads, batch_invariant)
    except Exception:
        send(outbox, ("failed", worker_id, traceback.format_exc()))
        return
    try:
        send(outbox, ("ready", worker_id, server.action_horizon))
        while (message := _next_batch(inbox, broker)) is not None:
            batch_id, requests = message
            send(outbox, ("result", worker_id, server.run(batch_id, requests)))
    except (BrokenPipeError, EOFError):  # the broker closed its end: it is gone
        return


def _next_batch(inbox, broker: int):
    """The next ``(batch_id, requests)``; ``None`` when told to stop or orphaned."""
    while not inbox.poll(ORPHAN_CHECK_S):
        if os.getppid() != broker:
            return None
    return receive(inbox)
