"""The dispatcher: the broker's one thread. It takes the actors' requests, batches them (wam_gym/batching.py:
size / wait, grouped by shape; the Pacer sets the size), hands each batch to a model worker (the supervisor's:
an idle one, or, every worker busy, the pipe of the one whose batch started first: ``MAX_HELD``), and answers
each actor from its batch's result. Between messages it lets the supervisor heal the workers, and deals with the
batches a restarted worker held: they are sent again, first in the queue.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from wam_gym.batching import Batcher, Pacer, Request
from wam_gym.broker.actors import ActorLinks
from wam_gym.broker.config import BrokerConfig
from wam_gym.broker.mailbox import Mailbox
from wam_gym.broker.stats import BrokerStats
from wam_gym.broker.supervisor import Lost, WorkerSupervisor
from wam_gym.model_worker import BatchResult

logger = logging.getLogger(__package__)  # the broker's parts log as one: "wam_gym.broker"

# The longest the dispatcher sleeps with nothing to do: how soon it sees a stop, a watchdog's turn.
IDLE_WAIT_S = 0.2


class Dispatcher:
    def __init__(self, config: BrokerConfig, supervisor: WorkerSupervisor, mailbox: Mailbox, actors: ActorLinks,
                 stats: BrokerStats, reply: Callable[[int, tuple], None]):
        self.supervisor, self.mailbox, self.actors, self.stats = supervisor, mailbox, actors, stats
        self.reply = reply  # every answer to an actor leaves through it
        self.batcher = Batcher(config.inference_batch_size, config.inference_batch_wait_ms)
        self.pacer = Pacer(config.inference_batch_size) if config.batch_pacing else None
        if self.pacer is not None:
            self.batcher.verdict = self.pacer.verdict
        self._batch_ids = itertools.count()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    # ----------------------------------------------------------------- the thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="wam-broker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.mailbox.post(("stop", None, None))
            self._thread.join(timeout=10)

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def cpu_s(self) -> float:
        """CPU seconds the thread has used."""
        if self._thread is None or self._thread.ident is None:
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))
        except (AttributeError, OSError):  # not Linux, or the thread has exited
            return float("nan")

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as exc:  # surfaced to the manager by InferenceBroker.check()
            logger.exception("broker dispatcher failed")
            self.failure = exc

    def _step(self) -> bool:
        # With every worker busy a due batch must wait for a result (a message) anyway: no spinning.
        deadline = self.batcher.next_deadline() if self.supervisor.idle else None
        timeout = IDLE_WAIT_S if deadline is None else min(IDLE_WAIT_S, max(0.0, deadline - time.monotonic()))
        for message in self.mailbox.receive(timeout):
            if not self._handle(message):
                return False
        if self.mailbox.worker_lost:  # its pipe ended: restart it now (watch checks every worker each second)
            self.mailbox.worker_lost = False
            self._resend(self.supervisor.heal())
        self._resend(self.supervisor.watch(time.monotonic()))
        self._dispatch()
        return True

    # ----------------------------------------------------------------- messages
    def _handle(self, message) -> bool:
        kind, a, b = message
        if kind == "request":
            self._request(a)
        elif kind == "result":
            self._finish(b)
        elif kind == "ready":
            waited = not self.supervisor.idle
            self.supervisor.ready(a, b)
            self._freed(waited)
        elif kind == "failed":  # the worker exits now; heal() restarts it (the error is named if it gives up)
            self.supervisor.failed(a, b)
        elif kind == "actor_gone":
            self._actor_gone(a)
        elif kind == "stop":
            return False
        return True

    def _request(self, request: Request) -> None:
        self.batcher.add(request)
        if self.pacer is not None:
            self.pacer.arrived(request.actor_id, request.arrived)
        if request.segment is not None:
            self.actors.note_slot(request.actor_id, request.segment)

    def _actor_gone(self, actor_id: int) -> None:
        self.batcher.drop_actor(actor_id)
        if self.pacer is not None:
            self.pacer.forget(actor_id)
        self.actors.remove(actor_id)

    def _freed(self, waited: bool) -> None:
        """A worker may have become idle. Paced, a partial group waiting for stragglers of its last batch
        (Pacer.holds) counts its hold from now if it ``waited`` for a worker before (none was idle)."""
        if self.pacer is not None and waited and self.supervisor.idle:
            self.batcher.free_since = time.monotonic()

    # ----------------------------------------------------------------- batches
    def _dispatch(self) -> None:
        now = time.monotonic()
        idle = self.supervisor.idle
        while idle and (batch := self.batcher.pop_ready(now)):
            self._submit(idle[0], batch, now)
        # Every worker busy: a full batch waits in the pipe of the one whose batch started first.
        while not idle and (room := self.supervisor.with_room(now)) and (batch := self.batcher.pop_full()):
            self._submit(room[0], batch, now)

    def _submit(self, worker: int, batch: list[Request], now: float) -> None:
        self.stats.add_batch([now - r.arrived for r in batch])
        self.supervisor.hand(worker, next(self._batch_ids), batch, now)

    def _finish(self, result: BatchResult) -> None:
        waited = not self.supervisor.idle
        done = self.supervisor.finished(result)
        self._freed(waited)
        if done is None:
            return  # an answer from before a restart, already dealt with
        flight, occupied = done
        self.stats.model_s.append(result.model_seconds)
        self.stats.stack_s.append(result.stack_seconds)
        share = result.model_seconds / max(1, len(result.replies))  # each request's part of the call
        for actor_id, request_id, row, error in result.replies:
            self.reply(actor_id, (request_id, row, error, share, result.denoise_steps))
        if self.pacer is not None:
            now = time.monotonic()
            self.pacer.batch_done(len(flight.requests), max(occupied, result.model_seconds))
            for actor_id, *_ in result.replies:
                self.pacer.answered(actor_id, now, result.batch_id)
            self.batcher.limit = self.pacer.target(len(self.supervisor.pool), now)
            self.batcher.hold_s = self.pacer.hold_s()

    def _resend(self, losses: list[Lost]) -> None:
        """The batches restarted workers held go back to the front of the queue, the running one first, as it was."""
        for lost in losses:
            self.stats.resent_batches += len(lost.batches)
            for flight in reversed(lost.batches):
                for request in reversed(flight.requests):
                    self.batcher.add(request, front=True)
            if lost.batches:
                logger.warning("model worker %d's %d batch(es) resent", lost.worker, len(lost.batches))
