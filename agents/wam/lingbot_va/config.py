"""Configuration of LingBot-VA (Robbyant/lingbot-va) in wam_gym, and its presets.

LingBot-VA is an autoregressive World Action Model: one Wan2.2-TI2V-5B-sized transformer serves a video
stream and an action stream in separate calls that meet only through a per-episode KV cache
(:mod:`agents.wam.lingbot_va.model`, :mod:`agents.wam.lingbot_va.cache`). Each chunk it denoises
``frame_chunk_size`` latent frames, then ``frame_chunk_size x action_per_frame`` actions; the frames the
robot then saw and the chunk it executed are fed back into the cache (:mod:`agents.wam.lingbot_va.sampling`).

Presets:
    ``lingbot_va``       their LIBERO release (wan_va/configs/va_libero_cfg.py; the transformer at their
                         WanTransformer3DModel's defaults: 30 layers of 24 x 128 heads, ffn 14336, 48 latent
                         channels, 30 action channels, UMT5-XXL's 4096-d text): two 128 x 128 cameras side by side,
                         and everything else as the ``lingbot_va_libero`` input convention says (it owns them:
                         agents/wam/lingbot_va/inputs.py): chunks of 4 latent frames x 4 actions, attention window
                         30, 20 video steps at shift 5 and guidance 5, 50 action steps at shift 0.05 and guidance 1,
                         LIBERO's 7 action channels 0..6.
    ``lingbot_va_tiny``  the same layout at 2 layers of 2 x 20 heads, random weights, and a 4-channel Wan2.2-style
                         VAE: the size of the parity fixture made with their code (tests/fixtures/lingbot_va,
                         scripts/lingbot_va_reference.py).
    ``lingbot_va_libero_tiny``  that tiny transformer and VAE under ``lingbot_va_libero`` (what
                         scripts/tiny_lingbot_va_release.py releases): LIBERO fine-tuning on a CPU.

A config is also a :class:`~agents.wam.config.ModelConfig`, so ``python -m training`` trains it: ``training`` holds
their training draws (:class:`LingBotVATraining`), ``pretrained_path`` the release folder a run starts from, and
``inputs`` the convention that owns the settings above (and normalises the actions the clips carry).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agents.wam.config import ModelConfig, VAEConfig, from_data
from agents.wam.lingbot_va.inputs import LingBotVAInputs, convention

# The parity fixture's channels (their earlier va_libero_cfg.py copy; the convention's latest are 0..6)
LIBERO_ACTION_CHANNELS = (0, 1, 2, 3, 4, 5, 28)


@dataclass
class TransformerConfig:
    """Their ``WanTransformer3DModel.__init__`` arguments (a release's transformer/config.json), at their defaults
    (wan_va/modules/model.py). Their ``attn_mode`` and ``pos_embed_seq_len`` are not here: the attention
    kernel is ours to choose and the position embedding length is unused by their model."""

    patch_size: tuple[int, int, int] = (1, 2, 2)  # (frames, height, width) latent cells per video token
    num_attention_heads: int = 24  # heads of every attention
    attention_head_dim: int = 128  # size of one head; width = heads x head size
    in_channels: int = 48  # latent channels in (the VAE's z_dim)
    out_channels: int = 48  # latent channels out
    action_dim: int = 30  # action channels (a robot uses some of them: ``action_channels``)
    text_dim: int = 4096  # width of the text encoder's states
    freq_dim: int = 256  # sinusoidal timestep features
    ffn_dim: int = 14336  # feed-forward hidden width
    num_layers: int = 30  # transformer blocks, shared by both streams
    cross_attn_norm: bool = True  # affine LayerNorm before the text cross-attention (their release: true)
    eps: float = 1e-6  # of the norms
    rope_max_seq_len: int = 1024  # recorded in their config; their RoPE takes positions, not a table

    def __post_init__(self) -> None:
        self.patch_size = tuple(self.patch_size)  # Hydra and JSON hand over lists
        if not self.cross_attn_norm:
            raise ValueError("cross_attn_norm=false is not supported: their release normalises before cross-attention")
        if len(self.patch_size) != 3:
            raise ValueError(f"patch_size={self.patch_size} must be (frames, height, width)")

    @property
    def dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    def kwargs(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "patch_size": tuple(self.patch_size)}


@dataclass
class LingBotVATraining:
    """What their training draws per batch and per row (wan_va/train.py; their train configs' knob names), and the
    clips it sees. The noise levels come from the inference shifts (their one ``snr_shift``/``action_snr_shift``)."""

    # latent frames a training clip holds after its first (theirs: a whole episode from its first frame, batch 1;
    # ours: fixed windows from any frame, the window's first frame at position 0 as an episode's is)
    clip_frames: int = 3
    chunk_sizes: tuple[int, int] = (1, 4)  # latent frames per attention block, drawn per batch (randint(1, 5))
    windows: tuple[int, int] = (4, 64)  # blocks a token sees either side, drawn per batch (randint(4, 65))
    noisy_context: float = 0.5  # chance a batch's clean video context is noised too (_add_noise's noisy_cond_prob)
    text_dropout: float = 0.1  # chance a row trains on the empty prompt (cfg_prob: what guidance needs)
    gradient_checkpointing: bool = False  # recompute each block in backward (their apply_ac): memory for compute

    def __post_init__(self) -> None:
        self.chunk_sizes, self.windows = tuple(self.chunk_sizes), tuple(self.windows)
        for name in ("chunk_sizes", "windows"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"model.training.{name}={[low, high]}: give [low, high] with 1 <= low <= high")
        if self.clip_frames < 1:
            raise ValueError(f"model.training.clip_frames={self.clip_frames} must be at least 1")
        for name in ("noisy_context", "text_dropout"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"model.training.{name}={getattr(self, name)} is a probability: give one in [0, 1]")


@dataclass
class LingBotVAConfig(ModelConfig):
    """Everything that fixes a LingBot-VA's weights, input geometry and per-chunk inference
    (their ``va_*_cfg.py`` knob names in the comments), and how it trains."""

    preset: str = "lingbot_va_tiny"  # the preset this config started from
    # the transformer (their transformer/config.json); tiny by default, the parity fixture's size
    transformer: TransformerConfig = field(default_factory=lambda: TransformerConfig(
        num_attention_heads=2, attention_head_dim=20, text_dim=16, freq_dim=32, ffn_dim=64, num_layers=2,
    ))
    # diffusers AutoencoderKLWan; observations go through its encoder in streaming mode
    vae: VAEConfig = field(default_factory=lambda: VAEConfig(
        base_dim=4, decoder_base_dim=4, z_dim=48, dim_mult=(1, 2, 2, 2), num_res_blocks=1, is_residual=True,
        patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16,
    ))
    cameras: tuple[str, ...] = ("agentview", "eye_in_hand")  # obs_cam_keys: side by side in latent space
    image_size: tuple[int, int] = (64, 48)  # height, width: each camera's frames, resized
    text_tokens: int = 512  # positions of the prompt embeddings (their _reset encodes to 512)
    frame_chunk_size: int = 2  # latent frames per chunk
    action_per_frame: int = 4  # actions per latent frame
    attn_window: int = 4  # the cache holds attn_window // 2 chunks of video and action tokens
    video_steps: int = 3  # num_inference_steps
    action_steps: int = 4  # action_num_inference_steps
    video_shift: float = 5.0  # snr_shift
    action_shift: float = 1.0  # action_snr_shift
    video_guidance: float = 5.0  # guidance_scale (classifier-free, on the video stream)
    action_guidance: float = 1.0  # action_guidance_scale
    action_channels: tuple[int, ...] = LIBERO_ACTION_CHANNELS  # used_action_channel_ids; the others are zeroed
    # the input convention (agents/wam/lingbot_va/inputs.py) that owns the settings from cameras to action_channels
    # and the actions' quantiles; null: the fields above as they are (lingbot_va_tiny, which cannot train)
    inputs: str | None = None
    pretrained_path: str | None = None  # a release folder as published (transformer/, vae/, ...) to train from
    training: LingBotVATraining = field(default_factory=LingBotVATraining)  # their training draws and the clips
    state_dim: int | None = None  # the dataset's proprio size, recorded only: LingBot-VA never sees proprioception
    vae_micro_batch_size: int | None = None  # unused: every clip's cameras are encoded on their own

    def __post_init__(self) -> None:
        self.cameras, self.image_size = tuple(self.cameras), tuple(self.image_size)
        self.action_channels = tuple(self.action_channels)
        _check_owned(self)
        for knob in ("frame_chunk_size", "action_per_frame", "video_steps", "action_steps", "text_tokens"):
            if getattr(self, knob) < 1:
                raise ValueError(f"{knob}={getattr(self, knob)} must be at least 1")
        if self.attn_window < 2:
            raise ValueError(f"attn_window={self.attn_window} must be at least 2: the cache holds attn_window // 2 chunks")
        if self.vae.z_dim != self.transformer.in_channels:
            raise ValueError(f"vae.z_dim={self.vae.z_dim} must equal transformer.in_channels={self.transformer.in_channels}")
        if not set(self.action_channels) <= set(range(self.transformer.action_dim)):
            raise ValueError(f"action_channels={self.action_channels} must lie in 0..{self.transformer.action_dim - 1}")
        if any(size % self.vae.scale_factor_spatial for size in self.image_size):
            raise ValueError(f"image_size={self.image_size} must be a multiple of the VAE's {self.vae.scale_factor_spatial}x")
        _, p_h, p_w = self.transformer.patch_size
        if self.latent_size[0] % p_h or self.latent_size[1] % p_w:
            raise ValueError(f"the latent frame {self.latent_size} (cameras side by side) must be whole patches of "
                             f"{(p_h, p_w)}: change image_size")

    @property
    def latent_size(self) -> tuple[int, int]:
        """(height, width) of one latent frame: the cameras side by side (their _encode_obs)."""
        h, w = (s // self.vae.scale_factor_spatial for s in self.image_size)
        return h, w * len(self.cameras)

    @property
    def cache_slots(self) -> int:
        """Their create_empty_cache: attn_window // 2 chunks of video tokens and of action tokens."""
        _, p_h, p_w = self.transformer.patch_size
        h, w = self.latent_size
        chunk = self.frame_chunk_size * ((h // p_h) * (w // p_w) + self.action_per_frame)
        return (self.attn_window // 2) * chunk

    @classmethod
    def under(cls, inputs: LingBotVAInputs, transformer: TransformerConfig, vae: VAEConfig) -> LingBotVAConfig:
        """The config of a transformer and VAE evaluated by an input convention, which owns the geometry, the
        chunk, the steps, guidance, shifts, window and action channels (their ``va_*_cfg.py``)."""
        return cls(preset=inputs.name, transformer=transformer, vae=vae, inputs=inputs.name, **_owned(inputs))

    def convention(self) -> LingBotVAInputs:
        """Its input convention; a config without one (lingbot_va_tiny) has no actions' quantiles to train with."""
        if self.inputs is None:
            raise ValueError(f"model={self.preset} names no input convention (model.inputs), so no statistics normalise "
                             "its actions: train model=lingbot_va_libero_tiny or model=lingbot_va")
        return convention(self.inputs)

    # ----------------------------------------------------------------- what python -m training reads (ModelConfig)
    @property
    def action_dim(self) -> int:
        """The env's action size: the robot's channels."""
        return len(self.action_channels)

    @action_dim.setter
    def action_dim(self, value: int) -> None:  # a fresh run takes the dataset's sizes: they must be the robot's
        if value != len(self.action_channels):
            raise ValueError(f"the dataset's actions are {value}-d and {self.inputs or self.preset} drives "
                             f"{len(self.action_channels)} channels: train on demos of its robot")

    @property
    def num_future_frames(self) -> int:
        """Pixel frames of a training clip after its first (4 per latent frame)."""
        return self.training.clip_frames * self.vae.scale_factor_temporal

    @property
    def action_horizon(self) -> int:
        """Actions of a training clip: each latent frame's after the first (the first's are the zero condition)."""
        return self.training.clip_frames * self.action_per_frame

    @property
    def gradient_checkpointing(self) -> bool:
        return self.training.gradient_checkpointing

    @property
    def has_pretrained_weights(self) -> bool:
        return self.pretrained_path is not None

    @property
    def normalizes_actions(self) -> bool:
        return True  # by its convention's quantiles, which the release was trained with, not the dataset's

    @property
    def suite(self) -> str | None:
        return None if self.inputs is None else self.convention().suite

    @property
    def input_convention(self) -> str:
        return self.inputs or self.preset

    @property
    def video_mode(self) -> None:
        return None  # no decoded video is served or logged

    def input_frames(self, pixels, num_images: int, device=None):
        """(N, H, W, 3) uint8 per camera -> (N, 3, h, w * cameras): each camera as its convention's server resizes
        it, side by side (the model encodes them one by one again: :meth:`LingBotVA.encode_video`)."""
        import torch

        video = self.convention().video({camera: pixels[camera][:num_images] for camera in self.cameras})
        return torch.cat([video[camera] for camera in self.cameras], dim=-1).transpose(0, 1).to(device)

    def prompts(self, instructions):
        return [self.convention().prompt(text) for text in instructions]

    def dataset_actions(self, actions):
        return self.convention().model_units(actions)

    def to_dict(self) -> dict[str, Any]:
        data = {"architecture": "lingbot_va", **dataclasses.asdict(self)}
        # as FastWAM's: evaluation protocols read the convention's name at inputs.name
        return {**data, "inputs": None if self.inputs is None else {"name": self.inputs}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LingBotVAConfig:
        data = {k: v for k, v in data.items() if k != "architecture"}
        if isinstance(data.get("inputs"), dict):
            data["inputs"] = data["inputs"].get("name")
        return from_data(cls, data, {"transformer": TransformerConfig, "vae": VAEConfig, "training": LingBotVATraining})


def _owned(inputs: LingBotVAInputs) -> dict[str, Any]:
    """The config fields an input convention owns, at its values (their ``va_*_cfg.py``)."""
    s = inputs.sampling
    return dict(cameras=inputs.cameras, image_size=inputs.sizes[0], frame_chunk_size=inputs.frame_chunk_size,
                action_per_frame=inputs.action_per_frame, attn_window=s.attn_window, video_steps=s.video_steps,
                action_steps=s.action_steps, video_shift=s.video_shift, action_shift=s.action_shift,
                video_guidance=s.video_guidance, action_guidance=s.action_guidance, action_channels=inputs.channels)


WAN22_VAE = VAEConfig(
    base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=(1, 2, 4, 4), num_res_blocks=2,
    temperal_downsample=(False, True, True), is_residual=True, patch_size=2, in_channels=12, out_channels=12,
    scale_factor_spatial=16,
)  # Wan2.2-TI2V-5B's VAE (a release's vae/config.json brings its latent statistics)


def _lingbot_va() -> LingBotVAConfig:
    # Their LIBERO release: the transformer at their WanTransformer3DModel's defaults, evaluated as their
    # va_libero_cfg.py says (the lingbot_va_libero convention owns those settings). Training clips of 16 latent
    # frames (4 chunks of LIBERO's 4; 60 actions), recomputed in backward as their trainer does.
    return dataclasses.replace(LingBotVAConfig.under(convention("lingbot_va_libero"), TransformerConfig(), WAN22_VAE),
                               preset="lingbot_va",
                               training=LingBotVATraining(clip_frames=15, gradient_checkpointing=True))


def _lingbot_va_libero_tiny() -> LingBotVAConfig:
    # The parity fixture's transformer and VAE under their LIBERO convention (scripts/tiny_lingbot_va_release.py)
    tiny = LingBotVAConfig()
    return dataclasses.replace(LingBotVAConfig.under(convention("lingbot_va_libero"), tiny.transformer, tiny.vae),
                               preset="lingbot_va_libero_tiny")


PRESETS = {"lingbot_va": _lingbot_va, "lingbot_va_tiny": LingBotVAConfig, "lingbot_va_libero_tiny": _lingbot_va_libero_tiny}


def preset(name: str, **overrides: Any) -> LingBotVAConfig:
    """The named LingBot-VA preset's config, with top-level fields replaced by ``overrides``."""
    if name not in PRESETS:
        raise ValueError(f"unknown LingBot-VA preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name](), **overrides)


def _check_owned(config: LingBotVAConfig) -> None:
    """Under a convention, every setting it owns is its (one owner per knob): an override is refused."""
    if config.inputs is None:
        return
    for knob, value in _owned(config.convention()).items():
        if getattr(config, knob) != value:
            raise ValueError(f"model.{knob}={getattr(config, knob)}: the input convention {config.inputs} owns it "
                             f"({value}); drop the override")


def uses_guidance(config: LingBotVAConfig) -> bool:
    """Their use_cfg: every call runs a prompted and an unprompted row when either stream is guided."""
    return config.video_guidance > 1 or config.action_guidance > 1
