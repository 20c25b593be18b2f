"""The evaluation config (``python -m wam_gym.eval``), as Hydra structured configs.

Group and knob names are EasyWAM's: ``EVALUATION.*`` for one episode and one model call,
``MULTIRUN.*`` for processes, GPUs and batching; ``REMOTE.*`` is the policy server ``EVALUATION.agent=remote``
asks (wam_gym/remote/config.py). ``python -m wam_gym.eval --cfg job`` prints the composed config.

Each group extends the one the policy server shares (wam_gym/model_call.py):
:class:`EvaluationConfig` adds the episode knobs (trials, stopping, outputs, videos, retries) to the
model-call knobs of :class:`~wam_gym.model_call.ModelCallConfig`, and :class:`MultirunConfig` adds the
rollout actors to the model workers' knobs. Users type both flat, as before
(``EVALUATION.num_inference_steps``, ``EVALUATION.num_trials``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.factory import CHUNK_AGENTS, check_strategy
from agents.realtime import Latency
from agents.realtime_strategies import STRATEGIES
from agents.wam.inference_config import InferenceConfig
from wam_gym.eval import protocols
from wam_gym.model_call import MODEL_CALL_RANGES, MODEL_WORKERS_RANGES, ModelCallConfig, ModelWorkersConfig
from wam_gym.remote.config import RemoteConfig
from wam_gym.utils.ranges import DAY_S, Range, check_ranges


@dataclass
class EvaluationConfig(ModelCallConfig):
    """EVALUATION.*: the model-call knobs (ModelCallConfig) and one episode."""

    # predicted future frames vs the frames the env then renders (PSNR/SSIM, and the copy-the-current-frame
    # baseline's; wam_gym/eval/imagination.py). null: when the frames are decoded anyway (visualize_future_video,
    # a joint-video model); true: decode them for it (agent=wam, joint models; costs a VAE decode per model call)
    imagination_score: bool | None = None
    num_trials: int = 10  # episodes per task; trial k uses seed + k
    # stop when the answer is known (wam_gym/eval/stopping.py: anytime-valid, so stopping early costs no validity)
    target_ci_halfwidth: float | None = None  # a task stops once its interval is this tight (e.g. 0.1); null: off
    compare_to: str | None = None  # another run's output_dir: stop once the paired comparison with it is decided
    stop_level: float = 0.95  # confidence of both stopping rules
    max_episode_steps: int | None = None  # null: the suite's limit
    # needed: envs render only the observations someone reads (replans, imagination targets, video frames);
    # every_step: every observation has its pixels. Outcomes are identical (envs/contract.py lazy_pixels)
    render: str = "needed"
    # the env keeps stepping while a model call runs (agents/realtime.py): the rest of the previous chunk, then
    # its last action held; the new chunk takes over when it arrives. false: the world waits for the model
    realtime: bool = False
    latency_ms: float | None = None  # realtime: each call takes this long in simulated time; null: its measured time
    # realtime: how arriving chunks are merged (agents/realtime_strategies.py): hold (the rest of the chunk, then its
    # last action), naive (no holding: calls early enough), ensemble (ACT's temporal ensembling), rtc (the WAM's
    # sampler continues the committed actions: real-time chunking, agents/rtc.py)
    realtime_strategy: str = "hold"
    # outputs
    output_dir: str = "evaluate_results/${benchmark}/${now:%Y%m%d-%H%M%S}"  # results, videos, tensorboard
    eval_save_video: bool = False  # an mp4 per episode
    video_camera: str | None = None  # null: all cameras side by side
    video_fps: int = 20  # of the saved mp4s
    video_stride: int = 1  # a video frame every this many env steps (1: full rate, every step rendered)
    tensorboard: bool = True  # success and cost scalars under output_dir/tensorboard
    max_attempts: int = 3  # tries per episode when workers die or the policy server (agent=remote) is lost
    # no progress (env step, model wait) this long: actor killed, episode retried; null: off (0 is refused)
    actor_stall_s: float | None = 600.0
    allow_resume_mismatch: bool = False  # resume an output_dir whose episodes ran with other settings (recorded)

    def __post_init__(self) -> None:
        if self.imagination_score and self.agent != "wam":
            raise ValueError(f"EVALUATION.imagination_score=true scores a WAM checkpoint's predicted frames; "
                             f"EVALUATION.agent={self.agent} predicts none it can score: set it to null or false")
        super().__post_init__()
        if self.realtime and self.agent not in CHUNK_AGENTS:
            raise ValueError(f"EVALUATION.realtime=true runs a model's chunks while it thinks; EVALUATION.agent="
                             f"{self.agent} calls no model: use one of {', '.join(CHUNK_AGENTS)}, or realtime=false")
        if self.latency_ms is not None and not self.realtime:
            raise ValueError(f"EVALUATION.latency_ms={self.latency_ms} sets the latency of real-time mode: add "
                             "EVALUATION.realtime=true, or drop it")
        if self.realtime_strategy not in STRATEGIES:
            raise ValueError(f"EVALUATION.realtime_strategy={self.realtime_strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.realtime_strategy != "hold" and not self.realtime:
            raise ValueError(f"EVALUATION.realtime_strategy={self.realtime_strategy} merges chunks that arrive while the "
                             "robot moves: add EVALUATION.realtime=true, or drop it")
        if self.realtime:
            check_strategy(self.realtime_strategy, self.agent)
        if self.render not in RENDER_MODES:
            raise ValueError(f"EVALUATION.render={self.render!r}: choose one of {', '.join(RENDER_MODES)}")
        check_ranges(self, "EVALUATION", EPISODE_RANGES)
        for name, value in (("output_dir", self.output_dir), ("compare_to", self.compare_to)):
            if value is not None and not str(value).strip():  # '' would write into (or compare with) the working directory
                raise ValueError(f"EVALUATION.{name}='' is empty: give a path (or leave it out for its default)")

    def latency(self) -> Latency | None:
        """Real-time mode's latency rule; None: synchronous."""
        return Latency(self.latency_ms) if self.realtime else None

    def inference(self) -> InferenceConfig:
        """The model-call knobs, nested as the policy takes them (imagination_score=true decodes the frames)."""
        inference = super().inference()
        if self.imagination_score:
            inference = dataclasses.replace(inference, visualize_future_video=True)
        return inference


@dataclass
class MultirunConfig(ModelWorkersConfig):
    """MULTIRUN.*: the model workers' knobs (ModelWorkersConfig) and the rollout actors."""

    env_num_per_worker: int = 2  # rollout actors (env processes) per model worker (actor_backend=local)
    task_sets: list[str] | None = None  # null: the benchmark's default sets
    # local: rollout actors are processes of this machine; ray: Ray actors on any node of the cluster
    # (MULTIRUN.ray_address) with actor_cpus CPUs and actor_resources free (docs/cluster.md)
    actor_backend: str = "local"
    num_actors: int | None = None  # actor_backend=ray: rollout actors; null: as many as the cluster's CPUs hold
    actor_cpus: float = 1.0  # actor_backend=ray: CPUs each rollout actor asks Ray for
    actor_resources: dict[str, float] = field(default_factory=dict)  # actor_backend=ray: more, e.g. {egl_gpu: 0.25}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.actor_backend not in ACTOR_BACKENDS:
            raise ValueError(f"MULTIRUN.actor_backend={self.actor_backend!r}: choose one of {ACTOR_BACKENDS}")
        if self.actor_backend == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("MULTIRUN.actor_backend=ray needs Ray on every node: pip install 'wam_gym[ray]'")
        if self.actor_backend != "ray" and (self.num_actors is not None or self.actor_resources):
            raise ValueError("MULTIRUN.num_actors and MULTIRUN.actor_resources place Ray actors: add "
                             "MULTIRUN.actor_backend=ray, or drop them (env_num_per_worker sets the local actors)")
        check_ranges(self, "MULTIRUN", ACTOR_RANGES)


RENDER_MODES = ("needed", "every_step")
SECONDS = "seconds"
EPISODE_RANGES = {  # every numeric knob EvaluationConfig adds
    "num_trials": Range(1, 100_000, note="episodes per task"),
    "target_ci_halfwidth": Range(0, 0.5, open_low=True, integer=False, note="e.g. 0.1: +-10 points", null="off"),
    "stop_level": Range(0.5, 1, open_high=True, integer=False, note="e.g. 0.95"),
    "max_episode_steps": Range(1, 1_000_000, null="the suite's limit"),
    "video_fps": Range(1, 1000),
    "video_stride": Range(1, 100_000, note="env steps per video frame"),
    "max_attempts": Range(1, 100, note="tries per episode"),
    "actor_stall_s": Range(0, DAY_S, open_low=True, integer=False, note=SECONDS, null="off"),
    "latency_ms": Range(0, integer=False, note="milliseconds of simulated time", null="each call's measured time"),
}
ACTOR_BACKENDS = ("local", "ray")
# knobs a release renamed -> their names now (the command line says so instead of "not in struct")
MOVED_KNOBS = {f"EVALUATION.remote_{knob}": f"REMOTE.{knob}"
               for knob in ("url", "protocol", "keys", "api_key", "timeout_s", "frames")}
ACTOR_RANGES = {
    "env_num_per_worker": Range(1, 1024, note="actors per model worker"),
    "num_actors": Range(1, 100_000, note="rollout actors on the Ray cluster", null="as many as its CPUs hold"),
    "actor_cpus": Range(0, 1024, open_low=True, integer=False, note="CPUs per rollout actor"),
}
# every numeric EVALUATION and MULTIRUN knob (tests/test_config_schema.py holds each field to one)
EVALUATION_RANGES = {**MODEL_CALL_RANGES, **EPISODE_RANGES}
MULTIRUN_RANGES = {**MODEL_WORKERS_RANGES, **ACTOR_RANGES}


@dataclass
class EvalConfig:
    """The whole ``python -m wam_gym.eval`` config."""

    benchmark: str = "metaworld"  # names the default task sets and the output folder
    # set by the config group protocol=NAME (wam_gym/eval/protocols.py: fastwam_libero, lingbot_va_libero): another
    # project's benchmark side, whose env kwargs, step limits, replan_steps, action_horizon, num_inference_steps and
    # seed it sets; an override departing from them is refused. A LingBot-VA needs one (its input convention).
    # null (protocol=none): ours (openpi's)
    protocol: str | None = None
    ckpt: str | None = None  # a checkpoint directory (EVALUATION.agent=wam)
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # extra gymnasium.make kwargs for every task
    EVALUATION: EvaluationConfig = field(default_factory=EvaluationConfig)  # one episode and one model call
    MULTIRUN: MultirunConfig = field(default_factory=MultirunConfig)  # processes, GPUs and batching
    REMOTE: RemoteConfig = field(default_factory=RemoteConfig)  # the policy server agent=remote asks

    def __post_init__(self) -> None:
        protocols.check(self)  # the protocol group's settings hold, or an error naming the override that departs


def register() -> None:
    """The schema ``eval.yaml`` builds on, and the ``protocol`` group, in Hydra's config store."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="eval_schema", node=EvalConfig)
    protocols.register_group(store)


def compose(overrides: list[str] | tuple[str, ...] = ()) -> EvalConfig:
    """The config ``python -m wam_gym.eval OVERRIDES...`` runs with (``["protocol=fastwam_libero",
    "EVALUATION.num_trials=5"]``), for Python callers: the same composition, the same checks, and an override
    that does not compose is the command line's one-line error, as a ValueError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from wam_gym.utils.cli import config_error

    register()
    try:
        with initialize_config_dir(str(Path(__file__).resolve().parents[1] / "conf"), version_base=None):
            return OmegaConf.to_object(hydra_compose("eval", overrides=list(overrides)))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ValueError(config_error(exc, "python -m wam_gym.eval", MOVED_KNOBS)) from exc
