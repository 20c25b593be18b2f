"""The training config (``python -m training``), as Hydra structured configs.

Top-level knob names are EasyWAM's (``batch_size``, ``gradient_accumulation_steps``,
``mixed_precision``, ``num_workers``, ``dataloader_*``, ``vae_micro_batch_size``); the model is
``model.*`` (a :class:`~agents.wam.mot.config.MoTConfig`, FastWAM's ``FastWAMConfig`` or LingBot-VA's
``LingBotVAConfig``, chosen with ``model=<preset>``: tiny, wan22_ti2v_5b, wan21_t2v_1_3b, fastwam, fastwam_tiny,
lingbot_va, lingbot_va_libero_tiny), task
recipes are ``task=<name>`` (training/conf/task/), infra profiles ``+infra=online|compile|cache``.

Groups and their owners: the engine knobs (``deepspeed``, ``mixed_precision``, ``batch_size``,
``gradient_accumulation_steps``, ``max_steps``, ``lr``, ``weight_decay``, ``betas``, ``grad_clip``,
``warmup_steps``, ``lr_schedule``) are :class:`~training.engine.config.EngineConfig`'s, which
:class:`TrainConfig` extends so they stay top-level on the command line and the config goes to
``make_engine`` as it is; ``lora.*`` is :class:`~agents.wam.lora.LoraSettings`; ``infra.compile.*``
is :class:`~agents.wam.compile.CompileConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agents.wam.compile import CompileConfig
from agents.wam.lora import LoraSettings
from agents.wam.mot.config import MoTConfig
from training.data.augment import AugmentConfig
from training.engine.config import EngineConfig, require_int


@dataclass
class DatasetConfig:
    """``dataset.*``: which demos, and how clips are cut from them."""

    root: str | None = None  # a LeRobot v3.0 dataset (python -m training.collect writes one)
    frame_stride: int | None = None  # env steps between predicted frames; null: action_horizon / num_future_frames
    # false: random augmentation (dataset.augment) of every clip. Static latent caches need
    # deterministic preprocessing (the cached latents must be what the online path computes),
    # so +infra=cache refuses false.
    deterministic: bool = True
    augment: AugmentConfig = field(default_factory=AugmentConfig)  # the random ops of deterministic=false
    cache_episodes: int = 256  # decoded (episode, camera) pairs kept per process: shuffled clips hit them
    # state and actions into the model's range: null (state mean_std, actions min_max) | mean_std | min_max |
    # quantiles (q01..q99 -> -1..1, LeRobot's QUANTILES) | fastwam_min_max (FastWAM's min/max, state and actions
    # clamped to +-5); recorded in the checkpoint for evaluation
    normalization: str | None = None

    def __post_init__(self) -> None:
        from agents.wam.normalization import check_mode

        check_mode(self.normalization)


@dataclass
class InfraConfig:
    """``infra.*``: InternW0's infra profiles (``+infra=online|compile|cache``), what each turns on."""

    name: str = "none"  # the profile: none | online | compile | cache
    pinned_transfer: bool = False  # pinned host batches, non_blocking copies to the GPU
    # torch.compile of the MoT forward/backward (kernels cached in $WAM_COMPILE_CACHE); no CUDA graphs by default.
    compile: CompileConfig = field(default_factory=lambda: CompileConfig(mode=None))
    latent_cache: bool = False  # read VAE latents from $WAM_LATENT_CACHE (complete coverage required)
    text_cache: bool = False  # read frozen text-encoder features from the cache; missing ones online


@dataclass
class PrecomputeConfig:
    """``precompute.*``: cache generation (scripts/video_cache.py)."""

    max_samples: int | None = None  # caps text-cache generation (VAE caches always cover everything)


# Beyond these a value is a typo, and would be found only as a machine out of processes, threads or disk.
UPPER_BOUNDS = {"num_workers": 256, "dataloader_prefetch_factor": 1024, "dataloader_worker_threads": 256,
                "keep_checkpoints": 10_000, "seed": 2**31 - 1, "dataset.cache_episodes": 1_000_000}


@dataclass
class TrainConfig(EngineConfig):
    """The whole ``python -m training`` config; the engine knobs (EngineConfig) are its first fields."""

    task: str = "custom"  # the recipe's name, for logs
    # the WAM: model=<preset> (MoT: tiny | wan22_ti2v_5b | wan21_t2v_1_3b; FastWAM: fastwam | fastwam_tiny;
    # LingBot-VA: lingbot_va | lingbot_va_libero_tiny), then model.* overrides; null: the tiny MoT. Typed Any
    # because the presets are of several config classes.
    model: Any = None
    dataset: DatasetConfig = field(default_factory=DatasetConfig)  # the demos
    init_from: str | None = None  # a checkpoint to fine-tune (else the preset's weights)
    lora: LoraSettings = field(default_factory=lambda: LoraSettings(enabled=False))  # adapters (lora.enabled=true)
    infra: InfraConfig = field(default_factory=InfraConfig)  # +infra=online|compile|cache
    output_dir: str = "outputs/${task}"  # checkpoints/, checkpoint/ (the final WAM), tensorboard/, train_config.json
    video_dropout: float = 0.1  # batches trained action-only (for video_mode=action_only)
    action_weight: float = 1.0  # of the action loss
    world_model_prob: float = 0.0  # rows trained with clean actions, to predict what follows (world-model mode)
    state_weight: float = 1.0  # of the next-state loss (models with action_expert.predict_state)
    vae_micro_batch_size: int | None = None  # EasyWAM's name for model.vae_micro_batch_size (chunked VAE; null: whole batch)
    seed: int = 0  # model init, data order, loss noise and augmentation
    # DataLoader (EasyWAM's defaults and meaning)
    num_workers: int = 8  # loader processes; 0 loads in the training process
    dataloader_prefetch_factor: int = 16  # batches queued per worker (with workers only)
    dataloader_persistent_workers: bool = True  # keep workers between epochs (with workers only)
    dataloader_pin_memory: bool = True  # page-locked batches for faster copies (CUDA only)
    dataloader_worker_threads: int = 1  # torch CPU threads inside each worker
    # bookkeeping
    log_every: int = 10  # scalars to tensorboard and the progress line every N optimizer steps
    save_every: int = 500  # a resumable checkpoint every N optimizer steps (and at the end)
    keep_checkpoints: int = 2  # newest checkpoints kept under output_dir/checkpoints
    log_video_every: int = 0  # predicted frames to tensorboard every N steps (0: only at the end)
    resume: bool = True  # continue from output_dir's latest checkpoint if there is one; false: start over (deletes it)
    # resume although result-changing settings (data, model, optimizer, seed) differ from the saved
    # train_config.json; the new ones go to train_config.resumed-N.json (the original is never overwritten)
    allow_resume_mismatch: bool = False
    # cache generation (scripts/video_cache.py)
    video_latent_cache: str | None = None  # generate: write the cache and exit
    video_latent_cache_fields: list[str] = field(default_factory=lambda: ["video", "text"])  # what to cache
    precompute: PrecomputeConfig = field(default_factory=PrecomputeConfig)  # limits of cache generation

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model is None:
            self.model = MoTConfig()
        self._own_vae_micro_batch_size()
        self._check_ranges()
        if not self.dataset.deterministic and (self.infra.latent_cache or self.video_latent_cache == "generate"):
            raise ValueError("dataset.deterministic=false (random augmentation) cannot use a static latent cache: "
                             "train with +infra=online or +infra=compile, or set dataset.deterministic=true")


    def _check_ranges(self) -> None:
        """Refuse out-of-range knobs now, with the fix, rather than as a crash (or a silent no-op) steps into a run."""
        for name, low in (("save_every", 1), ("log_every", 1), ("keep_checkpoints", 1), ("log_video_every", 0),
                          ("num_workers", 0), ("dataloader_prefetch_factor", 1), ("dataloader_worker_threads", 1),
                          ("seed", 0)):
            require_int(name, getattr(self, name), low, TrainConfig.__dataclass_fields__[name].default)
        require_int("dataset.cache_episodes", self.dataset.cache_episodes, 0, DatasetConfig.cache_episodes)
        for name, high in UPPER_BOUNDS.items():
            value = self.dataset.cache_episodes if name == "dataset.cache_episodes" else getattr(self, name)
            if value > high:
                raise ValueError(f"{name}={value} is more than {high}, which no run needs: set {name}=<at most {high}>")
        for name, value in (("output_dir", self.output_dir), ("dataset.root", self.dataset.root),
                            ("init_from", self.init_from)):
            if value is not None and not str(value).strip():  # '' would read and write the working directory
                raise ValueError(f"{name}='' is empty: give a path (or leave it out for its default)")
        for name in ("dataset.frame_stride", "vae_micro_batch_size"):
            value = self.dataset.frame_stride if name == "dataset.frame_stride" else self.vae_micro_batch_size
            if value is not None:
                require_int(name, value, 1)
        for name in ("video_dropout", "world_model_prob"):  # probabilities
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} is a probability: set {name}=<a number in [0, 1]>")
        for name in ("action_weight", "state_weight"):  # loss weights; 0 turns a loss off
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name}={getattr(self, name)} must be a finite number >= 0 (0 turns that loss off)")

    def _own_vae_micro_batch_size(self) -> None:
        """The model config owns the value; the top-level knob only spells it the way users know."""
        top, model = self.vae_micro_batch_size, self.model.vae_micro_batch_size
        if top is not None and model is not None and top != model:
            raise ValueError(f"vae_micro_batch_size={top} and model.vae_micro_batch_size={model} disagree: set one of them")
        self.model.vae_micro_batch_size = self.vae_micro_batch_size = top if top is not None else model


def register_configs() -> None:
    """Put the schema and every architecture's model presets in Hydra's ConfigStore (``model=<preset>``)."""
    from hydra.core.config_store import ConfigStore

    from agents.wam.architectures import every_architecture

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for architecture in every_architecture():
        for name, make in architecture.preset_makers().items():
            store.store(group="model", name=name, node=make())
