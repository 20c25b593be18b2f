"""The evaluation config (``python -m wam_gym.eval``), as Hydra structured configs.

Group and knob names are EasyWAM's: ``EVALUATION.*`` for one episode and one model call,
``MULTIRUN.*`` for processes, GPUs and batching. ``python -m wam_gym.eval --cfg job`` prints
the composed config.

The model-call knobs stay flat here, as users type them (``EVALUATION.num_inference_steps``,
``EVALUATION.torch_compile_mode``, ...); their defaults come from the configs that own them
(:class:`~agents.wam.inference_config.SamplerConfig`, :class:`~agents.wam.compile.CompileConfig`,
:class:`~agents.wam.inference_config.InferenceConfig`), and :meth:`EvaluationConfig.inference`
nests them through ``InferenceConfig.from_knobs``, the one place that maps the flat names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agents.wam.compile import CompileConfig
from agents.wam.inference_config import KNOBS, InferenceConfig, SamplerConfig
from wam_gym.broker import BROKER_RANGES, BrokerConfig
from wam_gym.eval import protocols
from wam_gym.utils.ranges import Range, check_ranges


@dataclass
class EvaluationConfig:
    """EVALUATION.*: one model call (the flat inference knobs) and one episode."""

    agent: str = "wam"  # wam (needs ckpt) | python (EVALUATION.policy) | remote (a policy server) | expert | random
    policy: str | None = None  # agent=python: pkg.module:factory, factory(device) builds a Policy (agents/policy.py)
    remote_url: str | None = None  # agent=remote: ws://host:port of an openpi or vla-eval policy server
    remote_protocol: str = "openpi"  # agent=remote: openpi | vla-eval
    remote_keys: dict[str, str] = field(default_factory=dict)  # agent=remote: {contract key: wire key} (wam_gym/keymap.py)
    remote_api_key: str | None = None  # agent=remote: sent as openpi's "Authorization: Api-Key" header
    remote_timeout_s: float = 300.0  # agent=remote: longest wait for one answer, and for the server to come back
    # one model call (InferenceConfig, see inference())
    num_inference_steps: int = SamplerConfig.num_inference_steps  # denoising steps: model calls per chunk
    sampler: str | None = SamplerConfig.name  # flow_euler | unipc | dpmpp | ddim; null: the model's (MoT unipc, FastWAM Euler)
    # flow shift; 1.0 = none, above 1 = more steps at high noise; null: the model's (MoT 5.0, FastWAM its schedules')
    shift: float | None = SamplerConfig.shift
    inference_cross_kv_reuse: bool = InferenceConfig.inference_cross_kv_reuse  # text K/V once per call (same outputs)
    visualize_future_video: bool = InferenceConfig.visualize_future_video  # decode the predicted future frames
    future_video: str = InferenceConfig.future_video  # sample | expected: which predicted future is decoded
    # predicted future frames vs the frames the env then renders (PSNR/SSIM, and the copy-the-current-frame
    # baseline's; wam_gym/eval/imagination.py). null: when the frames are decoded anyway (visualize_future_video,
    # a joint-video model); true: decode them for it (agent=wam, joint models; costs a VAE decode per model call)
    imagination_score: bool | None = None
    torch_compile: bool = CompileConfig.enabled  # torch.compile the denoiser (first call compiles)
    torch_compile_mode: str | None = CompileConfig.mode  # torch.compile mode; reduce-overhead may use CUDA graphs
    torch_compile_backend: str = CompileConfig.backend  # torch.compile backend
    torch_compile_fullgraph: bool = CompileConfig.fullgraph  # fail on graph breaks
    torch_compile_dynamic: bool | None = CompileConfig.dynamic  # dynamic shapes; null: torch decides
    torch_compile_options: dict[str, Any] = field(default_factory=dict)  # backend options ({}: none); replace the mode
    torch_compile_batch_sizes: list[int] = field(default_factory=list)  # pad calls to these sizes, compiled at load ([]: off)
    seed: int = InferenceConfig.seed  # of the sampling noise, and trial k's env seed is seed + k
    # one episode
    # a named evaluation protocol (wam_gym/eval/protocols.py: fastwam_libero): fixes the env kwargs, step limits,
    # replan_steps, action_horizon, num_inference_steps and seed as another project evaluates; null: ours (openpi's)
    protocol: str | None = None
    num_trials: int = 10  # episodes per task; trial k uses seed + k
    # stop when the answer is known (wam_gym/eval/stopping.py: anytime-valid, so stopping early costs no validity)
    target_ci_halfwidth: float | None = None  # a task stops once its interval is this tight (e.g. 0.1); null: off
    compare_to: str | None = None  # another run's output_dir: stop once the paired comparison with it is decided
    stop_level: float = 0.95  # confidence of both stopping rules
    max_episode_steps: int | None = None  # null: the suite's limit
    action_horizon: int | None = None  # null: the model's
    replan_steps: int | None = None  # null: action_horizon
    video_mode: str | None = None  # joint | action_only; null: the checkpoint's
    dataset_stats_path: str | None = None  # null: the checkpoint's dataset_stats.json (required when it has none)
    allow_image_resize: bool = False  # let env_kwargs.image_size differ from the checkpoint's (frames get resized)
    # outputs
    output_dir: str = "evaluate_results/${benchmark}/${now:%Y%m%d-%H%M%S}"  # results, videos, tensorboard
    eval_save_video: bool = False  # an mp4 per episode
    video_camera: str | None = None  # null: all cameras side by side
    video_fps: int = 20  # of the saved mp4s
    tensorboard: bool = True  # success and cost scalars under output_dir/tensorboard
    max_attempts: int = 3  # tries per episode when workers die or the policy server (agent=remote) is lost
    # no progress (env step, model wait) this long: actor killed, episode retried; null: off (0 is refused)
    actor_stall_s: float | None = 600.0
    allow_resume_mismatch: bool = False  # resume an output_dir whose episodes ran with other settings (recorded)

    def __post_init__(self) -> None:
        if self.imagination_score and self.agent != "wam":
            raise ValueError(f"EVALUATION.imagination_score=true scores a WAM checkpoint's predicted frames; "
                             f"EVALUATION.agent={self.agent} predicts none it can score: set it to null or false")
        try:  # checked here, not in a model worker after the model has loaded
            self.inference()
        except ValueError as exc:
            raise ValueError(f"EVALUATION: {exc}") from None
        check_ranges(self, "EVALUATION", EVALUATION_RANGES)  # each would hang, crash an actor, or mean another thing
        protocols.named(self.protocol)  # a known name (what it fixes is applied by EvalConfig, which has env_kwargs)

    def inference(self) -> InferenceConfig:
        """The model-call knobs, nested as the policy takes them (imagination_score=true decodes the frames)."""
        inference = InferenceConfig.from_knobs(**{name: getattr(self, name) for name in KNOBS})
        if self.imagination_score:
            inference = dataclasses.replace(inference, visualize_future_video=True)
        return inference


@dataclass
class MultirunConfig(BrokerConfig):
    """MULTIRUN.*: the broker's knobs (BrokerConfig) and the rollout actors."""

    env_num_per_worker: int = 2  # rollout actors (env processes) per model worker
    prompt_cache_size: int = 64  # prompt embeddings cached per model worker
    task_sets: list[str] | None = None  # null: the benchmark's default sets

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ranges(self, "MULTIRUN", MULTIRUN_RANGES)


SECONDS = "seconds"
EVALUATION_RANGES = {  # every numeric EVALUATION knob (tests/test_config_schema.py holds it to that)
    "remote_timeout_s": Range(0, open_low=True, integer=False, note=SECONDS),
    "num_inference_steps": Range(1, note="denoising steps per call"),
    "shift": Range(0, open_low=True, integer=False, null="the model's own"),
    "seed": Range(0, note="trial k uses seed + k"),
    "num_trials": Range(1, note="episodes per task"),
    "target_ci_halfwidth": Range(0, 0.5, open_low=True, integer=False, note="e.g. 0.1: +-10 points", null="off"),
    "stop_level": Range(0.5, 1, open_high=True, integer=False, note="e.g. 0.95"),
    "max_episode_steps": Range(1, null="the suite's limit"),
    "action_horizon": Range(1, null="the model's"),
    "replan_steps": Range(1, null="action_horizon"),
    "video_fps": Range(1),
    "max_attempts": Range(1, note="tries per episode"),
    "actor_stall_s": Range(0, open_low=True, integer=False, note=SECONDS, null="off"),
}
MULTIRUN_RANGES = {  # every numeric MULTIRUN knob: the broker's, then the actors'
    **BROKER_RANGES,
    "env_num_per_worker": Range(1, note="actors per model worker"),
    "prompt_cache_size": Range(0, note="0: no cache"),
}


@dataclass
class EvalConfig:
    """The whole ``python -m wam_gym.eval`` config."""

    benchmark: str = "metaworld"  # names the default task sets and the output folder
    ckpt: str | None = None  # a checkpoint directory (EVALUATION.agent=wam)
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # extra gymnasium.make kwargs for every task
    EVALUATION: EvaluationConfig = field(default_factory=EvaluationConfig)  # one episode and one model call
    MULTIRUN: MultirunConfig = field(default_factory=MultirunConfig)  # processes, GPUs and batching

    def __post_init__(self) -> None:
        protocols.apply(self)  # EVALUATION.protocol's settings, or an error naming a knob that contradicts them
