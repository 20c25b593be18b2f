"""The knobs of one model call, shared by evaluation and the policy server.

``python -m wam_gym.eval`` and ``python -m wam_gym.serve`` run a model the same way, so what
a model call reads has one owner here: :class:`ModelCallConfig` (what answers, and how it
samples, compiles and chunks) and :class:`ModelWorkersConfig` (the broker's workers and their
prompt cache). Evaluation's groups extend them with the episode knobs only it reads
(wam_gym/eval/config.py); the server takes these as they are, so an episode knob given to the
server is refused (wam_gym/serve/config.py) instead of being silently ignored.

Users spell them as EasyWAM does, flat under ``EVALUATION.`` and ``MULTIRUN.``
(``EVALUATION.num_inference_steps``, ``EVALUATION.torch_compile_mode``, ``MULTIRUN.num_gpus``):
the grouping is behind the names, not in them. :meth:`ModelCallConfig.inference` nests the flat
knobs through ``InferenceConfig.from_knobs``, the one place that maps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.rtc import RTCConfig
from agents.wam.compile import CompileConfig
from agents.wam.inference_config import KNOBS, InferenceConfig, SamplerConfig
from wam_gym.broker import BROKER_RANGES, BrokerConfig
from wam_gym.utils.ranges import Range, check_ranges


@dataclass
class ModelCallConfig:
    """EVALUATION.* that one model call reads: what answers, and how it samples, compiles and chunks."""

    agent: str = "wam"  # wam (needs ckpt) | python (EVALUATION.policy) | remote (a policy server) | expert | random
    policy: str | None = None  # agent=python: pkg.module:factory, factory(device) builds a Policy (agents/policy.py)
    dataset_stats_path: str | None = None  # null: the checkpoint's dataset_stats.json (required when it has none)
    video_mode: str | None = None  # joint | action_only; null: the checkpoint's
    allow_image_resize: bool = False  # let env_kwargs.image_size differ from the checkpoint's (frames get resized)
    action_horizon: int | None = None  # actions used of each predicted chunk; null: the model's
    replan_steps: int | None = None  # actions executed before the next model call; null: action_horizon
    # the sampler (InferenceConfig, see inference())
    num_inference_steps: int = SamplerConfig.num_inference_steps  # denoising steps: model calls per chunk
    sampler: str | None = SamplerConfig.name  # flow_euler | unipc | dpmpp | ddim; null: the model's (MoT unipc, FastWAM Euler)
    # flow shift; 1.0 = none, above 1 = more steps at high noise; null: the model's (MoT 5.0, FastWAM its schedules')
    shift: float | None = SamplerConfig.shift
    seed: int = InferenceConfig.seed  # of the sampling noise, and (eval) trial k's env seed is seed + k
    inference_cross_kv_reuse: bool = InferenceConfig.inference_cross_kv_reuse  # text K/V once per call (same outputs)
    visualize_future_video: bool = InferenceConfig.visualize_future_video  # decode the predicted future frames
    future_video: str = InferenceConfig.future_video  # sample | expected: which predicted future is decoded
    # real-time chunking (EVALUATION.realtime_strategy=rtc; agents/rtc.py), the paper's defaults: the guidance weight's clip
    rtc_max_guidance_weight: float = RTCConfig.max_guidance_weight
    rtc_schedule: str = RTCConfig.schedule  # the soft mask past the committed actions: exp (the paper's) | linear | ones | zeros
    rtc_execution_horizon: int | None = RTCConfig.execution_horizon  # last s actions free; null: past the old chunk's end
    # torch.compile of the denoiser
    torch_compile: bool = CompileConfig.enabled  # torch.compile the denoiser (first call compiles)
    torch_compile_mode: str | None = CompileConfig.mode  # torch.compile mode; reduce-overhead may use CUDA graphs
    torch_compile_backend: str = CompileConfig.backend  # torch.compile backend
    torch_compile_fullgraph: bool = CompileConfig.fullgraph  # fail on graph breaks
    torch_compile_dynamic: bool | None = CompileConfig.dynamic  # dynamic shapes; null: torch decides
    torch_compile_options: dict[str, Any] = field(default_factory=dict)  # backend options ({}: none); replace the mode
    torch_compile_batch_sizes: list[int] = field(default_factory=list)  # pad calls to these sizes, compiled at load ([]: off)

    def __post_init__(self) -> None:
        try:  # checked here, not in a model worker after the model has loaded
            self.inference()
        except ValueError as exc:
            raise ValueError(f"EVALUATION: {exc}") from None
        check_ranges(self, "EVALUATION", MODEL_CALL_RANGES)  # each would hang, crash an actor, or mean another thing

    def inference(self) -> InferenceConfig:
        """The sampler and compile knobs, nested as the policy takes them."""
        return InferenceConfig.from_knobs(**{name: getattr(self, name) for name in KNOBS})


@dataclass
class ModelWorkersConfig(BrokerConfig):
    """MULTIRUN.* that the model workers read: the broker's knobs (BrokerConfig) and the prompt cache."""

    prompt_cache_size: int = 64  # prompt embeddings cached per model worker

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ranges(self, "MULTIRUN", MODEL_WORKERS_RANGES)


MODEL_CALL_RANGES = {  # every numeric ModelCallConfig knob (tests/test_config_schema.py holds it to that)
    "action_horizon": Range(1, 100_000, null="the model's"),
    "replan_steps": Range(1, 100_000, null="action_horizon"),
    "num_inference_steps": Range(1, 1000, note="denoising steps per call"),
    "shift": Range(0, open_low=True, integer=False, null="the model's own"),
    "seed": Range(0, 2**31 - 1, note="trial k uses seed + k"),
    "rtc_max_guidance_weight": Range(0, 1000, open_low=True, integer=False, note="the paper's 5"),
    "rtc_execution_horizon": Range(0, 100_000, null="the actions past the current chunk's end"),
}
MODEL_WORKERS_RANGES = {**BROKER_RANGES, "prompt_cache_size": Range(0, 1_000_000, note="0: no cache")}

