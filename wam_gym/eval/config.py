"""The evaluation config (``python -m wam_gym.eval``), as Hydra structured configs.

Group and knob names are EasyWAM's: ``EVALUATION.*`` for one episode and one model call,
``MULTIRUN.*`` for processes, GPUs and batching. ``python -m wam_gym.eval --cfg job`` prints
the composed config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.wam.policy import InferenceConfig
from wam_gym.broker import BrokerConfig

AGENTS = ("wam", "expert", "random")


@dataclass
class EvaluationConfig:
    agent: str = "wam"  # wam (needs ckpt) | expert (scripted) | random: baselines run the same way
    num_trials: int = 10
    seed: int = 0  # trial k uses seed + k
    max_episode_steps: int | None = None  # null: the suite's limit
    # one model call
    num_inference_steps: int = 10
    sampler: str = "unipc"
    shift: float = 5.0
    action_horizon: int | None = None  # null: the model's
    replan_steps: int | None = None  # null: action_horizon
    inference_cross_kv_reuse: bool = True
    torch_compile: bool = False
    torch_compile_mode: str | None = "reduce-overhead"
    torch_compile_backend: str = "inductor"
    torch_compile_fullgraph: bool = False
    torch_compile_dynamic: bool | None = None
    torch_compile_options: dict[str, Any] | None = None
    video_mode: str | None = None  # joint | action_only; null: the checkpoint's
    dataset_stats_path: str | None = None  # null: the checkpoint's dataset_stats.json
    # outputs
    output_dir: str = "evaluate_results/${benchmark}/${now:%Y%m%d-%H%M%S}"
    eval_save_video: bool = False  # an mp4 per episode
    visualize_future_video: bool = False  # the predicted future beside the rollout
    video_camera: str | None = None  # null: all cameras side by side
    video_fps: int = 20
    tensorboard: bool = True
    max_attempts: int = 3  # tries per episode when workers die

    def inference(self, prompt_cache_size: int) -> InferenceConfig:
        return InferenceConfig(
            num_inference_steps=self.num_inference_steps, sampler=self.sampler, shift=self.shift,
            inference_cross_kv_reuse=self.inference_cross_kv_reuse,
            visualize_future_video=self.visualize_future_video,
            torch_compile=self.torch_compile, torch_compile_mode=self.torch_compile_mode,
            torch_compile_backend=self.torch_compile_backend, torch_compile_fullgraph=self.torch_compile_fullgraph,
            torch_compile_dynamic=self.torch_compile_dynamic, torch_compile_options=self.torch_compile_options,
            seed=self.seed, prompt_cache_size=prompt_cache_size,
        )


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
