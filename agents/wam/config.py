"""What every WAM architecture's config shares: the Wan video expert's, VAE's and text encoder's groups, and
:class:`ModelConfig`, the base that derives a model's latent geometry, input/output convention and JSON file.

A config is plain data (an OmegaConf-friendly dataclass tree): Hydra overrides reach every
field as ``model.<group>.<field>``, e.g. ``model.backbone.attention_backend=sdpa``. Each architecture's
own config and presets are in its package: :mod:`agents.wam.mot.config` (MoTConfig: ``tiny``,
``wan22_ti2v_5b``, ``wan21_t2v_1_3b``), :mod:`agents.wam.fastwam.config` (FastWAMConfig).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

VIDEO_MODES = ("joint", "action_only")


@dataclass
class BackboneConfig:
    """The video expert: keyword arguments of diffusers' ``WanTransformer3DModel``, plus the
    two runtime knobs that act on the transformer stack."""

    num_attention_heads: int = 4  # heads of every attention (the action expert shares them)
    attention_head_dim: int = 16  # size of one head; width = heads x head size
    in_channels: int = 4  # latent channels in (the VAE's z_dim)
    out_channels: int = 4  # latent channels out (the VAE's z_dim)
    text_dim: int = 32  # width of the text encoder's features (its d_model)
    freq_dim: int = 32  # sinusoidal timestep embedding size
    ffn_dim: int = 128  # feed-forward hidden width
    num_layers: int = 2  # transformer blocks (each joins the action expert's block of the same index)
    patch_size: tuple[int, int, int] = (1, 2, 2)  # (frames, height, width) latent cells per video token
    cross_attn_norm: bool = True  # layer-norm before cross-attention to the text
    qk_norm: str = "rms_norm_across_heads"  # query/key normalisation (diffusers' Wan option)
    eps: float = 1e-6  # of the norms
    rope_max_seq_len: int = 1024  # longest position the rotary embedding covers
    attention_backend: str = "auto"  # auto | fa4 | fa3 | fa2 | sdpa (auto: first FlashAttention that runs, else SDPA)
    use_gradient_checkpointing: bool = False  # recompute each MoT layer (both experts) in backward

    def transformer_kwargs(self) -> dict[str, Any]:
        kwargs = dataclasses.asdict(self)
        for runtime_knob in ("attention_backend", "use_gradient_checkpointing"):
            kwargs.pop(runtime_knob)
        kwargs["patch_size"] = tuple(self.patch_size)
        return kwargs


@dataclass
class VAEConfig:
    """Keyword arguments of diffusers' ``AutoencoderKLWan`` (``dim_mult`` repeats its last entry)."""

    base_dim: int = 8  # channels of the first stage
    z_dim: int = 4  # latent channels
    dim_mult: tuple[int, ...] = (1, 2, 2, 2)  # channel multiplier per stage
    num_res_blocks: int = 1  # residual blocks per stage
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # which downsamplings also halve time (diffusers' spelling)
    is_residual: bool = False  # Wan2.2's residual up/down blocks
    patch_size: int | None = None  # pixel patchify inside the VAE (Wan2.2: 2); null: none
    in_channels: int = 3  # pixel channels in (x patch_size^2 when patchified)
    out_channels: int = 3  # pixel channels out (x patch_size^2 when patchified)
    scale_factor_temporal: int = 4  # pixel frames per latent frame (after the first)
    scale_factor_spatial: int = 8  # pixels per latent cell side
    decoder_base_dim: int | None = None  # channels of the decoder's first stage (Wan2.2: 256); null: base_dim
    # per-channel statistics latents are normalised with (a trained VAE's, e.g. Wan2.2's); null: 0 and 1
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None  # see latents_mean

    @classmethod
    def from_diffusers(cls, config: dict[str, Any]) -> VAEConfig:
        """The geometry of a saved ``AutoencoderKLWan`` (its config.json); the scale factors follow from it."""
        known = {f.name for f in dataclasses.fields(cls)} - {"scale_factor_temporal", "scale_factor_spatial"}
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in known}
        vae = cls(**kwargs)
        return dataclasses.replace(vae, scale_factor_temporal=2 ** sum(bool(t) for t in vae.temperal_downsample),
                                   scale_factor_spatial=2 ** (len(vae.dim_mult) - 1) * (vae.patch_size or 1))

    # diffusers' AutoencoderKLWan encodes the frames after the first in groups of 4, whatever its temporal
    # factor, and silently drops a last group that is not whole.
    FRAME_GROUP = 4

    def check_future_frames(self, num_future_frames: int, knob: str) -> None:
        """Refuse a frame count the VAE would not encode whole (see :attr:`FRAME_GROUP`)."""
        if num_future_frames % self.FRAME_GROUP:
            raise ValueError(f"{knob}={num_future_frames} must be a multiple of {self.FRAME_GROUP}: Wan's VAE "
                             f"encodes the frames after the first in groups of {self.FRAME_GROUP} (the "
                             f"temporal factor is {self.scale_factor_temporal})")

    def vae_kwargs(self) -> dict[str, Any]:
        kwargs = dataclasses.asdict(self)
        kwargs["dim_mult"] = list(self.dim_mult)
        kwargs["temperal_downsample"] = list(self.temperal_downsample)
        # Random-weight VAEs have no measured latent statistics: identity normalisation.
        kwargs["latents_mean"] = list(self.latents_mean) if self.latents_mean is not None else [0.0] * self.z_dim
        kwargs["latents_std"] = list(self.latents_std) if self.latents_std is not None else [1.0] * self.z_dim
        return kwargs


@dataclass
class TextEncoderConfig:
    """A T5-family encoder from transformers (UMT5 for Wan). Random-weight models use the
    byte-level ByT5 tokenizer, which needs no vocabulary file."""

    d_model: int = 32  # feature width (the backbone's text_dim)
    d_kv: int = 8  # size of one attention head
    d_ff: int = 64  # feed-forward hidden width
    num_layers: int = 2  # encoder blocks
    num_heads: int = 4  # attention heads
    max_length: int = 64  # tokens per instruction (padded / truncated)


Config = TypeVar("Config", bound="ModelConfig")


class ModelConfig:
    """What a model's config (:class:`~agents.wam.mot.config.MoTConfig`, FastWAM's ``FastWAMConfig``) derives from its fields: the
    latent geometry of its clips, and its JSON file (written and read through its ``to_dict``/``from_dict``)."""

    vae: VAEConfig
    cameras: tuple[str, ...]  # tiled side by side, each image_size
    image_size: tuple[int, int]
    num_future_frames: int
    action_horizon: int
    vae_micro_batch_size: int | None  # VAE encode/decode in chunks of this many clips; None: whole batch
    # the benchmark suite (envs.registry name) whose observations it was trained on, None when unknown or several:
    # the policy server takes it to know what the field's drivers send (MoTConfig: a field; FastWAM: its inputs')
    suite: str | None

    @property
    def latent_frames(self) -> int:
        """Latent frames of the current frame plus the predicted future."""
        return 1 + self.num_future_frames // self.vae.scale_factor_temporal

    # ----------------------------------------------------------------- its input/output convention
    # A model reads observations and writes actions the way it was trained to; these say how. The MoT's
    # are wam_gym's own (as training.collect records an env); FastWAM's are its checkpoint's ``inputs``.
    @property
    def input_convention(self) -> str:
        """The name of its input/output convention (evaluation protocols name the one they need)."""
        return "wam_gym"

    @property
    def crops_frames(self) -> bool:
        """Whether the model's input convention crops and scales every frame itself (any render size is then fine)."""
        return False

    def input_frames(self, pixels: Mapping[str, Any], num_images: int, device=None):
        """Camera images (uint8 (N, H, W, 3) per camera) -> the model's (N, 3, h, w * cameras) in [-1, 1]."""
        from agents.wam.frames import model_frames

        return model_frames(pixels, self.cameras, self.image_size, num_images, device)

    def output_frames(self, video):
        """Decoded frames (..., H, W * cameras, 3) uint8, as the model draws them -> turned upright, as the
        observation contract holds frames (a model trained on another orientation turns them back here)."""
        return video

    def prompts(self, instructions: Sequence[str]) -> list[str]:
        """Instructions -> what the text encoder reads."""
        return list(instructions)

    def env_actions(self, actions):
        """Un-normalised actions (B, T, A) -> what the env is sent."""
        return actions

    def dataset_actions(self, actions):
        """A dataset's env actions -> the units the model predicts (the inverse of :meth:`env_actions`)."""
        return actions

    def dataset_stats(self, stats: Mapping[str, Any]) -> dict[str, Any]:
        """A dataset's statistics (LeRobot's layout) -> those of :meth:`dataset_actions`' units."""
        return dict(stats)

    @property
    def has_pretrained_weights(self) -> bool:
        """Whether a model built from this config starts from trained weights (LoRA needs some)."""
        return False

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether training recomputes activations in backward (the experts' knob, ``model.backbone``'s here)."""
        return self.backbone.use_gradient_checkpointing

    @property
    def normalizes_actions(self) -> bool:
        """Whether its input convention maps env actions into the model's units itself (:meth:`dataset_actions`,
        LingBot-VA's quantiles), so the dataset's statistics normalise nothing in training."""
        return False

    @property
    def default_frame_stride(self) -> int:
        """Env steps between predicted frames when a recipe does not say: the future spans the chunk
        (FastWAM's 8 frames for 32 actions: every 4th step, as their clips are cut)."""
        return max(1, self.action_horizon // max(1, self.num_future_frames))

    @property
    def latent_size(self) -> tuple[int, int]:
        h, w = self.image_size
        s = self.vae.scale_factor_spatial
        return h // s, w * len(self.cameras) // s

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls: type[Config], data: dict[str, Any]) -> Config:
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls: type[Config], path: str | Path) -> Config:
        return cls.from_dict(json.loads(Path(path).read_text()))


def from_data(cls, data: dict[str, Any], groups: dict[str, type]):
    """Build a config dataclass from JSON/OmegaConf data; ``groups`` maps its nested dataclass fields to their types."""
    kwargs = dict(data)
    for name, group in groups.items():
        if name in kwargs:
            kwargs[name] = _tuples(group, kwargs[name])
    return _tuples(cls, kwargs, nested=groups)


def _tuples(cls, data: dict[str, Any], nested: dict | None = None):
    """Build a dataclass from JSON/OmegaConf data, restoring tuple fields JSON turned into lists."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; known: {sorted(known)}")
    kwargs = {}
    for key, value in data.items():
        if nested and key in nested:
            kwargs[key] = value
        elif isinstance(value, list):
            kwargs[key] = tuple(value)
        else:
            kwargs[key] = value
    return cls(**kwargs)
