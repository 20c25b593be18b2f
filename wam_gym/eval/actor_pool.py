"""Rollout actors as local processes, each fed one job at a time by the run loop (wam_gym/eval/run_loop.py).

Every actor has its own job pipe and result pipe (no queue shared between actors): a SIGKILL can
cut short only the dead actor's own message, and never leaves a lock held that the other actors
need (a shared multiprocess Queue can: its write lock stays taken forever when the writer dies
inside ``put``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import multiprocess.connection

from wam_gym.broker import InferenceBroker
from wam_gym.eval.actor import ActorSpec, actor_main
from wam_gym.eval.tasks import Job

logger = logging.getLogger(__name__)


@dataclass
class _ActorHandle:
    process: Any
    jobs: Any  # the manager's sending end of the actor's job pipe
    results: Any  # the manager's receiving end of the actor's result pipe
    job: Job | None = None
    closed: bool = False  # the result pipe reached EOF: the actor has exited
    last_seen: float = 0.0  # time.monotonic() of its last message or job: the stall watchdog's clock

    def close(self) -> None:
        self.jobs.close()
        self.results.close()


class ActorPool:
    """Rollout actor processes, each fed one job at a time (see the module doc).

    An actor that holds a job and sends nothing (no record, no heartbeat) for ``stall_s`` is
    SIGKILLed (a hung simulator or GL driver would freeze the run); :meth:`reap` then hands its
    job back like any dead actor's, to be retried.
    """

    def __init__(self, ctx, spec: ActorSpec, broker: InferenceBroker | None, stall_s: float | None = None):
        self.ctx, self.spec, self.broker, self.stall_s = ctx, spec, broker, stall_s
        self.actors: dict[int, _ActorHandle] = {}
        self._ids = itertools.count()
        self.stalled = 0  # actors killed for making no progress

    def spawn(self) -> int:
        actor_id = next(self._ids)
        client = self.broker.client(actor_id) if self.broker else None
        job_reader, job_writer = self.ctx.Pipe(duplex=False)
        result_reader, result_writer = self.ctx.Pipe(duplex=False)
        process = self.ctx.Process(
            target=actor_main, name=f"wam-actor-{actor_id}", daemon=True,
            args=(actor_id, self.spec, job_reader, result_writer, client),
        )
        process.start()
        # The actor holds these ends now; closing ours makes each side see EOF when the other dies.
        job_reader.close()
        result_writer.close()
        if client is not None:
            client.close()
        self.actors[actor_id] = _ActorHandle(process, job_writer, result_reader)
        return actor_id

    def idle(self) -> list[int]:
        return [i for i, a in self.actors.items() if a.job is None]

    def busy(self) -> bool:
        return any(a.job is not None for a in self.actors.values())

    def assign(self, actor_id: int, job: Job) -> None:
        handle = self.actors[actor_id]
        handle.job, handle.last_seen = job, time.monotonic()
        try:
            handle.jobs.send(job)
        except OSError:  # the actor just died; reap() hands its job back
            pass

    def release(self, actor_id: int) -> Job | None:
        handle = self.actors.get(actor_id)
        job, handle.job = (handle.job, None) if handle else (None, None)
        return job

    def poll(self, timeout: float) -> list[tuple[str, int, Any]]:
        """Messages ``(kind, actor_id, payload)`` from the actors; waits up to ``timeout`` for the
        first one (or for an actor to die)."""
        handles = [h for h in self.actors.values() if not h.closed]
        sentinels = [h.process.sentinel for h in self.actors.values() if h.process.is_alive()]
        ready = set(multiprocess.connection.wait([h.results for h in handles] + sentinels, timeout))
        return [m for actor_id, h in list(self.actors.items()) if h.results in ready for m in self._drain(actor_id)]

    def _drain(self, actor_id: int) -> list[tuple[str, int, Any]]:
        handle, messages = self.actors[actor_id], []
        if handle.closed:
            return messages
        try:
            while handle.results.poll():
                messages.append(handle.results.recv())
                handle.last_seen = time.monotonic()
        except (EOFError, OSError):  # the actor exited; a message a SIGKILL cut short is dropped
            handle.closed = True
        return [m for m in messages if m[0] != "alive"]  # heartbeats only move last_seen

    def _kill_stalled(self) -> None:
        now = time.monotonic()
        for actor_id, handle in self.actors.items():
            if self.stall_s and handle.job is not None and now - handle.last_seen > self.stall_s:
                logger.warning("actor %d made no progress in %s trial %d for %.0f s (EVALUATION.actor_stall_s=%g); "
                               "killing it, the episode will be retried", actor_id, handle.job.task.name,
                               handle.job.trial, now - handle.last_seen, self.stall_s)
                handle.process.kill()  # SIGKILL: a stopped or hung process dies of it too
                handle.process.join(timeout=10)
                self.stalled += 1

    def reap(self) -> tuple[list[Job | None], list[tuple[str, int, Any]]]:
        """Remove dead actors (stalled ones killed first): the jobs they held, and what they sent before dying."""
        self._kill_stalled()
        lost, late = [], []
        for actor_id, handle in list(self.actors.items()):
            if not handle.process.is_alive():
                late += self._drain(actor_id)
                handle.close()
                del self.actors[actor_id]
                if self.broker:
                    self.broker.forget_actor(actor_id)
                logger.warning("actor %d died (exit code %s)", actor_id, handle.process.exitcode)
                lost.append(handle.job)
        return lost, late

    def pids(self) -> dict[int, int]:
        return {i: a.process.pid for i, a in self.actors.items()}

    def stop(self, grace_s: float) -> list[tuple[str, int, Any]]:
        """Ask every actor to exit after its current episode; return what they sent meanwhile.
        Actors still running after ``grace_s`` are killed."""
        for handle in self.actors.values():
            with contextlib.suppress(OSError):
                handle.jobs.send(None)
        deadline = time.monotonic() + grace_s
        messages = []
        while any(h.process.is_alive() for h in self.actors.values()) and time.monotonic() < deadline:
            messages += self.poll(min(0.5, max(0.0, deadline - time.monotonic())))
        for actor_id, handle in self.actors.items():
            if handle.process.is_alive():
                handle.process.kill()
            handle.process.join(timeout=10)
            messages += self._drain(actor_id)
            handle.close()
        self.actors.clear()
        return messages
