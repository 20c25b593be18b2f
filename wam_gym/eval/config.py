"""The evaluation config (``python -m wam_gym.eval``), as Hydra structured configs.

Group and knob names are EasyWAM's: ``EVALUATION.*`` for one episode and one model call,
``MULTIRUN.*`` for processes, GPUs and batching. ``python -m wam_gym.eval --cfg job`` prints
the composed config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from agents.wam.inference_config import InferenceConfig
from wam_gym.broker import BrokerConfig

AGENTS = ("wam", "expert", "random")


@dataclass
class EvaluationConfig(InferenceConfig):
    """EVALUATION.*: one model call (the InferenceConfig fields: num_inference_steps, sampler,
    shift, inference_cross_kv_reuse, visualize_future_video, torch_compile*, seed) and one episode."""

    agent: str = "wam"  # wam (needs ckpt) | expert (scripted) | random: baselines run the same way
    num_trials: int = 10  # trial k uses seed + k
    max_episode_steps: int | None = None  # null: the suite's limit
    action_horizon: int | None = None  # null: the model's
    replan_steps: int | None = None  # null: action_horizon
    video_mode: str | None = None  # joint | action_only; null: the checkpoint's
    dataset_stats_path: str | None = None  # null: the checkpoint's dataset_stats.json
    # outputs
    output_dir: str = "evaluate_results/${benchmark}/${now:%Y%m%d-%H%M%S}"
    eval_save_video: bool = False  # an mp4 per episode
    video_camera: str | None = None  # null: all cameras side by side
    video_fps: int = 20
    tensorboard: bool = True
    max_attempts: int = 3  # tries per episode when workers die

    def __post_init__(self) -> None:
        getattr(super(), "__post_init__", lambda: None)()
        try:  # checked here, not in a model worker after the model has loaded
            self.sampler_config()
        except ValueError as exc:
            raise ValueError(f"EVALUATION: {exc}") from None

    def inference(self) -> InferenceConfig:
        return InferenceConfig(**{f.name: getattr(self, f.name) for f in fields(InferenceConfig)})


@dataclass
class MultirunConfig(BrokerConfig):
    env_num_per_worker: int = 2  # rollout actors (env processes) per model worker
    prompt_cache_size: int = 64  # prompt embeddings cached per model worker
    task_sets: list[str] | None = None  # null: the benchmark's default sets


@dataclass
class EvalConfig:
    benchmark: str = "metaworld"  # names the default task sets and the output folder
    ckpt: str | None = None  # a checkpoint directory (EVALUATION.agent=wam)
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # extra gymnasium.make kwargs for every task
    EVALUATION: EvaluationConfig = field(default_factory=EvaluationConfig)
    MULTIRUN: MultirunConfig = field(default_factory=MultirunConfig)
