"""Configuration of FastWAM (yuantianyuan01/FastWAM) in wam_gym, and its presets.

FastWAM is a Mixture-of-Transformers like our MoT, with its own rules (see :mod:`agents.wam.fastwam`):
the video expert is a Wan2.2-TI2V-5B transformer (diffusers' ``WanTransformer3DModel``, configured by the
same :class:`~agents.wam.config.BackboneConfig` as our MoT), the action expert an action DiT of its own
width, the proprio state one more token of the text context, and each modality its own flow schedule.

Presets:
    ``fastwam``       the released LIBERO model: 30 layers of 24 x 128 heads, video 3072 wide (ffn 14336,
                      48 latent channels), action DiT 1024 wide (ffn 4096); 128 text tokens + 1 proprio
                      token; 2 cameras of 224 x 224 side by side; 32 actions of 7 and a frame every 4 (their
                      33 frames at action_video_freq_ratio 4); proprio 8; shift 5 for video and actions (train
                      and inference, 1000 timesteps); their LIBERO input conventions (``fastwam_libero``,
                      :mod:`agents.wam.fastwam.inputs`). Their evaluation runs 10 denoising steps.
    ``fastwam_tiny``  the same layout at 2 layers, 2 heads of 32, random weights, their schedules (shift 5):
                      the size of the parity fixture made with their code (tests/fixtures/fastwam,
                      scripts/fastwam_reference.py).

Any other size of theirs is read from its checkpoint (:mod:`agents.wam.fastwam.their_config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agents.wam.config import VIDEO_MODES, BackboneConfig, ModelConfig, TextEncoderConfig, VAEConfig, from_data
from agents.wam.fastwam.inputs import FastWAMInputs, convention, from_saved
from agents.wam.precision import PrecisionConfig
from envs.orientation import UPRIGHT, reorient_tiles

SAMPLER_PRECISIONS = ("fp32", "model_dtype")


@dataclass
class FlowScheduleConfig:
    """One modality's flow-matching schedule (their ``WanContinuousFlowMatchScheduler``): noise level
    ``sigma = s u / (1 + (s - 1) u)`` for ``u`` uniform (training) or ``u = 1, 1 - 1/N, ..., 0``
    (N inference steps, Euler), timestep = sigma x ``num_train_timesteps``."""

    train_shift: float = 5.0  # shift s of the training noise levels
    infer_shift: float = 5.0  # shift s of the inference grid
    num_train_timesteps: int = 1000  # timestep = sigma x this

    def __post_init__(self) -> None:
        if not (self.train_shift > 0 and self.infer_shift > 0):
            raise ValueError(f"shifts must be > 0, got train_shift={self.train_shift}, infer_shift={self.infer_shift}")
        if self.num_train_timesteps < 1:
            raise ValueError(f"num_train_timesteps must be >= 1, got {self.num_train_timesteps}")


@dataclass
class FastWAMActionConfig:
    """The action DiT. Its heads and head size are the video expert's (the two share one attention);
    its width, feed-forward and timestep features are its own."""

    dim: int = 48  # width of the action tokens
    ffn_dim: int = 96  # feed-forward hidden width
    freq_dim: int = 16  # sinusoidal timestep features
    eps: float = 1e-6  # of the norms
    max_positions: int = 1024  # positions its 1-D RoPE covers (their table's length)


@dataclass
class FastWAMConfig(ModelConfig):
    """Everything that fixes a FastWAM's weights and input geometry."""

    preset: str = "fastwam_tiny"  # the preset this config started from
    # the video expert (diffusers WanTransformer3DModel keyword arguments)
    backbone: BackboneConfig = field(default_factory=lambda: BackboneConfig(
        num_attention_heads=2, attention_head_dim=32, in_channels=6, out_channels=6, text_dim=32, freq_dim=32,
        ffn_dim=128, num_layers=2,
    ))
    action_expert: FastWAMActionConfig = field(default_factory=FastWAMActionConfig)  # the action DiT
    vae: VAEConfig = field(default_factory=lambda: VAEConfig(z_dim=6))  # pixels <-> latents
    text_encoder: TextEncoderConfig = field(default_factory=lambda: TextEncoderConfig(max_length=10))  # UMT5, frozen
    encoder_mode: PrecisionConfig = field(default_factory=PrecisionConfig)  # per-module precision
    video_schedule: FlowScheduleConfig = field(default_factory=FlowScheduleConfig)  # the video latents' noise levels
    action_schedule: FlowScheduleConfig = field(default_factory=FlowScheduleConfig)  # the actions' noise levels
    cameras: tuple[str, ...] = ("agentview", "robot0_eye_in_hand")  # observation cameras, side by side
    image_size: tuple[int, int] = (32, 32)  # per camera (H, W)
    state_dim: int = 8  # proprio size: one linear map makes it a text-context token
    action_dim: int = 7  # action size
    action_horizon: int = 8  # actions per chunk
    num_future_frames: int = 8  # predicted pixel frames after the current one (4 per latent frame)
    video_mode: str = "action_only"  # action_only: their infer_action (video K/V once per call); joint: infer_joint
    # the dtype of the noise, timesteps and Euler steps: fp32 (wam_gym's) | model_dtype (theirs: the backbone's, so
    # under bf16 the timesteps are rounded to bf16 and each step adds in bf16; the same as fp32 in an fp32 model)
    sampler_precision: str = "fp32"
    inputs: FastWAMInputs = field(default_factory=FastWAMInputs)  # how observations and actions are read (inputs.py)
    vae_micro_batch_size: int | None = None  # VAE encode/decode in chunks of this many clips; null: whole batch

    def __post_init__(self) -> None:
        if self.video_mode not in VIDEO_MODES:
            raise ValueError(f"video_mode={self.video_mode!r}: choose one of {VIDEO_MODES}")
        if self.sampler_precision not in SAMPLER_PRECISIONS:
            raise ValueError(f"sampler_precision={self.sampler_precision!r}: choose one of {SAMPLER_PRECISIONS}")
        self.vae.check_future_frames(self.num_future_frames, "num_future_frames")
        if self.vae_micro_batch_size is not None and self.vae_micro_batch_size < 1:
            raise ValueError("vae_micro_batch_size must be null (whole batch) or a positive integer")

    @property
    def crops_frames(self) -> bool:
        return self.inputs.resize == "cover_crop"

    @property
    def suite(self) -> str | None:
        return self.inputs.suite

    @property
    def input_convention(self) -> str:
        return self.inputs.name

    def input_frames(self, pixels, num_images: int, device=None):
        return self.inputs.frames(pixels, self.cameras, self.image_size, num_images, device)

    def output_frames(self, video):
        return reorient_tiles(video, len(self.cameras), self.inputs.orientation, UPRIGHT)

    def prompts(self, instructions):
        return self.inputs.prompts(instructions)

    def env_actions(self, actions):
        return self.inputs.env_actions(actions)

    def dataset_actions(self, actions):
        return self.inputs.dataset_actions(actions)

    def dataset_stats(self, stats):
        return self.inputs.dataset_stats(stats)

    @property
    def text_tokens(self) -> int:
        """Length of the text context the experts attend to: the instruction's tokens, then the proprio token."""
        return self.text_encoder.max_length + 1

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": "fastwam", **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FastWAMConfig:
        groups = {
            "backbone": BackboneConfig, "action_expert": FastWAMActionConfig, "vae": VAEConfig,
            "text_encoder": TextEncoderConfig, "encoder_mode": PrecisionConfig,
            "video_schedule": FlowScheduleConfig, "action_schedule": FlowScheduleConfig, "inputs": FastWAMInputs,
        }
        data = {k: v for k, v in data.items() if k != "architecture"}
        if isinstance(data.get("inputs"), dict):
            data["inputs"] = from_saved(data["inputs"])
        return from_data(cls, data, groups)


WAN22_LATENTS_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)
WAN22_LATENTS_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)


def _fastwam() -> FastWAMConfig:
    # Their configs/model/fastwam.yaml with configs/data/libero_2cam.yaml's sizes.
    return FastWAMConfig(
        preset="fastwam",
        backbone=BackboneConfig(
            num_attention_heads=24, attention_head_dim=128, in_channels=48, out_channels=48, text_dim=4096,
            freq_dim=256, ffn_dim=14336, num_layers=30,
        ),
        action_expert=FastWAMActionConfig(dim=1024, ffn_dim=4096, freq_dim=256),
        # Wan2.2's VAE: 48 channels, 16x spatial (2x2 patchify inside), 4x temporal, a wider decoder, and the
        # latent statistics it normalises with (Wan2.2's measured ones, as their WanVideoVAE38 holds them).
        vae=VAEConfig(
            base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=(1, 2, 4, 4), num_res_blocks=2,
            temperal_downsample=(False, True, True), is_residual=True, patch_size=2, in_channels=12, out_channels=12,
            scale_factor_spatial=16, latents_mean=WAN22_LATENTS_MEAN, latents_std=WAN22_LATENTS_STD,
        ),
        # UMT5-XXL's encoder; their LIBERO config truncates instructions to 128 tokens.
        text_encoder=TextEncoderConfig(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, max_length=128),
        encoder_mode=PrecisionConfig.uniform("bf16_full"),
        image_size=(224, 224),
        # their num_frames 33 at action_video_freq_ratio 4: 32 actions, and a frame every 4 actions (8 future frames)
        action_horizon=32,
        num_future_frames=8,
        inputs=convention("fastwam_libero"),
    )


PRESETS = {"fastwam": _fastwam, "fastwam_tiny": FastWAMConfig}


def preset(name: str, **overrides: Any) -> FastWAMConfig:
    """The named FastWAM preset's config, with top-level fields replaced by ``overrides``."""
    if name not in PRESETS:
        raise ValueError(f"unknown FastWAM preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name](), **overrides)
