"""The evaluation manager: plan episodes, run the missing ones on actors, report.

Every finished episode is written at once, atomically, to ``output_dir/episodes/``; a run
started again with the same ``EVALUATION.output_dir`` runs exactly the episodes that have no
record yet. An actor that dies has its episode retried on a fresh actor (up to
``EVALUATION.max_attempts``); a model worker that dies is restarted by the broker and its
batch resent; an episode whose policy server (agent=remote) was lost, or whose state its model
worker lost (a model that remembers episodes: the worker died), is rerun from its start, also up to
``EVALUATION.max_attempts``. Nothing is counted twice: a record, once written, is never replaced.

Episodes still running when a run stops on an error or Ctrl-C get ``STOP_GRACE_S`` to finish (SIGTERM,
whose SIGKILL follows soon: ``TERM_GRACE_S``), and are kept; results.json then says what is missing and
how to resume. A manager killed outright leaves no half-written record (temp files of interrupted
writes are never counted and are removed by the next run), and its actors stop on their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiprocess
import multiprocess.connection

from agents.factory import AGENTS
from wam_gym.broker import InferenceBroker
from wam_gym.eval import preflight, protocols
from wam_gym.eval.actor import ActorSpec, actor_main
from wam_gym.eval.config import EvalConfig
from wam_gym.eval.errors import EvalError, OutputDirBusy
from wam_gym.eval.imagination import ImaginationSpec, imagination_spec
from wam_gym.eval.run_protocol import RunProtocol, agent_identity, benchmark_protocol, episode_seed, reference_outcomes
from wam_gym.eval.stopping import StoppingRule
from wam_gym.eval.tasks import BENCHMARK_TASK_SETS, Job, plan, resolve_tasks
from wam_gym.policies import SERVED_AGENTS, policy_factory
from wam_gym.remote import PolicyServerError, PolicyServerLost, RemoteSettings, served_model
from wam_gym.results import (
    EPISODES_DIR,
    EpisodeRecord,
    OutOfSpaceError,
    ResultStore,
    format_table,
    log_tensorboard,
    summarize,
    write_summary,
)
from wam_gym.utils import run_dir
from wam_gym.utils.stop_signals import Stopped

logger = logging.getLogger(__name__)


# Episodes in flight when a run stops (an error, Ctrl-C) get this long to finish; they are kept.
STOP_GRACE_S = 30.0
# SIGTERM's (a batch scheduler's time limit): its SIGKILL follows (Slurm: 30 s later), results.json must be written first
TERM_GRACE_S = 5.0
# Temp names of wam_gym.utils.publish.atomic_path (".<name>.<random>.tmp", ".<name>.<random>.tmp.mp4" for videos).
STALE_TEMP_GLOBS = (".*.tmp", f"{EPISODES_DIR}/*/.*.tmp", "videos/*/.*.tmp.mp4")

__all__ = ["EvalError", "EvalManager"]  # EvalError lives in wam_gym.eval.errors


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
    """Rollout actor processes, each fed one job at a time.

    Every actor has its own job pipe and result pipe (no queue shared between actors): a
    SIGKILL can cut short only the dead actor's own message, and never leaves a lock held that
    the other actors need (a shared multiprocess Queue can: its write lock stays taken forever
    when the writer dies inside ``put``).

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


class EvalManager:
    """Plans the episodes and checks every input on construction (nothing starts, nothing is
    written); :meth:`run` takes the output dir's lock and runs what is missing."""

    def __init__(self, config: EvalConfig, composed: dict | None = None):
        self.config, self.composed = config, _redacted(composed or {})
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
        self.stopping = StoppingRule(ev.target_ci_halfwidth, None, ev.stop_level)  # compare_to's outcomes: below
        # A run that may stop early advances every task together (trial 0 of each, then trial 1, ...).
        self.jobs = plan(self.tasks, ev.num_trials, ev.seed, by_trial=ev.target_ci_halfwidth is not None or
                         ev.compare_to is not None)
        # EVALUATION.protocol (its knobs and env kwargs are already in config): its suite, its init-state rule
        self.named_protocol = protocols.named(ev.protocol)
        protocols.check_plan(self.named_protocol, self.tasks, self.jobs)
        # each task's step limit (per task: a protocol may give each suite its own)
        self.episode_steps = {task.name: protocols.episode_steps(ev, task.env_id) for task in self.tasks}
        self.output_dir = Path(ev.output_dir).expanduser()
        run_dir.check_writable(self.output_dir, "EVALUATION.output_dir")
        self.store = ResultStore(self.output_dir)
        self.env_kwargs = dict(config.env_kwargs)
        self.ckpt: Path | None = None  # absolute, ~ expanded
        self.stats: Path | None = None  # the dataset statistics the model workers un-normalise with
        self.image_resized = False
        self.imagination: ImaginationSpec | None = None  # the scorer's settings, when predicted frames are scored
        if ev.agent == "wam":
            self._check_checkpoint()
        elif ev.agent == "python":
            preflight.check_python_policy(ev)
        elif ev.agent == "remote":
            preflight.check_remote(ev, self.tasks, self.env_kwargs)
        preflight.check_video_camera(ev.video_camera, self.tasks, self.env_kwargs)
        self.protocol = RunProtocol(self.output_dir, benchmark_protocol(config, self.tasks, self.env_kwargs),
                                    agent_identity(config, self.ckpt, self.stats))
        if ev.compare_to:
            self.protocol.reference, self.stopping.reference = reference_outcomes(
                ev.compare_to, self.protocol.record, self.output_dir)
        self._outcomes: dict[tuple[str, int], bool] = {}  # this run's episodes on disk: the stopping rules' input
        self._planned = [job.key for job in self.jobs]
        self.resume_mismatch: list[dict[str, Any]] = []
        self._foreign_tasks: set[str] = set()  # tasks whose env differs from the one on record (never kept)
        self.broker_stats: dict[str, Any] = {}
        # episodes this invocation ran again, by cause, and actors it killed for making no progress
        self.reruns = {"actor_lost": 0, "server_lost": 0, "worker_lost": 0, "actors_stalled": 0}
        self.on_started = None  # test hook: called with (manager, actor pool, broker) once running
        self.server_model: Any = None  # agent=remote: what the server said it serves when the run began

    def _check_checkpoint(self) -> None:
        """The checkpoint, its statistics and the env geometry it needs, all read here, in the
        manager: a model worker would find a problem only after minutes of loading."""
        ev = self.config.EVALUATION
        protocols.check_checkpoint_inputs(self.named_protocol, self.config.ckpt)  # first: the one fix that matters
        self.ckpt, model, self.stats = preflight.wam_checkpoint(self.config.ckpt, ev)
        self.image_resized = preflight.check_image_size(self.env_kwargs, model, ev.allow_image_resize)
        preflight.check_cameras(self.env_kwargs, model)
        self.imagination = imagination_spec(ev, model, self.ckpt)
        # The envs render what the checkpoint was trained on (cameras, image size) unless told otherwise.
        self.env_kwargs = {"cameras": list(model.cameras), "image_size": list(model.image_size), **self.env_kwargs}

    # ----------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        if self.config.EVALUATION.agent == "remote":  # the model behind the server is part of what acts
            try:  # before the output dir is touched: a server never reached costs nothing
                self.server_model = served_model(RemoteSettings.from_evaluation(self.config.EVALUATION), first=True)
            except (PolicyServerLost, PolicyServerError) as exc:
                raise EvalError(f"{exc}; nothing was run") from None
            self.protocol.record["agent"]["server_model"] = self.server_model
        with run_dir.locked(self.output_dir, run_dir.EVAL_LOCK, knob="EVALUATION.output_dir", what="evaluation",
                            error=OutputDirBusy):  # held until the summary is written
            self.resume_mismatch = self.protocol.resume(bool(self.store.done()),
                                                        self.config.EVALUATION.allow_resume_mismatch)
            self.store.seed = episode_seed(self.protocol.record)  # records must be the trials they say they are
            return self._run()

    def _run(self) -> dict[str, Any]:
        keys = self._planned
        self._remove_stale_temp_files()
        planned = set(keys)
        self._outcomes = {key: success for key, success in self.store.outcomes().items() if key in planned}
        self._decide()
        todo = deque(job for job in self.jobs if job.key not in self._outcomes and self.stopping.wanted(job.key))
        logger.info("%d episodes planned, %d already done, %d to run -> %s",
                    len(keys), len(keys) - len(todo), len(todo), self.output_dir)
        start = time.monotonic()
        error = stopped = None
        try:
            if todo:
                self._run_jobs(todo, done=len(keys) - len(todo))
        except OutOfSpaceError as exc:
            error = f"{exc.strerror} with EVALUATION.output_dir={self.output_dir}"
            raise EvalError(error) from exc
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (wam_gym.utils.stop_signals): say how to resume
            stopped = Stopped.of(exc)
        except BaseException as exc:  # results.json says why the run is incomplete
            error = str(exc) if isinstance(exc, EvalError) else f"{type(exc).__name__}: {exc}"
            raise
        finally:
            summary = self._report(time.monotonic() - start, error, stopped)
        if stopped is not None:
            raise Stopped(stopped.signum, summary["error"]) from None
        return summary

    def _remove_stale_temp_files(self) -> None:
        """Temp files of atomic writes a killed run left (records, results, videos): never counted,
        removed here so they do not pile up (the lock makes this run the only writer)."""
        for path in itertools.chain(*(self.output_dir.glob(p) for p in STALE_TEMP_GLOBS)):
            logger.info("removing %s, left by an interrupted run", path)
            path.unlink(missing_ok=True)

    def _spec(self, broker: InferenceBroker | None = None) -> ActorSpec:
        ev = self.config.EVALUATION
        return ActorSpec(
            agent=ev.agent, output_dir=str(self.output_dir), env_kwargs=self.env_kwargs,
            episode_steps=self.episode_steps, action_horizon=ev.action_horizon, replan_steps=ev.replan_steps,
            save_video=ev.eval_save_video, visualize_future_video=ev.visualize_future_video,
            video_camera=ev.video_camera, video_fps=ev.video_fps, video_stride=ev.video_stride,
            lazy_pixels=ev.render == "needed", latency=ev.latency(),
            remembers_episodes=broker is not None and broker.remembers_episodes,  # as its model declares
            remote=dataclasses.replace(RemoteSettings.from_evaluation(ev, self.tasks), expected_model=self.server_model)
            if ev.agent == "remote" else None,
            imagination=self.imagination,
        )

    def _broker(self, ctx) -> InferenceBroker | None:
        ev, mr = self.config.EVALUATION, self.config.MULTIRUN
        if ev.agent not in SERVED_AGENTS:
            return None
        return InferenceBroker(policy_factory(ev, mr.prompt_cache_size, self.ckpt, self.stats), mr, ctx).start()

    def _run_jobs(self, todo: deque[Job], done: int) -> None:
        from tqdm import tqdm

        ctx = multiprocess.get_context("spawn")
        mr = self.config.MULTIRUN
        broker = self._broker(ctx)
        workers = len(broker.devices) if broker else mr.workers_per_gpu * max(1, mr.num_gpus)
        actors = ActorPool(ctx, self._spec(broker), broker, self.config.EVALUATION.actor_stall_s)
        bar = tqdm(total=len(self.jobs), initial=done, unit="ep", desc=self.config.benchmark, dynamic_ncols=True)
        grace_s = STOP_GRACE_S
        try:
            for _ in range(min(len(todo), workers * mr.env_num_per_worker)):
                actors.spawn()
            if self.on_started:
                self.on_started(self, actors, broker)
            while todo or actors.busy():
                for actor_id in actors.idle():
                    while todo and not self.stopping.wanted(todo[0].key):  # decided meanwhile: never started
                        todo.popleft()
                    if todo:
                        actors.assign(actor_id, todo.popleft())
                self._collect(actors, actors.poll(timeout=0.5), bar, todo)
                self._retry_lost(actors, todo, bar)
                if broker:
                    broker.check()
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

    def _collect(self, actors: ActorPool, messages: list, bar, todo: deque[Job]) -> None:
        """Write every finished episode, queue the reruns, then raise for the first failed one (if any)."""
        errors = [payload for kind, _, payload in messages if kind == "error"]
        for kind, actor_id, payload in messages:
            if kind == "env":  # an actor built a task's env: what it is goes into protocol.json
                errors += self._observe(*payload)
            elif kind == "done":
                actors.release(actor_id)
                if self._keep(payload):
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
                f"in {self.output_dir}; fix the cause and run again with EVALUATION.output_dir={self.output_dir} "
                "to resume"
            )

    def _observe(self, task: str, facts: dict[str, Any]) -> list[EvalError]:
        """Record what ``task``'s env is; an env unlike the one this dir's episodes ran in stops the run,
        and no episode of that task run in it is kept."""
        try:
            self.protocol.observe(task, facts)
        except EvalError as exc:
            self._foreign_tasks.add(task)
            return [exc]
        return []

    def _keep(self, record: EpisodeRecord) -> bool:
        """Write ``record`` unless it is already on disk, or ran in an env unlike this dir's (see _observe)."""
        if record.task in self._foreign_tasks or not self.store.write(record):
            return False
        self._outcomes[record.key] = record.success
        self._decide()
        return True

    def _decide(self) -> None:
        """Let the stopping rules (EVALUATION.target_ci_halfwidth, compare_to) see every outcome so far."""
        if self.stopping.active:
            before = (set(self.stopping.stopped_tasks), self.stopping.decided)
            self.stopping.update(self._outcomes, self._planned)
            for task in set(self.stopping.stopped_tasks) - before[0]:
                logger.info("%s: its interval is tight enough after %d episodes (EVALUATION.target_ci_halfwidth=%g); "
                            "no new trials start", task, self.stopping.stopped_tasks[task]["episodes"],
                            self.stopping.target_halfwidth)
            if self.stopping.decided and not before[1]:
                logger.info("the comparison with %s is decided: %s; no new episodes start",
                            self.config.EVALUATION.compare_to, self.stopping.comparison["decision"])

    def _keep_finished(self, messages: list) -> None:
        """Episodes that finished while the run was stopping count like any other."""
        for kind, _, payload in messages:
            if kind == "done" and self._keep(payload):
                logger.info("kept %s trial %d, finished while stopping", payload.task, payload.trial)

    def _retry_lost(self, actors: ActorPool, todo: deque[Job], bar) -> None:
        max_attempts = self.config.EVALUATION.max_attempts
        lost, late = actors.reap()
        self._collect(actors, late, bar, todo)  # a record sent just before dying is kept, not rerun
        for job in lost:
            if job is not None and job.key not in self._outcomes and self.stopping.wanted(job.key):
                if job.attempts >= max_attempts:
                    raise EvalError(f"{job.task.name} trial {job.trial}: its actor died or stalled {job.attempts} times; "
                                    "giving up")
                todo.appendleft(Job(job.task, job.trial, job.seed, job.attempts + 1))
                self.reruns["actor_lost"] += 1
            if todo:
                actors.spawn()

    def _rerun(self, job: Job, cause: str, why: str, todo: deque[Job]) -> None:
        """Run ``job`` again from its start: ``cause`` (server_lost, worker_lost) cut it short, no fault of the policy."""
        if job.attempts >= self.config.EVALUATION.max_attempts:
            lost = (f"the policy server at {self.config.EVALUATION.remote_url}" if cause == "server_lost"
                    else "the model worker holding its state")
            fix = "Start the server, then run" if cause == "server_lost" else "Run"
            raise EvalError(f"{job.task.name} trial {job.trial}: lost {lost} {job.attempts} times "
                            f"(EVALUATION.max_attempts), last: {why}. {fix} again with "
                            f"EVALUATION.output_dir={self.output_dir} to resume")
        logger.warning("%s trial %d: %s; running the episode again", job.task.name, job.trial, why)
        todo.appendleft(Job(job.task, job.trial, job.seed, job.attempts + 1))
        self.reruns[cause] += 1

    # ----------------------------------------------------------------- report
    def _report(self, wall_time_s: float, error: str | None, stopped: Stopped | None = None) -> dict[str, Any]:
        # A stopping rule's skipped episodes are not missing: the plan is what ran plus what is still wanted.
        keys = [job.key for job in self.jobs if job.key in self._outcomes or self.stopping.wanted(job.key)]
        summary = summarize(self.store.records(), keys)
        if stopped is not None:  # Ctrl-C, SIGTERM: what is missing, and how to resume
            error = f"stopped by {stopped.name}: {self._incomplete(keys) or 'every planned episode has a record'}"
        ev = self.config.EVALUATION
        extra = {
            "benchmark": self.config.benchmark,
            "wall_time_s": wall_time_s,
            "error": error if error or summary["complete"] else self._incomplete(keys),
            "broker": self.broker_stats,
            "reruns": self.reruns,  # this invocation's: an actor died or was killed, the policy server or a model worker was lost
            "init_state_pinned_to_trial": any(t.pins_init_state for t in self.tasks),
            "protocol_hash": self.protocol.hash,  # of protocol.json's protocol and observed parts
            "protocol": self.protocol.record,  # protocol.json: what the episodes are, and the agent that ran them
            "allow_resume_mismatch": ev.allow_resume_mismatch,
            "resume_mismatch": self.resume_mismatch,  # the differences a resume was allowed to ignore
            "image_resized": self.image_resized,  # env frames resized to the model's (allow_image_resize)
            # how predicted frames were scored (null: not scored): cameras, size, the env steps between frames
            "imagination": None if self.imagination is None else self.imagination.record,
            "stopping": self.stopping.report(),  # EVALUATION.target_ci_halfwidth / compare_to: what they decided
            "records_set_aside": self.store.set_aside,  # corrupt or misplaced record files moved aside
            "config": self.composed,
        }
        try:
            write_summary(self.output_dir, summary, extra)
        except OutOfSpaceError as exc:
            if error is None:  # else the run's own error is the one to report; the records are on disk
                raise EvalError(f"{exc.strerror} with EVALUATION.output_dir={self.output_dir}") from exc
            logger.error("%s", exc.strerror)
        if ev.tensorboard:
            try:
                log_tensorboard(self.output_dir / "tensorboard", summary)
            except (RuntimeError, OSError) as exc:  # scalars are a convenience: never lose the run over them
                logger.warning("tensorboard: %s", exc)
        print(format_table(summary))
        if self.broker_stats:
            s = self.broker_stats
            print(f"broker: mean batch {s['mean_batch_size']:.2f}, queue wait p50/p95 {s['queue_wait_ms_p50']:.1f}/"
                  f"{s['queue_wait_ms_p95']:.1f} ms (filling a batch p50 {s['batch_fill_ms_p50']:.1f} ms), "
                  f"model p50/p95 {s['model_ms_p50']:.1f}/{s['model_ms_p95']:.1f} ms, "
                  f"stacking a batch p50/p95 {s['stack_ms_p50']:.1f}/{s['stack_ms_p95']:.1f} ms")
        print(f"results: {self.output_dir / 'results.json'} (+ results.csv, episodes/)")
        return {**summary, **extra}

    def _incomplete(self, keys: list[tuple[str, int]]) -> str | None:
        """Why a run that raised nothing still lacks episodes (results.json's error is never null then)."""
        missing = self.store.missing(keys)
        if not missing:
            return None
        task, trial = missing[0]
        return (f"{len(missing)} of {len(keys)} planned episodes have no record (first: {task} trial {trial}); "
                f"run again with EVALUATION.output_dir={self.output_dir} to run them")


def _redacted(composed: dict) -> dict:
    """The composed config as results.json keeps it, without the policy server's api key."""
    evaluation = composed.get("EVALUATION")
    if isinstance(evaluation, dict) and evaluation.get("remote_api_key"):
        return {**composed, "EVALUATION": {**evaluation, "remote_api_key": "<redacted>"}}
    return composed
