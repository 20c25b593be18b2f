"""What an evaluation will run, decided and checked before anything starts or is written.

:class:`EvalPlan` resolves the task sets into tasks and the trials into jobs, applies the named
protocol's suite and init-state rules, reads the checkpoint (agent=wam), the python policy or the
policy server's settings, and composes protocol.json's record. Every problem found here costs the
user nothing: no process has started, no file has been written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from agents.factory import AGENTS
from wam_gym.eval import preflight, protocols
from wam_gym.eval.actor import ActorSpec
from wam_gym.eval.config import EvalConfig
from wam_gym.eval.imagination import ImaginationSpec, imagination_spec
from wam_gym.eval.results import ResultStore
from wam_gym.eval.run_protocol import RunProtocol, agent_identity, benchmark_protocol, reference_outcomes
from wam_gym.eval.stopping import StoppingRule
from wam_gym.eval.tasks import BENCHMARK_TASK_SETS, plan, resolve_tasks
from wam_gym.remote import RemoteSettings
from wam_gym.utils import run_dir


class EvalPlan:
    """The tasks, the jobs, the envs' kwargs and the agent an evaluation runs (see the module doc)."""

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
        # the named protocol (its knobs and env kwargs are already in config): its suite, its init-state rule
        self.named_protocol = protocols.named(config.protocol)
        protocols.check_plan(self.named_protocol, self.tasks, self.jobs)
        # each task's step limit (per task: a protocol may give each suite its own)
        self.episode_steps = {task.name: protocols.episode_steps(ev, self.named_protocol, task.env_id)
                              for task in self.tasks}
        self.output_dir = Path(ev.output_dir).expanduser()
        run_dir.check_writable(self.output_dir, "EVALUATION.output_dir")
        self.store = ResultStore(self.output_dir)
        self.env_kwargs = dict(config.env_kwargs)
        self.ckpt: Path | None = None  # absolute, ~ expanded
        self.stats: Path | None = None  # the dataset statistics the model workers un-normalise with
        self.image_resized = False
        self.imagination: ImaginationSpec | None = None  # the scorer's settings, when predicted frames are scored
        self._check_agent()
        preflight.check_video_camera(ev.video_camera, self.tasks, self.env_kwargs)
        self.protocol = RunProtocol(self.output_dir, benchmark_protocol(config, self.tasks, self.env_kwargs),
                                    agent_identity(config, self.ckpt, self.stats))
        if ev.compare_to:
            self.protocol.reference, self.stopping.reference = reference_outcomes(
                ev.compare_to, self.protocol.record, self.output_dir)

    @property
    def keys(self) -> list[tuple[str, int]]:
        """Every planned episode's (task, trial), in the order they start."""
        return [job.key for job in self.jobs]

    def _check_agent(self) -> None:
        ev = self.config.EVALUATION
        if ev.agent == "wam":
            self._check_checkpoint()
        elif ev.agent == "python":
            preflight.check_python_policy(ev)
        elif ev.agent == "remote":
            preflight.check_remote(self.config.REMOTE, self.tasks, self.env_kwargs)

    def _check_checkpoint(self) -> None:
        """The checkpoint, its statistics and the env geometry it needs, all read here, in the
        manager: a model worker would find a problem only after minutes of loading."""
        ev = self.config.EVALUATION
        protocols.check_checkpoint_inputs(self.named_protocol, self.config.ckpt)  # first: the one fix that matters
        self.ckpt, model, self.stats = preflight.wam_checkpoint(self.config.ckpt, ev, self.named_protocol)
        self.image_resized = preflight.check_image_size(self.env_kwargs, model, ev.allow_image_resize)
        preflight.check_cameras(self.env_kwargs, model)
        self.imagination = imagination_spec(ev, model, self.ckpt)
        # The envs render what the checkpoint was trained on (cameras, image size) unless told otherwise.
        self.env_kwargs = {"cameras": list(model.cameras), "image_size": list(model.image_size), **self.env_kwargs}

    def actor_spec(self, remembers_episodes: bool = False, server_model: Any = None) -> ActorSpec:
        """What every rollout actor of this run is told; ``remembers_episodes`` as the broker's model declares,
        ``server_model`` what the policy server said it serves when the run began (agent=remote)."""
        ev = self.config.EVALUATION
        return ActorSpec(
            agent=ev.agent, output_dir=str(self.output_dir), env_kwargs=self.env_kwargs,
            episode_steps=self.episode_steps, action_horizon=ev.action_horizon, replan_steps=ev.replan_steps,
            save_video=ev.eval_save_video, visualize_future_video=ev.visualize_future_video,
            video_camera=ev.video_camera, video_fps=ev.video_fps, video_stride=ev.video_stride,
            lazy_pixels=ev.render == "needed", latency=ev.latency(), remembers_episodes=remembers_episodes,
            realtime_strategy=ev.realtime_strategy,
            remote=dataclasses.replace(RemoteSettings.from_config(self.config.REMOTE, self.tasks),
                                       expected_model=server_model)
            if ev.agent == "remote" else None,
            imagination=self.imagination,
        )


def _redacted(composed: dict) -> dict:
    """The composed config as results.json keeps it, without the policy server's api key."""
    remote = composed.get("REMOTE")
    if isinstance(remote, dict) and remote.get("api_key"):
        return {**composed, "REMOTE": {**remote, "api_key": "<redacted>"}}
    return composed
