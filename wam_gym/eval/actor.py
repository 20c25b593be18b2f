"""A rollout actor: one process, one env at a time, episodes handed to it by the manager.

Envs are built lazily inside the actor (never in the manager: no GL context there, and no
memory for suites nobody asked for) and kept per task. A WAM agent's model calls go to
the broker through a :class:`~wam_gym.broker.BrokerClient`; a remote agent's to a policy server
through its own :class:`~wam_gym.remote.RemotePolicy`. A policy server lost mid-episode, or the model
worker that held the episode's state (a model that remembers episodes), is reported as ``retry``: the
manager reruns the episode from its start, it is no failure.

Jobs come in and results go out on two pipes of the actor's own (with, once per task, what its
env is: action space, camera shapes, for protocol.json), so a SIGKILL of one actor
can only break its own channel. When the manager dies (SIGKILL) the actor stops too: at once
when idle (its job pipe reaches EOF), within one env step mid-episode. Ctrl-C and SIGTERM, which reach
every process of a terminal's or a job's group, are the manager's to act on: an actor ignores them.
While it runs an episode the actor sends a heartbeat at most every ``HEARTBEAT_S`` (on env steps, and
while it waits for the model), so the manager can tell a stalled actor from a slow one.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents import make_agent, run_episode
from agents.chunk_queue import ChunkQueueAgent
from agents.factory import CHUNK_AGENTS
from agents.predictor import Predictor
from agents.realtime import Latency
from envs.protocol import PIXELS
from wam_gym.broker.errors import EpisodeLost
from wam_gym.eval.imagination import ImaginationScore, ImaginationSpec
from wam_gym.eval.results import EpisodeRecord, task_slug
from wam_gym.eval.run_protocol import observed_env
from wam_gym.eval.tasks import Job
from wam_gym.remote import PolicyServerLost, RemotePolicy, RemoteSettings
from wam_gym.utils.stop_signals import ignore_stop_signals
from wam_gym.utils.video import EpisodeVideo, future_panel, tile


@dataclass
class ActorSpec:
    """Everything an actor needs, sent to it once (picklable)."""

    agent: str  # wam | python | remote | expert | random
    output_dir: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None  # every task's step limit, where episode_steps names none (null: the suite's)
    episode_steps: dict[str, int] = field(default_factory=dict)  # task name -> its step limit (the manager's plan)
    action_horizon: int | None = None
    replan_steps: int | None = None
    save_video: bool = False
    visualize_future_video: bool = False
    video_camera: str | None = None
    video_fps: int = 20
    video_stride: int = 1  # a video frame every this many steps
    lazy_pixels: bool = False  # envs render only what is read (EVALUATION.render=needed)
    latency: Latency | None = None  # real-time mode's latency rule (EVALUATION.realtime); None: synchronous
    realtime_strategy: str = "hold"  # how real-time mode merges arriving chunks (EVALUATION.realtime_strategy)
    remembers_episodes: bool = False  # the model keeps each episode's state between calls (its workers said so: LingBot-VA)
    remote: RemoteSettings | None = None  # agent=remote: the policy server
    imagination: ImaginationSpec | None = None  # score the predicted frames (EVALUATION.imagination_score)


# At most one heartbeat this often: cheap next to an env step, and far finer than EVALUATION.actor_stall_s.
HEARTBEAT_S = 1.0


class Heartbeat:
    """Tells the manager "alive, making progress" on the result pipe, at most every HEARTBEAT_S."""

    def __init__(self, actor_id: int, results):
        self.actor_id, self.results = actor_id, results
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + HEARTBEAT_S
            self.results.send(("alive", self.actor_id, None))


class ManagerGone(Exception):
    """The manager that started this actor has exited: nobody will collect the episode."""


class _Actor:
    def __init__(self, actor_id: int, spec: ActorSpec, client, beat=lambda: None, tell=lambda message: None):
        self.actor_id, self.spec, self.client, self.beat, self.tell = actor_id, spec, client, beat, tell
        self.manager = os.getppid()
        self.envs: dict[str, Any] = {}
        # Who answers a chunk agent's model calls: the broker (wam, python) or a policy server (remote);
        # None: the agent needs no model (expert, random).
        self.predictor: Predictor | None = None
        self.chunks: ChunkQueueAgent | None = None  # the agent, when it executes the predictor's chunks
        if spec.agent in CHUNK_AGENTS:
            self.predictor = RemotePolicy(spec.remote) if spec.agent == "remote" else client
            self.predictor.on_wait = beat  # waiting for the model is no stall of ours (the broker watches the model)
            self.chunks = make_agent(spec.agent, predictor=self.predictor, action_horizon=spec.action_horizon,
                                     replan_steps=spec.replan_steps, latency=spec.latency,
                                     realtime_strategy=spec.realtime_strategy,
                                     remembers_episodes=spec.remembers_episodes)
        # One agent for every episode, but a random agent is made per episode, seeded by it.
        self.agent = self.chunks or (None if spec.agent == "random" else make_agent(spec.agent))

    def steps(self, job: Job) -> int | None:
        """The task's step limit (None: the env's registered one)."""
        return self.spec.episode_steps.get(job.task.name, self.spec.max_episode_steps)

    def _lazy(self, job: Job) -> bool:
        """Whether this task's env renders only what is read (its suite's envs can)."""
        from envs.registry import suite_of

        return self.spec.lazy_pixels and suite_of(job.task.env_id).lazy_pixels

    def env(self, job: Job):
        if job.task.name not in self.envs:
            import envs

            # The limit goes to gymnasium's TimeLimit too: one above the registered limit would be cut short there.
            limit = self.steps(job)
            env = envs.make(job.task.env_id, **job.task.kwargs, **self.spec.env_kwargs,
                            **({"lazy_pixels": True} if self._lazy(job) else {}),
                            **({} if limit is None else {"max_episode_steps": limit}))
            self.envs[job.task.name] = env
            self.tell(("env", self.actor_id, (job.task.name, observed_env(env))))  # for protocol.json
        return self.envs[job.task.name]

    def run(self, job: Job) -> EpisodeRecord:
        self.beat()  # the job arrived: building an env (first time per task) is a window of its own
        env = self.env(job)
        agent = self._episode_agent(env, job)
        start = time.perf_counter()
        video = _VideoRecorder(self.spec, self.chunks) if self.spec.save_video else None
        score = ImaginationScore(self.spec.imagination, self.chunks) if self.spec.imagination else None
        calls = None if self.chunks is None else self.chunks.num_model_calls
        episode = run_episode(
            env, agent, seed=job.seed, options=job.reset_options,
            max_steps=self.steps(job),  # null: the suite's limit (0 is refused by the config)
            observe=self._stop_if_manager_gone if score is None else _hooks(self._stop_if_manager_gone, score.observe),
            after_act=video if score is None else _hooks(video, score.after_act),
            lazy_pixels=self._lazy(job),
            hooks_read_pixels=lambda: any(hook.reads_pixels() for hook in (video, score) if hook is not None),
        )
        if self.predictor is not None:  # a policy server hears how its episode ended
            self.predictor.end_episode(episode.success)
        record = EpisodeRecord(
            task=job.task.name, trial=job.trial, seed=job.seed, success=episode.success, steps=episode.steps,
            reward=episode.reward, init_state_id=episode.info.get("init_state_id"),
            wall_time_s=time.perf_counter() - start, attempts=job.attempts, **(score.result() if score else {}),
            **self._cost(calls, episode.env_s),
        )
        if video is not None:
            relative = Path("videos") / task_slug(job.task.name) / f"{job.trial:05d}.mp4"
            video.frames.save(Path(self.spec.output_dir) / relative, fps=self.spec.video_fps)
            record.video = relative.as_posix()
        return record

    def _cost(self, calls_before: int | None, env_s: float) -> dict[str, Any]:
        """The episode's cost columns: model calls, the model's seconds and denoising steps (as the
        workers or the policy server measured them; None where nobody did) and the env's seconds."""
        cost = None if self.predictor is None else self.predictor.cost
        return {
            "model_calls": None if calls_before is None else self.chunks.num_model_calls - calls_before,
            "model_s": None if cost is None else cost.model_s,
            "denoise_steps": None if cost is None else cost.denoise_steps,
            "env_s": env_s,
        }

    def _stop_if_manager_gone(self, obs, info) -> None:
        # Checked on every observation, so a dead manager costs no model call and no env step.
        if os.getppid() != self.manager:  # re-parented: the manager was killed
            raise ManagerGone
        self.beat()

    def _episode_agent(self, env, job: Job):
        if self.agent is None:
            return make_agent("random", action_space=env.action_space, seed=job.seed)
        if self.chunks is not None:
            self.chunks.action_space = env.action_space
            if self.spec.latency is not None:  # simulated time runs at the env's control rate
                self.chunks.control_hz = env.unwrapped.control_hz
            self.predictor.begin_episode(job.seed, job.task.name)  # a policy server's client (re)connects here
        return self.agent

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        if self.predictor is not None:
            self.predictor.close()


def _hooks(*hooks):
    """One episode hook calling each of ``hooks`` (None ones skipped) in order."""
    hooks = [h for h in hooks if h is not None]

    def call(*args) -> None:
        for hook in hooks:
            hook(*args)

    return call


class _VideoRecorder:
    """An ``after_act`` hook: one frame per step, the cameras (and, with visualize_future_video,
    the model's imagined future beside them, at the point of the chunk being executed)."""

    def __init__(self, spec: ActorSpec, chunks: ChunkQueueAgent | None):
        self.spec, self.agent = spec, chunks  # None: an agent without a model (expert, random)
        self.frames = EpisodeVideo()
        self._calls = self._model_calls()
        self._since_plan = 0  # steps since the chunk being executed was predicted
        self._steps = 0  # steps seen: a frame is kept every spec.video_stride of them

    def _model_calls(self) -> int:
        return 0 if self.agent is None else self.agent.num_model_calls

    def __call__(self, obs, action) -> None:
        calls = self._model_calls()
        self._since_plan = 0 if calls != self._calls else self._since_plan + 1
        self._calls = calls
        if self._steps % self.spec.video_stride == 0:
            self.frames.add(self._frame(obs))
        self._steps += 1

    def reads_pixels(self) -> bool:
        """Whether the next observation becomes a frame."""
        return self._steps % self.spec.video_stride == 0

    def _frame(self, obs) -> np.ndarray:
        pixels = obs[PIXELS]
        cams = [self.spec.video_camera] if self.spec.video_camera else list(pixels)
        frame = tile([pixels[c] for c in cams])
        if not self.spec.visualize_future_video:
            return frame
        prediction = None if self.agent is None else self.agent.last_prediction.get(0)
        future = None if prediction is None else prediction.video
        if future is not None:
            # Frame 0 reconstructs the present; frame k shows k * stride steps later (the stride the model
            # was trained with when the imagination score knows it, else the chunk spread evenly).
            horizon = self.agent.action_horizon or len(prediction.actions)  # None: a remote chunk, executed whole
            stride = self.spec.imagination.frame_stride if self.spec.imagination else max(1, horizon // max(1, len(future) - 1))
            offset = 1 + self._since_plan // stride
            return future_panel(frame, future, offset)
        return future_panel(frame, None, 0)


def actor_main(actor_id: int, spec: ActorSpec, jobs, results, client) -> None:
    """Process entry point: run jobs (from the ``jobs`` pipe) until ``None``; send each record or
    error on the ``results`` pipe. Returns quietly once the manager is gone."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ignore_stop_signals()  # a terminal's Ctrl-C or a scheduler's SIGTERM reaches us too: the manager stops us
    actor = _Actor(actor_id, spec, client, Heartbeat(actor_id, results), results.send)
    try:
        while (job := jobs.recv()) is not None:
            try:
                message = episode_message(actor, actor_id, job)
            except ManagerGone:
                return
            results.send(message)
    except (EOFError, BrokenPipeError):  # the manager closed its ends of the pipes: it exited
        return
    finally:
        actor.close()


def rollout_actor(actor_id: int, spec: ActorSpec, client, tell, beat) -> _Actor:
    """An actor run by another host than actor_main (a Ray actor: wam_gym/eval/ray_actor_pool.py); ``tell`` gets
    the messages it sends besides its episodes' (what each new env is), ``beat`` is called on its progress."""
    return _Actor(actor_id, spec, client, beat=beat, tell=tell)


def episode_message(actor: _Actor, actor_id: int, job: Job) -> tuple[str, int, Any]:
    """Run ``job``: ``("done", id, record)``, ``("retry", id, (job, cause, why))`` when its policy server or the
    model worker holding its state was lost (no fault of the episode), or ``("error", id, (job, type, message,
    traceback))``. :class:`ManagerGone` goes up: nobody will collect the episode."""
    try:
        return ("done", actor_id, actor.run(job))
    except ManagerGone:
        raise
    except PolicyServerLost as exc:  # not the episode's fault: the manager reruns it
        return ("retry", actor_id, (job, "server_lost", str(exc)))
    except EpisodeLost as exc:  # its model worker died with the episode's state: rerun from the start
        return ("retry", actor_id, (job, "worker_lost", str(exc)))
    except Exception as exc:
        return ("error", actor_id, (job, type(exc).__name__, str(exc), traceback.format_exc()))
