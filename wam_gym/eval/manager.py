"""The evaluation manager: plan episodes, run the missing ones on actors, report.

Every finished episode is written at once, atomically, to ``output_dir/episodes/``; a run
started again with the same ``EVALUATION.output_dir`` runs exactly the episodes that have no
record yet. An actor that dies has its episode retried on a fresh actor (up to
``EVALUATION.max_attempts``); a model worker that dies is restarted by the broker and its
batch resent. Nothing is counted twice: a record, once written, is never replaced.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiprocess

from wam_gym.broker import InferenceBroker
from wam_gym.eval.actor import ActorSpec, actor_main
from wam_gym.eval.config import AGENTS, EvalConfig
from wam_gym.eval.tasks import BENCHMARK_TASK_SETS, Job, plan, resolve_tasks
from wam_gym.results import EpisodeRecord, ResultStore, format_table, log_tensorboard, summarize, write_summary

logger = logging.getLogger(__name__)


class EvalError(RuntimeError):
    """The evaluation stopped; every episode finished before it is on disk."""


def checkpoint_policy(
    ckpt: str, inference, dataset_stats_path: str | None, prompt_cache_size: int, overrides: dict, device: str
):
    """Builds the WAM policy inside a model worker (module level: picklable by reference)."""
    from agents.wam.policy import WAMPolicy

    return WAMPolicy.from_checkpoint(
        ckpt, inference, dataset_stats_path, device=device, prompt_cache_size=prompt_cache_size, **overrides
    )


@dataclass
class _ActorHandle:
    process: Any
    jobs: Any
    job: Job | None = None


class ActorPool:
    """Rollout actor processes, each fed one job at a time."""

    def __init__(self, ctx, spec: ActorSpec, broker: InferenceBroker | None):
        self.ctx, self.spec, self.broker = ctx, spec, broker
        self.results = ctx.Queue()
        self.actors: dict[int, _ActorHandle] = {}
        self._ids = itertools.count()

    def spawn(self) -> int:
        actor_id = next(self._ids)
        client = self.broker.client(actor_id) if self.broker else None
        jobs = self.ctx.Queue()
        process = self.ctx.Process(
            target=actor_main, name=f"wam-actor-{actor_id}", daemon=True,
            args=(actor_id, self.spec, jobs, self.results, client),
        )
        process.start()
        self.actors[actor_id] = _ActorHandle(process, jobs)
        return actor_id

    def idle(self) -> list[int]:
        return [i for i, a in self.actors.items() if a.job is None]

    def busy(self) -> bool:
        return any(a.job is not None for a in self.actors.values())

    def assign(self, actor_id: int, job: Job) -> None:
        self.actors[actor_id].job = job
        self.actors[actor_id].jobs.put(job)

    def release(self, actor_id: int) -> Job | None:
        handle = self.actors.get(actor_id)
        job, handle.job = (handle.job, None) if handle else (None, None)
        return job

    def reap(self) -> list[Job | None]:
        """Remove dead actors; return the jobs they held."""
        lost = []
        for actor_id, handle in list(self.actors.items()):
            if not handle.process.is_alive():
                del self.actors[actor_id]
                if self.broker:
                    self.broker.forget_actor(actor_id)
                logger.warning("actor %d died (exit code %s)", actor_id, handle.process.exitcode)
                lost.append(handle.job)
        return lost

    def pids(self) -> dict[int, int]:
        return {i: a.process.pid for i, a in self.actors.items()}

    def stop(self) -> None:
        for handle in self.actors.values():
            handle.jobs.put(None)
        for handle in self.actors.values():
            handle.process.join(timeout=10)
            if handle.process.is_alive():
                handle.process.kill()


class EvalManager:
    def __init__(self, config: EvalConfig, composed: dict | None = None):
        self.config, self.composed = config, composed or {}
        ev, mr = config.EVALUATION, config.MULTIRUN
        if ev.agent not in AGENTS:
            raise ValueError(f"EVALUATION.agent={ev.agent!r}: choose one of {AGENTS}")
        task_sets = mr.task_sets or BENCHMARK_TASK_SETS.get(config.benchmark)
        if not task_sets:
            raise ValueError(
                f"benchmark={config.benchmark!r} has no default task sets ({sorted(BENCHMARK_TASK_SETS)}); "
                "set MULTIRUN.task_sets=[...]"
            )
        self.tasks = resolve_tasks(task_sets)
        self.jobs = plan(self.tasks, ev.num_trials, ev.seed)
        self.output_dir = Path(ev.output_dir)
        self.store = ResultStore(self.output_dir)
        self.env_kwargs = dict(config.env_kwargs)
        if ev.agent == "wam":
            self.env_kwargs = {**self._model_env_kwargs(), **self.env_kwargs}
        self.broker_stats: dict[str, Any] = {}
        self.on_started = None  # test hook: called with (manager, actor pool, broker) once running

    def _model_env_kwargs(self) -> dict[str, Any]:
        """Ask the envs for the cameras and image size the checkpoint was trained on."""
        from agents.wam.checkpoint import CONFIG_FILE, MissingCheckpointError
        from agents.wam.config import MoTConfig

        ckpt = self.config.ckpt
        if ckpt is None:
            raise ValueError("EVALUATION.agent=wam needs ckpt=<checkpoint dir> (or EVALUATION.agent=expert|random)")
        if not (Path(ckpt) / CONFIG_FILE).is_file():
            raise MissingCheckpointError(f"ckpt={ckpt} is not a checkpoint directory (no {CONFIG_FILE}); pass the "
                                         "directory python -m training saved")
        model = MoTConfig.load(Path(ckpt) / CONFIG_FILE)
        return {"cameras": list(model.cameras), "image_size": list(model.image_size)}

    # ----------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        keys = [job.key for job in self.jobs]
        missing = set(self.store.missing(keys))
        todo = deque(job for job in self.jobs if job.key in missing)
        logger.info("%d episodes planned, %d already done, %d to run -> %s",
                    len(keys), len(keys) - len(todo), len(todo), self.output_dir)
        start = time.monotonic()
        error = None
        try:
            if todo:
                self._run_jobs(todo, done=len(keys) - len(todo))
        except EvalError as exc:
            error = str(exc)
            raise
        finally:
            summary = self._report(time.monotonic() - start, error)
        return summary

    def _spec(self) -> ActorSpec:
        ev = self.config.EVALUATION
        return ActorSpec(
            agent=ev.agent, output_dir=str(self.output_dir), env_kwargs=self.env_kwargs,
            max_episode_steps=ev.max_episode_steps, action_horizon=ev.action_horizon, replan_steps=ev.replan_steps,
            save_video=ev.eval_save_video, visualize_future_video=ev.visualize_future_video,
            video_camera=ev.video_camera, video_fps=ev.video_fps,
        )

    def _broker(self, ctx) -> InferenceBroker | None:
        ev, mr = self.config.EVALUATION, self.config.MULTIRUN
        if ev.agent != "wam":
            return None
        overrides = {"video_mode": ev.video_mode} if ev.video_mode else {}
        factory = functools.partial(
            checkpoint_policy, self.config.ckpt, ev.inference(), ev.dataset_stats_path, mr.prompt_cache_size, overrides
        )
        return InferenceBroker(factory, mr, ctx).start()

    def _run_jobs(self, todo: deque[Job], done: int) -> None:
        from tqdm import tqdm

        ctx = multiprocess.get_context("spawn")
        mr = self.config.MULTIRUN
        broker = self._broker(ctx)
        workers = len(broker.devices) if broker else mr.workers_per_gpu * max(1, mr.num_gpus)
        actors = ActorPool(ctx, self._spec(), broker)
        bar = tqdm(total=len(self.jobs), initial=done, unit="ep", desc=self.config.benchmark, dynamic_ncols=True)
        try:
            for _ in range(min(len(todo), workers * mr.env_num_per_worker)):
                actors.spawn()
            if self.on_started:
                self.on_started(self, actors, broker)
            while todo or actors.busy():
                for actor_id in actors.idle():
                    if todo:
                        actors.assign(actor_id, todo.popleft())
                self._collect(actors, bar)
                self._retry_lost(actors, todo)
                if broker:
                    broker.check()
        finally:
            bar.close()
            actors.stop()
            if broker:
                self.broker_stats = broker.stats.summary()
                broker.close()

    def _collect(self, actors: ActorPool, bar) -> None:
        try:
            kind, actor_id, payload = actors.results.get(timeout=0.5)
        except queue.Empty:
            return
        while True:
            if kind == "error":
                job, error_type, message, trace = payload
                logger.error("episode %s trial %d failed:\n%s", job.task.name, job.trial, trace)
                raise EvalError(
                    f"{job.task.name} trial {job.trial} failed: {error_type}: {message}. Episodes finished so far are "
                    f"in {self.output_dir}; fix the cause and run again with EVALUATION.output_dir={self.output_dir} "
                    "to resume"
                )
            actors.release(actor_id)
            record: EpisodeRecord = payload
            if self.store.write(record):
                bar.update(1)
            try:
                kind, actor_id, payload = actors.results.get_nowait()
            except queue.Empty:
                return

    def _retry_lost(self, actors: ActorPool, todo: deque[Job]) -> None:
        max_attempts = self.config.EVALUATION.max_attempts
        for job in actors.reap():
            if job is not None and job.key not in self.store.done():
                if job.attempts >= max_attempts:
                    raise EvalError(f"{job.task.name} trial {job.trial}: its actor died {job.attempts} times; giving up")
                todo.appendleft(Job(job.task, job.trial, job.seed, job.attempts + 1))
            actors.spawn()

    # ----------------------------------------------------------------- report
    def _report(self, wall_time_s: float, error: str | None) -> dict[str, Any]:
        keys = [job.key for job in self.jobs]
        summary = summarize(self.store.records(), keys)
        extra = {
            "benchmark": self.config.benchmark,
            "wall_time_s": wall_time_s,
            "error": error,
            "broker": self.broker_stats,
            "init_state_pinned_to_trial": any(t.pins_init_state for t in self.tasks),
            "config": self.composed,
        }
        write_summary(self.output_dir, summary, extra)
        if self.config.EVALUATION.tensorboard:
            try:
                log_tensorboard(self.output_dir / "tensorboard", summary)
            except RuntimeError as exc:
                logger.warning("%s", exc)
        print(format_table(summary))
        if self.broker_stats:
            s = self.broker_stats
            print(f"broker: mean batch {s['mean_batch_size']:.2f}, queue wait p50/p95 {s['queue_wait_ms_p50']:.1f}/"
                  f"{s['queue_wait_ms_p95']:.1f} ms, model p50/p95 {s['model_ms_p50']:.1f}/{s['model_ms_p95']:.1f} ms")
        print(f"results: {self.output_dir / 'results.json'} (+ results.csv, episodes/)")
        return {**summary, **extra}
