"""Rollout actors as Ray actors (``MULTIRUN.actor_backend=ray``): the simulators on every node of a Ray cluster.

The run loop (wam_gym/eval/run_loop.py) drives this pool as it drives the local one (actor_pool.py): one job at a
time per actor, the episode's record handed back and written on the driver by the run's one writer
(wam_gym/eval/results.py). Each actor asks Ray for ``MULTIRUN.actor_cpus`` CPUs and ``MULTIRUN.actor_resources``,
so Ray places it on any node with them free. An actor counts as idle only once it is placed and built: one that
finds no free node waits without holding a job, and the others run the episodes.

A node that dies takes its actors with it: their calls raise Ray's ``RayActorError`` (``ActorUnavailableError``
within seconds, ``ActorDiedError`` once Ray declares the node dead). Such an actor is killed for good and its
job handed back, as a local actor's that died: the run loop reruns the episode on another actor. A record
reaches the driver only as the return value of a finished call, so each episode is recorded once, by the
driver, or not at all. Videos are made on the actor's node and travel back with their record.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray

from wam_gym.eval.actor import ActorSpec, ManagerGone, episode_message, rollout_actor
from wam_gym.eval.errors import EvalError
from wam_gym.eval.tasks import Job
from wam_gym.utils.publish import atomic_path

logger = logging.getLogger(__name__)

STALL_CHECK_S = 5.0  # how often busy actors are asked for their progress (EVALUATION.actor_stall_s)


class ActorStartFailed(EvalError):
    """A rollout actor raised while building itself on its node (wam_gym or a suite missing there, say)."""


class RayRolloutActor:
    """The Ray actor: one rollout actor (wam_gym/eval/actor.py), its envs built lazily on its node."""

    def __init__(self, actor_id: int, spec: ActorSpec, client=None):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.actor_id, self.told = actor_id, []
        # videos go to a folder of this node's own, then back to the driver with their record
        self.videos = Path(tempfile.mkdtemp(prefix="wam-videos-")) if spec.save_video else None
        if self.videos is not None:
            spec = replace(spec, output_dir=str(self.videos))
        self.seen = time.monotonic()  # its last progress: an env step, a model call's wait, a job's start
        self.actor = rollout_actor(actor_id, spec, client, tell=self.told.append, beat=self._beat)

    def _beat(self) -> None:
        self.seen = time.monotonic()

    @ray.method(concurrency_group="progress")
    def idle_s(self) -> float:
        """Seconds since its last progress, answered beside a running episode (a thread of its own; the episodes'
        calls all run in one other thread, where their envs' GL contexts live)."""
        return time.monotonic() - self.seen

    def ready(self) -> str:
        """The id of the node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def run(self, job: Job) -> tuple[list[tuple[str, int, Any]], dict[str, bytes]]:
        """The episode's messages as a local actor sends them (what each new env is, then done/retry/error), and
        its video's bytes by their path under the output dir."""
        self._beat()
        try:
            message = episode_message(self.actor, self.actor_id, job)
        except ManagerGone:  # this node's raylet died under us: so do we, and the driver reruns the episode
            os._exit(1)
        told, self.told[:] = list(self.told), []
        video = message[2].video if message[0] == "done" else None  # an EpisodeRecord
        videos = {video: (self.videos / video).read_bytes()} if video and self.videos is not None else {}
        for relative in videos:
            (self.videos / relative).unlink()
        return [*told, message], videos


@dataclass
class _Handle:
    handle: Any
    pending: Any  # the ref of its ready() call, then of its job's run(); None while idle
    node: str | None = None  # set once ready() answered: placed and built
    job: Job | None = None
    dead: bool = False


class RayActorPool:
    """Rollout actors as Ray actors: the local ActorPool's methods, for the same run loop."""

    def __init__(self, spec: ActorSpec, config, output_dir: Path, broker=None, stall_s: float | None = None):
        self.ray, self.spec, self.config, self.output_dir, self.broker = ray, spec, config, output_dir, broker
        self.stall_s, self._checked = stall_s, time.monotonic()
        self._cls = ray.remote(concurrency_groups={"progress": 1})(RayRolloutActor)  # idle_s beside run()
        self.actors: dict[int, _Handle] = {}
        self._ids = itertools.count()
        self.stalled = 0  # actors killed for making no progress (EVALUATION.actor_stall_s)
        self.lost_nodes: set[str] = set()  # nodes whose actors died under them

    def spawn(self) -> int:
        actor_id = next(self._ids)
        client = self.broker.client(actor_id) if self.broker else None
        handle = self._cls.options(num_cpus=self.config.actor_cpus, resources=dict(self.config.actor_resources),
                                   max_restarts=0, max_task_retries=0).remote(actor_id, self.spec, client)
        self.actors[actor_id] = _Handle(handle, handle.ready.remote())
        return actor_id

    def idle(self) -> list[int]:
        return [i for i, a in self.actors.items() if a.node is not None and a.job is None and not a.dead]

    def busy(self) -> bool:
        return any(a.job is not None for a in self.actors.values())

    def assign(self, actor_id: int, job: Job) -> None:
        actor = self.actors[actor_id]
        actor.job, actor.pending = job, actor.handle.run.remote(job)

    def release(self, actor_id: int) -> Job | None:
        actor = self.actors.get(actor_id)
        job, actor.job = (actor.job, None) if actor else (None, None)
        return job

    def poll(self, timeout: float) -> list[tuple[str, int, Any]]:
        """Messages ``(kind, actor_id, payload)`` of the calls that returned; waits up to ``timeout`` for one."""
        waiting = {a.pending: i for i, a in self.actors.items() if a.pending is not None and not a.dead}
        if not waiting:
            time.sleep(timeout)
            return []
        done, _ = self.ray.wait(list(waiting), num_returns=1, timeout=timeout)
        if done:  # and whatever else returned meanwhile
            done, _ = self.ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        return [m for ref in done for m in self._result(waiting[ref], ref)]

    def _result(self, actor_id: int, ref) -> list[tuple[str, int, Any]]:
        actor = self.actors[actor_id]
        actor.pending = None
        try:
            value = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:  # its node or its process died: reap() hands the job back
            if exc.actor_init_failed:  # it could not build itself: every other one would fail alike
                raise ActorStartFailed(f"a rollout actor failed to start on its node: {_last_line(exc)}") from None
            actor.dead = True
            logger.warning("rollout actor %d died on node %s: %s", actor_id, actor.node, _last_line(exc))
            self.lost_nodes.add(actor.node)
            return []
        if actor.node is None:  # its ready() call: placed and built
            actor.node = value
            return []
        messages, videos = value
        for relative, data in videos.items():  # before the record that names it is kept
            with atomic_path(self.output_dir / relative, suffix=".tmp.mp4") as temp:  # a killed run's: removed
                temp.write_bytes(data)
        return messages

    def _kill_stalled(self) -> None:
        """Every STALL_CHECK_S (or half of ``stall_s``): an actor with a job and no progress for ``stall_s`` (or
        that cannot even say so: a stopped process) is killed; reap() then hands its job back as a dead actor's."""
        every = min(STALL_CHECK_S, (self.stall_s or 0) / 2)
        if not self.stall_s or time.monotonic() - self._checked < every:
            return
        self._checked = time.monotonic()
        busy = {i: a for i, a in self.actors.items() if a.job is not None and not a.dead}
        asked = {a.handle.idle_s.remote(): i for i, a in busy.items()}
        answered, _ = self.ray.wait(list(asked), num_returns=len(asked), timeout=every) if asked else ([], [])
        idle = {asked[ref]: _value_or_none(self.ray, ref) for ref in answered}
        for actor_id, actor in busy.items():
            seconds = idle.get(actor_id, float("inf"))  # no answer: the whole process is stuck
            if seconds is not None and seconds > self.stall_s:
                logger.warning("rollout actor %d made no progress in %s trial %d for over %g s (EVALUATION."
                               "actor_stall_s); killing it, the episode will be retried", actor_id,
                               actor.job.task.name, actor.job.trial, self.stall_s)
                actor.dead = True
                self.stalled += 1

    def reap(self) -> tuple[list[Job | None], list[tuple[str, int, Any]]]:
        """Remove dead actors, killed for good (a node that comes back must not revive them): the jobs they held."""
        self._kill_stalled()
        lost = []
        for actor_id, actor in list(self.actors.items()):
            if actor.dead:
                self.ray.kill(actor.handle, no_restart=True)
                del self.actors[actor_id]
                if self.broker:
                    self.broker.forget_actor(actor_id)
                lost.append(actor.job)
        return lost, []

    def pids(self) -> dict[int, str | None]:
        """Each actor's node id (None until placed): where a local pool gives process ids."""
        return {i: a.node for i, a in self.actors.items()}

    def stop(self, grace_s: float) -> list[tuple[str, int, Any]]:
        """Wait up to ``grace_s`` for the episodes in flight; return their messages; end every actor."""
        deadline, messages = time.monotonic() + grace_s, []
        while self.busy() and time.monotonic() < deadline:
            found = self.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            for kind, actor_id, _ in found:
                if kind in ("done", "retry", "error"):
                    self.release(actor_id)
            for actor in self.actors.values():
                if actor.dead:
                    actor.job = None
            messages += found
        for actor in self.actors.values():
            self.ray.kill(actor.handle, no_restart=True)
        self.actors.clear()
        return messages


def ray_actor_count(config) -> int:
    """MULTIRUN.num_actors, or (null) as many actors as the cluster's CPUs hold at the run's start."""
    return config.num_actors or max(1, int(ray.cluster_resources().get("CPU", 0) / config.actor_cpus))


def _value_or_none(ray, ref) -> float | None:
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError:  # dead meanwhile (its node, say): the next poll says so, no stall
        return None


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
