"""The run loop: hand the missing episodes to rollout actors, keep each record once, rerun the lost ones.

An actor that dies has its episode retried on a fresh actor (up to ``EVALUATION.max_attempts``); an
episode whose policy server (agent=remote) was lost, or whose state its model worker lost (a model
that remembers episodes: the worker died), is rerun from its start, also up to ``max_attempts``.
Nothing is counted twice: a record, once written, is never replaced. The stopping rules
(``EVALUATION.target_ci_halfwidth``, ``compare_to``) see every outcome as it is written.
"""

from __future__ import annotations

import logging
import signal
from collections import deque
from typing import Any

import multiprocess

from wam_gym.broker import InferenceBroker
from wam_gym.broker.ray_pool import connect_ray
from wam_gym.eval.actor_pool import ActorPool
from wam_gym.eval.errors import EvalError
from wam_gym.eval.planning import EvalPlan
from wam_gym.eval.results import EpisodeRecord
from wam_gym.eval.tasks import Job
from wam_gym.policies import SERVED_AGENTS, policy_factory
from wam_gym.utils.stop_signals import Stopped

logger = logging.getLogger(__name__)

# Episodes in flight when a run stops (an error, Ctrl-C) get this long to finish; they are kept.
STOP_GRACE_S = 30.0
# SIGTERM's (a batch scheduler's time limit): its SIGKILL follows (Slurm: 30 s later), results.json must be written first
TERM_GRACE_S = 5.0


class RunLoop:
    """Runs a plan's missing jobs; ``outcomes`` holds every episode on disk, this run's included."""

    def __init__(self, plan: EvalPlan, outcomes: dict[tuple[str, int], bool], server_model: Any = None):
        self.plan, self.outcomes, self.server_model = plan, outcomes, server_model
        self.evaluation = plan.config.EVALUATION
        self.foreign_tasks: set[str] = set()  # tasks whose env differs from the one on record (never kept)
        self.broker_stats: dict[str, Any] = {}
        # episodes this invocation ran again, by cause, and actors it killed for making no progress
        self.reruns = {"actor_lost": 0, "server_lost": 0, "worker_lost": 0, "actors_stalled": 0}
        self.on_started = None  # test hook: called with (manager, actor pool, broker) once running
        self.manager = None  # what on_started is given first (the EvalManager running this loop)

    def _broker(self, ctx) -> InferenceBroker | None:
        plan, mr = self.plan, self.plan.config.MULTIRUN
        if self.evaluation.agent not in SERVED_AGENTS:
            return None
        inputs = plan.named_protocol.model_inputs if plan.named_protocol is not None else None
        factory = policy_factory(self.evaluation, mr.prompt_cache_size, plan.ckpt, plan.stats, inputs)
        if mr.actor_backend == "ray":  # actors on any node: the broker in a Ray actor on this node (ray_broker.py)
            from wam_gym.eval.ray_actor_pool import ray_actor_count
            from wam_gym.eval.ray_broker import RayBroker

            return RayBroker(factory, mr, ray_actor_count(mr))
        return InferenceBroker(factory, mr, ctx).start()

    def run(self, todo: deque[Job], done: int) -> None:
        """Run ``todo`` to the end (``done`` episodes of the plan are on disk already)."""
        from tqdm import tqdm

        ctx = multiprocess.get_context("spawn")
        mr = self.plan.config.MULTIRUN
        owns_ray = mr.actor_backend == "ray" and connect_ray(mr.ray_address)  # before the broker: one cluster
        broker = self._broker(ctx)
        spec = self.plan.actor_spec(broker is not None and broker.remembers_episodes, self.server_model)
        actors, count = actor_pool(ctx, spec, broker, self.plan)
        bar = tqdm(total=len(self.plan.jobs), initial=done, unit="ep", desc=self.plan.config.benchmark,
                   dynamic_ncols=True)
        grace_s = STOP_GRACE_S
        try:
            for _ in range(min(len(todo), count)):
                actors.spawn()
            if self.on_started:
                self.on_started(self.manager, actors, broker)
            self._loop(actors, broker, todo, bar)
        except Stopped as exc:
            if exc.signum == signal.SIGTERM:  # a scheduler's SIGKILL follows soon: results.json comes first
                grace_s = TERM_GRACE_S
            raise
        finally:
            bar.close()
            if actors.busy():
                logger.info("stopping: waiting up to %.0f s for the episodes in flight", grace_s)
            self._keep_finished(actors.stop(grace_s))  # before the broker closes: WAM episodes need it
            self.reruns["actors_stalled"] = actors.stalled
            if broker:
                self.broker_stats = broker.stats.summary()
                broker.close()
            if owns_ray:
                import ray

                ray.shutdown()

    def _loop(self, actors: ActorPool, broker: InferenceBroker | None, todo: deque[Job], bar) -> None:
        stopping = self.plan.stopping
        while todo or actors.busy():
            for actor_id in actors.idle():
                while todo and not stopping.wanted(todo[0].key):  # decided meanwhile: never started
                    todo.popleft()
                if todo:
                    actors.assign(actor_id, todo.popleft())
            self._collect(actors, actors.poll(timeout=0.5), bar, todo)
            self._retry_lost(actors, todo, bar)
            if broker:
                broker.check()

    def _collect(self, actors: ActorPool, messages: list, bar, todo: deque[Job]) -> None:
        """Write every finished episode, queue the reruns, then raise for the first failed one (if any)."""
        errors = [payload for kind, _, payload in messages if kind == "error"]
        for kind, actor_id, payload in messages:
            if kind == "env":  # an actor built a task's env: what it is goes into protocol.json
                errors += self._observe(*payload)
            elif kind == "done":
                actors.release(actor_id)
                if self.keep(payload):
                    bar.update(1)
            elif kind == "retry":  # the policy server, or the episode's model worker, was lost: no failure, run it again
                actors.release(actor_id)
                self._rerun(*payload, todo)
        if errors:
            if isinstance(errors[0], EvalError):
                raise errors[0]
            job, error_type, message, trace = errors[0]
            logger.error("episode %s trial %d failed:\n%s", job.task.name, job.trial, trace)
            raise EvalError(
                f"{job.task.name} trial {job.trial} failed: {error_type}: {message}. Episodes finished so far are "
                f"in {self.plan.output_dir}; fix the cause and run again with EVALUATION.output_dir="
                f"{self.plan.output_dir} to resume"
            )

    def _observe(self, task: str, facts: dict[str, Any]) -> list[EvalError]:
        """Record what ``task``'s env is; an env unlike the one this dir's episodes ran in stops the run,
        and no episode of that task run in it is kept."""
        try:
            self.plan.protocol.observe(task, facts)
        except EvalError as exc:
            self.foreign_tasks.add(task)
            return [exc]
        return []

    def keep(self, record: EpisodeRecord) -> bool:
        """Write ``record`` unless it is already on disk, or ran in an env unlike this dir's (see _observe)."""
        if record.task in self.foreign_tasks or not self.plan.store.write(record):
            return False
        self.outcomes[record.key] = record.success
        self.decide()
        return True

    def decide(self) -> None:
        """Let the stopping rules (EVALUATION.target_ci_halfwidth, compare_to) see every outcome so far."""
        stopping = self.plan.stopping
        if stopping.active:
            before = (set(stopping.stopped_tasks), stopping.decided)
            stopping.update(self.outcomes, self.plan.keys)
            for task in set(stopping.stopped_tasks) - before[0]:
                logger.info("%s: its interval is tight enough after %d episodes (EVALUATION.target_ci_halfwidth=%g); "
                            "no new trials start", task, stopping.stopped_tasks[task]["episodes"],
                            stopping.target_halfwidth)
            if stopping.decided and not before[1]:
                logger.info("the comparison with %s is decided: %s; no new episodes start",
                            self.evaluation.compare_to, stopping.comparison["decision"])

    def _keep_finished(self, messages: list) -> None:
        """Episodes that finished while the run was stopping count like any other."""
        for kind, _, payload in messages:
            if kind == "done" and self.keep(payload):
                logger.info("kept %s trial %d, finished while stopping", payload.task, payload.trial)

    def _retry_lost(self, actors: ActorPool, todo: deque[Job], bar) -> None:
        lost, late = actors.reap()
        self._collect(actors, late, bar, todo)  # a record sent just before dying is kept, not rerun
        for job in lost:
            if job is not None and job.key not in self.outcomes and self.plan.stopping.wanted(job.key):
                if job.attempts >= self.evaluation.max_attempts:
                    raise EvalError(f"{job.task.name} trial {job.trial}: its actor died or stalled {job.attempts} times; "
                                    "giving up")
                todo.appendleft(Job(job.task, job.trial, job.seed, job.attempts + 1))
                self.reruns["actor_lost"] += 1
            if todo:
                actors.spawn()

    def _rerun(self, job: Job, cause: str, why: str, todo: deque[Job]) -> None:
        """Run ``job`` again from its start: ``cause`` (server_lost, worker_lost) cut it short, no fault of the policy."""
        if job.attempts >= self.evaluation.max_attempts:
            lost = (f"the policy server at {self.plan.config.REMOTE.url}" if cause == "server_lost"
                    else "the model worker holding its state")
            fix = "Start the server, then run" if cause == "server_lost" else "Run"
            raise EvalError(f"{job.task.name} trial {job.trial}: lost {lost} {job.attempts} times "
                            f"(EVALUATION.max_attempts), last: {why}. {fix} again with "
                            f"EVALUATION.output_dir={self.plan.output_dir} to resume")
        logger.warning("%s trial %d: %s; running the episode again", job.task.name, job.trial, why)
        todo.appendleft(Job(job.task, job.trial, job.seed, job.attempts + 1))
        self.reruns[cause] += 1


def actor_pool(ctx, spec, broker: InferenceBroker | None, plan: EvalPlan) -> tuple[Any, int]:
    """The rollout actors' pool (MULTIRUN.actor_backend), and how many actors it starts with."""
    mr = plan.config.MULTIRUN
    if mr.actor_backend == "ray":
        from wam_gym.eval.ray_actor_pool import RayActorPool, ray_actor_count

        return RayActorPool(spec, mr, plan.output_dir, broker, plan.config.EVALUATION.actor_stall_s), ray_actor_count(mr)
    workers = len(broker.devices) if broker else mr.workers_per_gpu * max(1, mr.num_gpus)
    return ActorPool(ctx, spec, broker, plan.config.EVALUATION.actor_stall_s), workers * mr.env_num_per_worker
