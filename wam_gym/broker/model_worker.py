"""A model worker: one model copy on one device, serving batches of requests.

The same ``ModelServer`` runs inside a local process (``serve_forever``: batches in on a pipe,
results out on the worker's own pipe) and inside a Ray actor (see wam_gym/broker/ray_pool.py).
A worker's inbox carries, in order: batches ``(batch_id, requests)``, :class:`EndEpisodes` (a model that
remembers episodes lets them go) and ``None`` (stop).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from multiprocess.connection import wait

from agents.policy import EpisodicPolicy, as_prediction, denoise_steps
from envs.protocol import stack_rows
from wam_gym.broker.batching import Request
from wam_gym.broker.shared_obs import AttachedSegments

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
class ModelInfo:
    """What a worker says once its model is loaded."""

    action_horizon: int
    remembers_episodes: bool  # an agents.policy.EpisodicPolicy: each episode must stay on the worker holding it
    # How many episodes it holds at once (EpisodicPolicy.episode_capacity): the broker places no more on this
    # worker, and new episodes wait past it. None: a stateless policy.
    episode_capacity: int | None = None

    @staticmethod
    def of(policy) -> ModelInfo:
        """What ``policy`` says of itself, checked: an EpisodicPolicy must say how many episodes it holds."""
        if not isinstance(policy, EpisodicPolicy):
            return ModelInfo(policy.action_horizon, False)
        try:
            capacity = policy.episode_capacity
        except AttributeError:
            capacity = None
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"{type(policy).__name__} is an EpisodicPolicy but its episode_capacity is {capacity!r}: "
                             "set it to how many episodes it holds at once, an int >= 1 (agents/policy.py)")
        return ModelInfo(policy.action_horizon, True, capacity)


@dataclass
class EndEpisodes:
    """An inbox message: the model lets these episodes' state go (their actors moved on). It comes in order with
    the batches, so it never overtakes a batch sent before it."""

    episodes: list[int]


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
    stack_seconds: float = 0.0  # stacking its observations out of the actors' slots (Batch.stack_seconds)


@dataclass
class Batch:
    """A batch taken from the broker, its observations stacked and ready for one model call."""

    batch_id: int
    requests: Sequence[Request]
    obs: dict[str, Any] | None  # None: its requests run alone (batch_invariant, or one that does not stack)
    # How long stacking took: a copy the model waits for, unless BatchFeed stacked it while the call before ran
    stack_seconds: float = 0.0


class ModelServer:
    """Runs batches on one model copy. With ``batch_invariant`` each request runs alone (a batch of
    one): batched matmuls sum in an order that depends on the batch size, so a row's floats differ
    in the last bits with what it was batched with; alone, they never do.

    A batch served by one call has its large arrays stacked into memory that the batch after next
    reuses (two batches may be stacked at once: the one running and the next, see BatchFeed): a
    policy reads them during ``predict`` and must not keep them (its answer is sent before then).
    Requests run alone (batch_invariant, or after a failed call) get memory of their own, so an
    answer that views its input stays intact until the whole batch is answered."""

    def __init__(self, factory: PolicyFactory, device: str, worker_id: int, threads: int | None = None,
                 batch_invariant: bool = False):
        if threads is None and device == "cpu":
            # CPU workers share the cores with env actors; OpenMP threads that spin-wait for
            # each other then stall (a call took 8x longer with torch's 2 threads than with 1).
            threads = 1
        if threads:
            limit_threads(threads)
        self.worker_id = worker_id
        self.device = device
        self.batch_invariant = batch_invariant
        self.policy = factory(device)
        self.info = ModelInfo.of(self.policy)  # checked here: a policy that cannot say it fails to load, in one line
        self.segments = AttachedSegments()  # the actors' observation slots
        self._stacking = threading.Lock()  # the segments: BatchFeed's thread stacks while a batch runs
        self._batch_memory: list[dict] = [{}, {}]  # stack_rows's reused memory, for alternate batches

    def end_episodes(self, episodes: Sequence[int]) -> None:
        """Let the episodes' state go (the broker sends these only to a model that remembers episodes)."""
        if isinstance(self.policy, EpisodicPolicy):
            for episode in episodes:
                self.policy.end_episode(episode)

    def run(self, batch_id: int, requests: Sequence[Request]) -> BatchResult:
        return self.run_batch(self.take(batch_id, requests))

    def take(self, batch_id: int, requests: Sequence[Request]) -> Batch:
        """``requests`` stacked out of the actors' slots, into the memory the last batch taken did not use."""
        if self.batch_invariant:
            return Batch(batch_id, requests, None)
        self._batch_memory.reverse()
        start = time.perf_counter()
        try:
            obs = self._stack(requests, self._batch_memory[0])
        except Exception:  # a request that does not stack with the others: each runs alone and fails alone
            obs = None
        return Batch(batch_id, requests, obs, time.perf_counter() - start)

    def run_batch(self, batch: Batch) -> BatchResult:
        start = time.perf_counter()
        if batch.obs is None:
            replies = [reply for r in batch.requests for reply in self._answer([r])]
        else:
            replies = self._answer(batch.requests, batch.obs)
        return BatchResult(batch.batch_id, self.worker_id, replies, time.perf_counter() - start,
                           denoise_steps(self.policy), batch.stack_seconds)

    def _stack(self, requests: Sequence[Request], reuse: dict | None) -> dict[str, Any]:
        with self._stacking:
            return stack_rows([self.segments.resolve(r.obs) for r in requests], reuse)  # copies out of the slots

    def _answer(self, requests: Sequence[Request], obs: dict | None = None) -> list[tuple[int, int, Any, str | None]]:
        """One model call on ``requests`` (stacked as ``obs``, or here). If it raises, each request runs
        alone, so one client's bad observation (a missing camera, a wrong state size) fails only that
        client's request."""
        try:
            rows = self._predict(requests, self._stack(requests, None) if obs is None else obs)
            return [(r.actor_id, r.request_id, row, None) for r, row in zip(requests, rows)]
        except Exception as exc:  # reported to the requester, who raises it; the worker lives on
            if len(requests) > 1:
                return [reply for r in requests for reply in self._answer([r])]
            return [(requests[0].actor_id, requests[0].request_id, None, f"{type(exc).__name__}: {exc}")]

    def _predict(self, requests: Sequence[Request], obs: dict[str, Any]) -> list[Any]:
        """One model call on ``requests``: each request's row of the Prediction."""
        seeds = [r.noise_seed for r in requests]
        prediction = as_prediction(self.policy.predict(obs, noise_seeds=None if None in seeds else seeds), len(requests))
        return [prediction.row(i) for i in range(len(requests))]


def limit_threads(threads: int) -> None:
    """torch's threads in this process. A torch not imported yet reads them from OMP_NUM_THREADS when the policy
    imports it: a worker of a policy without torch (a numpy one) starts without its seconds of import."""
    torch = sys.modules.get("torch")
    if torch is None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    else:
        torch.set_num_threads(threads)


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
        send(outbox, ("ready", worker_id, server.info))
        batches = BatchFeed(server, inbox, broker)
        while (batch := batches.next()) is not None:
            if isinstance(batch, EndEpisodes):
                server.end_episodes(batch.episodes)
            else:
                send(outbox, ("result", worker_id, server.run_batch(batch)))
    except BrokenPipeError:  # the broker closed its end: it is gone
        return


class BatchFeed:
    """A worker's batches from its inbox, stacked. While the model runs one, a thread of its own takes
    and stacks the next as soon as the broker sends it (a worker holds up to broker.MAX_HELD), so
    under full load one call follows the other at once. Stacked after the call before it, 64
    requests of two 256x256 images left an H200 idle about 12 ms between 49 ms calls; the stand-in
    model at that call time went from 0.66-0.77 to 0.92-0.96 of the bound (the broker investigation:
    BENCHMARKS.md's git history).

    Whoever reads the inbox holds the lock: ``next`` when nothing was read ahead, the thread
    otherwise. The thread reads ahead only while the broker sends batches ahead (the batch running
    was read ahead, or waited in the pipe): a worker that waits for its batches reads each itself,
    and the thread sleeps, so no batch is handed from one thread to the other, nor wakes both (at
    the issue's timing with 64 actors on 2 workers, either cost about 0.01 of the bound). One
    BatchFeed per worker process: its thread lives as long as the process."""

    def __init__(self, server: ModelServer, inbox, broker: int):
        self.server, self.inbox, self.broker = server, inbox, broker
        self._lock = threading.Condition()  # notified when the batch read ahead is taken
        self._ahead: Batch | EndEpisodes | None = None  # read while the batch before it ran
        self._reading_ahead = False  # the thread may read the next batch while this one runs
        self._ended = False  # told to stop, the broker's pipe closed, or the broker gone: no more batches
        # ``next`` writes a byte here when it stops reading ahead: the thread, waiting on the inbox since the
        # batch before, goes back to sleep now, and does not wake with the next batch as well.
        self._stopped, self._stop = os.pipe()
        threading.Thread(target=self._read_ahead, name="wam-read-ahead", daemon=True).start()

    def next(self) -> Batch | EndEpisodes | None:
        """The next batch (or episodes to let go, in their turn); ``None`` when told to stop or the broker is gone."""
        with self._lock:
            batch, self._ahead = self._ahead, None
            was_reading_ahead, self._reading_ahead = self._reading_ahead, batch is not None or self.inbox.poll(0)
            if was_reading_ahead and not self._reading_ahead:
                os.write(self._stop, b"\0")
            if batch is None and not self._ended:
                batch = self._take(self._next_batch())
            if self._reading_ahead:
                self._lock.notify()
            return batch

    def _take(self, message) -> Batch | EndEpisodes | None:
        """``message``'s batch, stacked; ``None``, and the feed ended, when it is the end."""
        self._ended = message is None
        if self._ended or isinstance(message, EndEpisodes):
            return message
        return self.server.take(*message)

    def _next_batch(self):
        """The next ``(batch_id, requests)``, waiting for it; ``None`` when told to stop or orphaned."""
        while not self.inbox.poll(ORPHAN_CHECK_S):
            if os.getppid() != self.broker:
                return None
        return self._receive()

    def _receive(self):
        """The next message; ``None`` (the end) when the broker's pipe is closed."""
        try:
            return receive(self.inbox)
        except (EOFError, OSError):
            return None

    def _may_read_ahead(self) -> bool:
        return self._reading_ahead and self._ahead is None and not self._ended

    def _read_ahead(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(self._may_read_ahead)
            ready = wait([self.inbox, self._stopped], ORPHAN_CHECK_S)  # unlocked: ``next`` may read meanwhile
            if self._stopped in ready:
                os.read(self._stopped, 64)
            if self.inbox not in ready:
                continue
            with self._lock:
                if self._may_read_ahead() and self.inbox.poll(0):  # ``next`` did not take it
                    self._ahead = self._take(self._receive())

