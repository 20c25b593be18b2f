"""The training config (``python -m training``), as Hydra structured configs.

Top-level knob names are EasyWAM's (``batch_size``, ``gradient_accumulation_steps``,
``mixed_precision``, ``num_workers``, ``dataloader_*``, ``vae_micro_batch_size``); the model is
``model.*`` (a :class:`~agents.wam.config.MoTConfig`, chosen with ``model=<preset>``), task
recipes are ``task=<name>`` (training/conf/task/), infra profiles ``+infra=online|compile|cache``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.wam.config import MoTConfig
from training.data.augment import AugmentConfig


@dataclass
class DatasetConfig:
    root: str | None = None  # a LeRobot v3.0 dataset (python -m training.collect writes one)
    frame_stride: int | None = None  # env steps between predicted frames; null: action_horizon / num_future_frames
    # false: random augmentation (dataset.augment) of every clip. Static latent caches need
    # deterministic preprocessing (the cached latents must be what the online path computes),
    # so +infra=cache refuses false.
    deterministic: bool = True
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    cache_episodes: int = 256  # decoded (episode, camera) pairs kept per process: shuffled clips hit them


@dataclass
class LoraConfig:
    enabled: bool = False
    rank: int = 16
    alpha: float = 16.0
    dropout: float = 0.0
    experts: list[str] = field(default_factory=lambda: ["video", "action"])
    # Modules trained in full beside the adapters (e.g. a fresh action expert next to Wan weights).
    fully_trained: list[str] = field(default_factory=list)


@dataclass
class InfraConfig:
    """InternW0's infra profiles: what each turns on."""

    name: str = "none"
    sparse_video_decoding: bool = False  # decode only the frames a clip needs
    pinned_transfer: bool = False  # pinned host batches, non_blocking copies to the GPU
    compile: bool = False  # torch.compile the MoT forward/backward (cache: $WAM_COMPILE_CACHE)
    compile_mode: str | None = None
    latent_cache: bool = False  # read VAE latents from $WAM_LATENT_CACHE (complete coverage required)
    text_cache: bool = False  # read frozen text-encoder features from the cache; missing ones online


@dataclass
class PrecomputeConfig:
    max_samples: int | None = None  # caps text-cache generation (VAE caches always cover everything)


@dataclass
class TrainConfig:
    task: str = "custom"  # the recipe's name, for logs
    model: MoTConfig = field(default_factory=MoTConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    init_from: str | None = None  # a checkpoint to fine-tune (else the preset's weights)
    lora: LoraConfig = field(default_factory=LoraConfig)
    infra: InfraConfig = field(default_factory=InfraConfig)
    output_dir: str = "outputs/${task}"
    deepspeed: str | None = None  # zero1 | zero2 | zero2_offload | a JSON path; null: plain torch
    mixed_precision: str = "auto"  # auto: bf16 on GPU, fp32 on CPU
    batch_size: int = 8  # per process
    gradient_accumulation_steps: int = 1
    max_steps: int = 1000  # optimizer steps
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    grad_clip: float = 1.0
    video_dropout: float = 0.1  # batches trained action-only (for video_mode=action_only)
    action_weight: float = 1.0
    world_model_prob: float = 0.0  # rows trained with clean actions, to predict what follows (world-model mode)
    state_weight: float = 1.0  # of the next-state loss (models with action_expert.predict_state)
    vae_micro_batch_size: int | None = None
    seed: int = 0
    # DataLoader (EasyWAM's defaults and meaning)
    num_workers: int = 8
    dataloader_prefetch_factor: int = 16
    dataloader_persistent_workers: bool = True
    dataloader_pin_memory: bool = True
    dataloader_worker_threads: int = 1
    # bookkeeping
    log_every: int = 10
    save_every: int = 500
    keep_checkpoints: int = 2
    log_video_every: int = 0  # predicted frames to tensorboard every N steps (0: only at the end)
    resume: bool = True  # continue from output_dir's latest checkpoint if there is one
    # cache generation (scripts/video_cache.py)
    video_latent_cache: str | None = None  # generate: write the cache and exit
    video_latent_cache_fields: list[str] = field(default_factory=lambda: ["video", "text"])
    precompute: PrecomputeConfig = field(default_factory=PrecomputeConfig)

    def __post_init__(self) -> None:
        if not self.dataset.deterministic and (self.infra.latent_cache or self.video_latent_cache == "generate"):
            raise ValueError("dataset.deterministic=false (random augmentation) cannot use a static latent cache: "
                             "train with +infra=online or +infra=compile, or set dataset.deterministic=true")


def register_configs() -> None:
    """Put the schema and the model presets in Hydra's ConfigStore (``model=<preset>``)."""
    from hydra.core.config_store import ConfigStore

    from agents.wam.config import PRESETS

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name, make in PRESETS.items():
        store.store(group="model", name=name, node=make())
