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

from wam_gym.eval.actor import ActorSpec, ManagerGone, episode_message, rollout_actor
from wam_gym.eval.errors import EvalError
from wam_gym.eval.tasks import Job
from wam_gym.utils.publish import atomic_path

logger = logging.getLogger(__name__)


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
        self.actor = rollout_actor(actor_id, spec, client, tell=self.told.append)

    def ready(self) -> str:
        """The id of the node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def run(self, job: Job) -> tuple[list[tuple[str, int, Any]], dict[str, bytes]]:
        """The episode's messages as a local actor sends them (what each new env is, then done/retry/error), and
        its video's bytes by their path under the output dir."""
        try:
            message = episode_message(self.actor, self.actor_id, job)
        except ManagerGone:  # this node's raylet died under us: so do we, and the driver reruns the episode
            os._exit(1)
        told, self.told[:] = list(self.told), []
        video = getattr(message[2], "video", None) if message[0] == "done" else None
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

    def __init__(self, spec: ActorSpec, config, output_dir: Path, broker=None):
        import ray

        self.ray, self.spec, self.config, self.output_dir, self.broker = ray, spec, config, output_dir, broker
        self._cls = ray.remote(RayRolloutActor)
        self.actors: dict[int, _Handle] = {}
        self._ids = itertools.count()
        self.stalled = 0  # Ray watches the nodes; no actor is killed here for making no progress
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

    def reap(self) -> tuple[list[Job | None], list[tuple[str, int, Any]]]:
        """Remove dead actors, killed for good (a node that comes back must not revive them): the jobs they held."""
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
    import ray

    return config.num_actors or max(1, int(ray.cluster_resources().get("CPU", 0) / config.actor_cpus))


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
