"""The dispatcher: the broker's one thread. It takes the actors' requests, routes and batches them
(wam_gym/broker/batching.py: size / wait, grouped by shape and route; the Pacer sets the size), hands each batch to a
model worker (the supervisor's: an idle one, or, every worker busy, the pipe of the one whose batch started
first: ``MAX_HELD``), and answers each actor from its batch's result.

Routing: a request of a stateless model goes to any worker. With a model that remembers episodes, a request
carrying an episode id goes to the worker that holds its episode, and its batch is formed of that worker's
requests only; a new episode's first request is placed by the session registry (wam_gym/broker/sessions.py) on a
worker with room for it (its model's episode capacity), or waits there until an episode ends and makes room.

Between messages it lets the supervisor heal the workers, and deals with what a restarted worker held: its
stateless batches are sent again, first in the queue; its episodes are lost, and their requests, held or
queued, are answered with EpisodeLost.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from wam_gym.broker.actors import ActorLinks
from wam_gym.broker.batching import Batcher, Pacer, Request
from wam_gym.broker.config import BrokerConfig
from wam_gym.broker.errors import EpisodeLost, RemoteInferenceError
from wam_gym.broker.mailbox import Mailbox
from wam_gym.broker.model_worker import BatchResult
from wam_gym.broker.sessions import SessionRegistry, episode_of, lost_error
from wam_gym.broker.stats import BrokerStats
from wam_gym.broker.supervisor import Lost, WorkerSupervisor

logger = logging.getLogger(__package__)  # the broker's parts log as one: "wam_gym.broker"

# The longest the dispatcher sleeps with nothing to do: how soon it sees a stop, a watchdog's turn.
IDLE_WAIT_S = 0.2


class Dispatcher:
    def __init__(self, config: BrokerConfig, supervisor: WorkerSupervisor, sessions: SessionRegistry, mailbox: Mailbox,
                 actors: ActorLinks, stats: BrokerStats, reply: Callable[[int, tuple], None]):
        self.supervisor, self.sessions, self.mailbox, self.actors, self.stats = supervisor, sessions, mailbox, actors, stats
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
        idle = self.supervisor.idle
        deadline = self.batcher.next_deadline(idle) if idle else None
        timeout = IDLE_WAIT_S if deadline is None else min(IDLE_WAIT_S, max(0.0, deadline - time.monotonic()))
        for message in self.mailbox.receive(timeout):
            if not self._handle(message):
                return False
        if self.mailbox.worker_lost:  # its pipe ended: restart it now (watch checks every worker each second)
            self.mailbox.worker_lost = False
            self._recover(self.supervisor.heal())
        self._recover(self.supervisor.watch(time.monotonic()))
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
            self.worker_ready(a)
            self._freed(waited)
        elif kind == "failed":  # the worker exits now; heal() restarts it (the error is named if it gives up)
            self.supervisor.failed(a, b)
        elif kind == "release":  # actor a's env was reset: its episode b is over
            self._ended(self.sessions.release(a, b))
        elif kind == "actor_gone":
            self._actor_gone(a)
        elif kind == "stop":
            return False
        return True

    def _request(self, request: Request) -> None:
        if self.pacer is not None:
            self.pacer.arrived(request.actor_id, request.arrived)
        if request.segment is not None:
            self.actors.note_slot(request.actor_id, request.segment)
        if self.supervisor.model.remembers_episodes:
            try:
                episode = episode_of(request.obs)
                if episode is not None:
                    request.worker = self.sessions.route(request, episode)
                    if request.worker is None:  # no worker has room for a new episode: it waits for one to end
                        self.stats.waited_episodes += 1
                        return
            except RemoteInferenceError as exc:  # its episode lost, another client's, or a malformed id: it fails alone
                self._refuse(request, exc)
                return
        self.batcher.add(request)

    def _refuse(self, request: Request, error: RemoteInferenceError) -> None:
        """Answer ``request`` with ``error`` here, no worker asked (the reply says whether its episode was lost)."""
        self.reply(request.actor_id, (request.request_id, None, str(error), 0.0, None, isinstance(error, EpisodeLost)))

    def _actor_gone(self, actor_id: int) -> None:
        self.batcher.drop_actor(actor_id)
        if self.pacer is not None:
            self.pacer.forget(actor_id)
        self.actors.remove(actor_id)
        self._ended(self.sessions.forget_actor(actor_id))

    def worker_ready(self, worker: int) -> None:
        """``worker`` loaded its model (at the start, or restarted): the episodes it holds at most, as it says now."""
        self.sessions.set_capacity(worker, self.supervisor.models[worker].episode_capacity)
        self._ended({})

    def _ended(self, ends: dict[int, list[int]]) -> None:
        """Episodes ended (worker -> its episodes; or room appeared otherwise): their workers let them go, and first
        calls waiting for room take it, in arrival order."""
        self.supervisor.end_episodes(ends)
        now = time.monotonic()
        for request, worker in self.sessions.admit():
            request.worker = worker
            self.stats.admission_wait_s_max = max(self.stats.admission_wait_s_max, now - request.arrived)
            self.batcher.add(request)

    def _freed(self, waited: bool) -> None:
        """A worker may have become idle. Paced, a partial group waiting for stragglers of its last batch
        (Pacer.holds) counts its hold from now if it ``waited`` for a worker before (none was idle)."""
        if self.pacer is not None and waited and self.supervisor.idle:
            self.batcher.free_since = time.monotonic()

    # ----------------------------------------------------------------- batches
    def _dispatch(self) -> None:
        now = time.monotonic()
        for worker in list(self.supervisor.idle):
            if batch := self.batcher.pop_ready(now, worker):
                self._submit(worker, batch, now)
        # A busy worker: a full batch waits in the pipe of the one whose batch started first (that worker's own
        # or one any worker may take: with a worker idle, the latter went to it above).
        for worker in self.supervisor.with_room(now):
            if batch := self.batcher.pop_full(worker):
                self._submit(worker, batch, now)

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
            self.reply(actor_id, (request_id, row, error, share, result.denoise_steps, False))
        if self.pacer is not None:
            now = time.monotonic()
            self.pacer.batch_done(len(flight.requests), max(occupied, result.model_seconds))
            for actor_id, *_ in result.replies:
                self.pacer.answered(actor_id, now, result.batch_id)
            self.batcher.limit = self.pacer.target(len(self.supervisor.pool), now)
            self.batcher.hold_s = self.pacer.hold_s()

    def _recover(self, losses: list[Lost]) -> None:
        """What restarted workers held: the stateless batches go back to the front of the queue (the running one
        first, as it was); the episodes are lost, and their requests, held or still queued, answered so."""
        for lost in losses:
            episodes = self.sessions.lose_worker(lost.worker, lost.why)
            doomed = self.batcher.take_routed(lost.worker)
            resent = 0
            for flight in reversed(lost.batches):
                again = [r for r in flight.requests if r.worker is None]
                doomed += [r for r in flight.requests if r.worker is not None]
                for request in reversed(again):
                    self.batcher.add(request, front=True)
                resent += bool(again)
            for request in doomed:
                self._refuse(request, lost_error(episode_of(request.obs), lost.worker, lost.why))
            self._ended({})  # first calls waiting take the room the lost episodes left (after the doomed were taken)
            self.stats.resent_batches += resent
            self.stats.lost_episodes += len(episodes)
            if resent or episodes:
                logger.warning("model worker %d: %d batch(es) resent, %d episode(s) lost (their next calls fail: "
                               "restart them)", lost.worker, resent, len(episodes))
