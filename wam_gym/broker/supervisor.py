"""The worker supervisor: starts the model workers, knows which are idle and which batches each holds, and heals
them: a worker that dies is restarted; so is one that holds a batch far longer than batches take (a hung GPU or
driver: the watchdog SIGKILLs it), or one restarted that never finished loading. Each restart is reported to the
dispatcher as a :class:`Lost` (the batches the worker held), which decides what becomes of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from wam_gym.broker.batching import Request
from wam_gym.broker.config import BrokerConfig
from wam_gym.broker.errors import BrokerError, StartCancelled
from wam_gym.broker.mailbox import Mailbox
from wam_gym.broker.model_worker import BatchResult, ModelInfo
from wam_gym.broker.stats import STATS_WINDOW, BrokerStats
from wam_gym.utils.stats import percentile

logger = logging.getLogger(__package__)  # the broker's parts log as one: "wam_gym.broker"

# Batches a worker holds at most: the one it runs and one full batch waiting in its pipe. A batch is
# handles (~100 bytes a request) and its pipe is written without blocking: the dispatcher never waits.
MAX_HELD = 2
# The stall bound uses the p95 batch time once this many batches were timed; MULTIRUN.stall_floor_s before.
STALL_MIN_SAMPLES = 20
# How often the dispatcher looks for stalled workers and for restarted ones that never finished loading.
WATCH_INTERVAL_S = 1.0


@dataclass
class InFlight:
    """A batch a worker holds."""

    batch_id: int
    requests: list[Request]
    sent: float  # time.monotonic() when the worker could start it: handed over, or when the one before ended
    first: bool  # the worker's first batch since it (re)started: it may compile, so stall_first_batch_s applies


@dataclass
class Lost:
    """A worker restarted after ``why``, and the batches it held (the running one first)."""

    worker: int
    why: str
    batches: list[InFlight]


class WorkerSupervisor:
    def __init__(self, pool, config: BrokerConfig, stats: BrokerStats, mailbox: Mailbox):
        self.pool, self.config, self.stats, self.mailbox = pool, config, stats, mailbox
        self.model: ModelInfo | None = None  # what the workers said when they loaded the model (None before)
        self.models: list[ModelInfo | None] = [None] * len(pool)  # what each said when it last loaded it
        self.idle: deque[int] = deque()
        self.in_flight: dict[int, deque[InFlight]] = {}  # worker -> the batches it holds, the running one first
        self.loading: dict[int, float] = {}  # worker -> when it must have loaded its model (monotonic)
        self._restarts = [0] * len(pool)
        self._served = [0] * len(pool)  # batches handed to each worker since it (re)started
        self._last_error: dict[int, str] = {}  # worker -> the last line of the error it reported while loading
        self._next_watch = 0.0
        # How long each batch kept its worker: from hand-over (or the end of the batch before) to its result.
        self._occupied_s: deque[float] = deque(maxlen=STATS_WINDOW)
        self.overdue_s = float("inf")  # their p95, refreshed by watch() once enough are known
        self._cancel = threading.Event()  # cancel_start(): a start in progress gives up

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        """Start every worker and wait until each has loaded its model."""
        for i in range(len(self.pool)):
            self._start_worker(i)
        self._await_ready(set(range(len(self.pool))))

    def cancel_start(self) -> None:
        """From another thread: make a :meth:`start` in progress stop within a second."""
        self._cancel.set()

    def _start_worker(self, i: int) -> None:
        self.pool.start(i)
        self._served[i] = 0
        self.loading[i] = time.monotonic() + self.config.startup_timeout_s

    def _await_ready(self, waiting: set[int]) -> None:
        """Wait until every worker has loaded its model. One that dies while loading (a kill, the
        out-of-memory killer, a segfault) is restarted, up to max_worker_restarts; one whose factory
        raises stops the start at once with that error (it would raise again)."""
        while waiting:
            if self._cancel.is_set():
                raise StartCancelled("the model workers' start was cancelled")
            dead = [i for i in waiting if not self.pool.alive(i)]  # checked first: all they sent is in their pipes
            for kind, worker, payload in self.mailbox.receive(timeout=1.0):
                if kind == "failed":
                    raise BrokerError(f"model worker {worker} failed to load its model: {last_line(payload)}\n{payload}")
                if kind == "ready":
                    self.ready(worker, payload)
                    waiting.discard(worker)
            for worker in dead:
                self._restart(worker, f"died while loading its model ({self.pool.exit_cause(worker)})")
                waiting.add(worker)
            late = [i for i in waiting if time.monotonic() > self.loading[i]]
            if late:
                raise BrokerError(f"model worker(s) {late} did not load the model within MULTIRUN.startup_timeout_s="
                                  f"{self.config.startup_timeout_s:g}")

    def ready(self, worker: int, model: ModelInfo) -> None:
        """``worker`` loaded its model: it can take batches."""
        self.model = self.models[worker] = model
        if model.episode_capacity is not None:  # a model that remembers episodes
            self.stats.episode_capacity[worker] = model.episode_capacity
            logger.info("model worker %d holds at most %d episodes", worker, model.episode_capacity)
        self.loading.pop(worker, None)
        self.idle.append(worker)

    def failed(self, worker: int, error: str) -> None:
        """A restarted ``worker`` could not load its model; it exits now and is restarted (the error named if it gives up)."""
        self._last_error[worker] = last_line(error)
        logger.error("restarted model worker %d failed to load:\n%s", worker, error)

    # ----------------------------------------------------------------- batches
    def hand(self, worker: int, batch_id: int, requests: list[Request], now: float) -> None:
        """Give ``worker`` a batch (its next, if it runs one: see :meth:`with_room`)."""
        if worker in self.idle:
            self.idle.remove(worker)
        first = self._served[worker] == 0
        self.in_flight.setdefault(worker, deque()).append(InFlight(batch_id, requests, now, first))
        self._served[worker] += 1
        self.pool.submit(worker, batch_id, requests)

    def end_episodes(self, ends: dict[int, list[int]]) -> None:
        """Tell each worker to let these episodes go (worker -> episodes)."""
        for worker, episodes in ends.items():
            self.pool.end_episodes(worker, episodes)

    def with_room(self, now: float) -> list[int]:
        """The busy workers with room for one more batch, the one whose running batch started first first; not
        one whose batch has run past the p95 time a batch keeps its worker (it may be stalling: it gets nothing more)."""
        room = [(held[0].sent, w) for w, held in self.in_flight.items()
                if len(held) < MAX_HELD and now - held[0].sent <= self.overdue_s]
        return [w for _, w in sorted(room)]

    def finished(self, result: BatchResult) -> tuple[InFlight, float] | None:
        """The batch ``result`` answers, and how long it kept its worker (0 if it was not running: a Ray result may
        overtake the one before it); None for an answer from before a restart (its batch was dealt with then)."""
        held = self.in_flight.get(result.worker_id, ())
        flight = next((f for f in held if f.batch_id == result.batch_id), None)
        if flight is None:
            return None
        running = flight is held[0]
        now = time.monotonic()
        occupied = now - flight.sent if running else 0.0
        if running:
            self._occupied_s.append(occupied)
        held.remove(flight)
        if held:
            if running:
                held[0].sent = now  # the waiting batch runs now: the stall watchdog times it from here
        else:
            del self.in_flight[result.worker_id]
            self.idle.append(result.worker_id)
        return flight, occupied

    # ----------------------------------------------------------------- healing
    def heal(self) -> list[Lost]:
        """Restart dead workers."""
        return [self._restart(worker, f"died ({self.pool.exit_cause(worker)})")
                for worker in range(len(self.pool)) if not self.pool.alive(worker)]

    def watch(self, now: float) -> list[Lost]:
        """Once a second: restart dead workers; kill and restart workers that hold a batch far
        longer than batches take (a hung GPU or driver answers never, and would freeze every actor
        waiting on it), or that were restarted and never finished loading."""
        if now < self._next_watch:
            return []
        self._next_watch = now + WATCH_INTERVAL_S
        if len(self._occupied_s) >= STALL_MIN_SAMPLES:  # timed as with_room times a running batch
            self.overdue_s = percentile(self._occupied_s, 95)
        lost = self.heal()
        for worker, held in list(self.in_flight.items()):
            flight = held[0]
            limit = self._stall_limit(flight.first)
            if now - flight.sent > limit:
                self.stats.stalled_workers += 1
                self.pool.kill(worker)
                lost.append(self._restart(worker, f"stalled: held batch {flight.batch_id} for {now - flight.sent:.1f} s "
                                                  f"(limit {limit:.1f} s, MULTIRUN.stall_*); killed it"))
        for worker, deadline in list(self.loading.items()):
            if now > deadline:
                self.pool.kill(worker)
                lost.append(self._restart(worker, f"did not load its model within MULTIRUN.startup_timeout_s="
                                                  f"{self.config.startup_timeout_s:g}; killed it"))
        return lost

    def _stall_limit(self, first: bool) -> float:
        """How long a batch may take: a worker's first one may compile; later ones get stall_factor
        x the p95 time a batch keeps its worker, never less than the floor (the floor alone until a p95 means something)."""
        c = self.config
        if first:
            return max(c.stall_floor_s, c.stall_first_batch_s)
        if self.overdue_s == float("inf"):  # fewer than STALL_MIN_SAMPLES batches timed so far (see watch)
            return c.stall_floor_s
        return max(c.stall_floor_s, c.stall_factor * self.overdue_s)

    def _restart(self, worker: int, why: str) -> Lost:
        """Start ``worker`` afresh after ``why``; the batches it held are returned, for the dispatcher to deal with."""
        if self._restarts[worker] >= self.config.max_worker_restarts:
            last = f"; its last error: {self._last_error[worker]}" if worker in self._last_error else ""
            raise BrokerError(f"model worker {worker} {why}{last}. It was restarted {self._restarts[worker]} time(s) "
                              f"already (MULTIRUN.max_worker_restarts={self.config.max_worker_restarts}): giving up")
        self._restarts[worker] += 1
        self.stats.worker_restarts += 1
        if worker in self.idle:
            self.idle.remove(worker)
        lost = Lost(worker, why, list(self.in_flight.pop(worker, ())))
        logger.warning("model worker %d %s; restarting it (restart %d of %d)", worker, why, self._restarts[worker],
                       self.config.max_worker_restarts)
        self._start_worker(worker)
        return lost


def last_line(error: str) -> str:
    """The exception line of a formatted traceback (it comes last)."""
    lines = error.strip().splitlines()
    return lines[-1] if lines else "(no message)"
