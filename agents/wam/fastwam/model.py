"""FastWAM: a Wan2.2 video expert and an action DiT that share one masked attention in every layer.

Components (each a standard library class, saved in its library's own format):
    transformer      diffusers ``WanTransformer3DModel``: the video expert (Wan2.2-TI2V-5B at full size)
    action_expert    :class:`~agents.wam.fastwam.action_dit.FastWAMActionDiT`
    proprio_encoder  :class:`~agents.wam.fastwam.embeddings.ProprioEncoder`: proprio -> one text-context token
    vae              diffusers ``AutoencoderKLWan``, frozen
    text_encoder     transformers ``UMT5EncoderModel``, frozen; ``tokenizer`` beside it

What one denoiser call computes (FastWAM's ``_predict_joint_noise``): the text context is the instruction's
embeddings (padding zeroed, nothing masked) followed by the proprio token, projected by each expert's own
text embedder; video tokens carry Wan's 3-D RoPE and per-token timesteps (0 for the clean current frame),
action tokens a 1-D RoPE and one timestep per row; every layer joins both experts' self-attention under
the block mask of :mod:`agents.wam.fastwam.mask`, then cross-attends and feeds forward per expert. The
block maths is :mod:`agents.wam.wan_adapter`'s and :func:`agents.wam.layers.mot_layer` joins the experts,
as in our MoT. Timesteps are FastWAM's: sigma x ``num_train_timesteps`` (1000), per modality.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from diffusers import AutoencoderKLWan
from torch import nn
from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

from agents.wam import wan_adapter as wan
from agents.wam.attention import resolve_attention_backend
from agents.wam.fastwam.action_dit import FastWAMActionDiT
from agents.wam.fastwam.config import FastWAMConfig
from agents.wam.fastwam.embeddings import ProprioEncoder, timestep_features
from agents.wam.fastwam.layers import KeysValues, action_layers, video_keys_values
from agents.wam.fastwam.mask import block_mask
from agents.wam.layers import LayerContext, mot_layer
from agents.wam.precision import apply_precision, module_dtype, precision_scope
from agents.wam.wan_adapter import WanTransformer3DModel


def build_transformer(config: FastWAMConfig) -> WanTransformer3DModel:
    return WanTransformer3DModel(**config.backbone.transformer_kwargs())


def build_action_expert(config: FastWAMConfig) -> FastWAMActionDiT:
    bb, ax = config.backbone, config.action_expert
    return FastWAMActionDiT(
        dim=ax.dim, ffn_dim=ax.ffn_dim, num_layers=bb.num_layers, num_attention_heads=bb.num_attention_heads,
        attention_head_dim=bb.attention_head_dim, action_dim=config.action_dim, text_dim=bb.text_dim,
        freq_dim=ax.freq_dim, eps=ax.eps, max_positions=ax.max_positions,
    )


def build_proprio_encoder(config: FastWAMConfig) -> ProprioEncoder:
    return ProprioEncoder(config.state_dim, config.backbone.text_dim)


# The denoiser's components (what FastWAM's checkpoint holds), each from the config with random weights.
BUILDERS = {"transformer": build_transformer, "action_expert": build_action_expert, "proprio_encoder": build_proprio_encoder}


@dataclass
class CallCache:
    """What stays fixed across the denoising steps of one inference call, computed on first use:
    the context projected by each expert, the text cross-attention keys/values, and (action-only)
    the current frame's self-attention keys/values in every layer."""

    text: tuple[torch.Tensor, torch.Tensor] | None = None
    cross_kv: dict = field(default_factory=dict)
    video_kv: KeysValues | None = None


class FastWAM(nn.Module):
    """Predicts an action chunk (and, jointly, the future latent frames) from one observation."""

    def __init__(
        self,
        config: FastWAMConfig,
        transformer: WanTransformer3DModel | None = None,
        action_expert: FastWAMActionDiT | None = None,
        proprio_encoder: ProprioEncoder | None = None,
        vae: AutoencoderKLWan | None = None,
        text_encoder: UMT5EncoderModel | None = None,
        tokenizer=None,
    ):
        super().__init__()
        self.config = config
        self.transformer = transformer or build_transformer(config)
        self.action_expert = action_expert or build_action_expert(config)
        self.proprio_encoder = proprio_encoder or build_proprio_encoder(config)
        self.vae = vae or AutoencoderKLWan(**config.vae.vae_kwargs())
        te = config.text_encoder
        self.tokenizer = tokenizer or ByT5Tokenizer()
        self.text_encoder = text_encoder or UMT5EncoderModel(UMT5Config(
            vocab_size=len(self.tokenizer), d_model=te.d_model, d_kv=te.d_kv, d_ff=te.d_ff,
            num_layers=te.num_layers, num_heads=te.num_heads,
        ))
        self._check_shapes()
        self.vae.requires_grad_(False)
        self.text_encoder.requires_grad_(False)
        self._apply_precision()
        self._backends: dict[str, str] = {}
        self.train(False)

    def train(self, mode: bool = True) -> FastWAM:
        """Train the experts; the frozen encoders stay in eval mode."""
        super().train(mode)
        self.vae.eval()
        self.text_encoder.eval()
        return self

    # ----------------------------------------------------------------- structure
    def _check_shapes(self) -> None:
        tc, ac = self.transformer.config, self.action_expert.config
        wan.check_video_expert(self.transformer)
        expected = {
            "transformer in_channels": (tc.in_channels, self.vae.config.z_dim),
            "transformer text_dim": (tc.text_dim, self.text_encoder.config.d_model),
            "action expert layers": (ac.num_layers, tc.num_layers),
            "action expert heads": (ac.num_attention_heads, tc.num_attention_heads),
            "action expert head size": (ac.attention_head_dim, tc.attention_head_dim),
            "proprio encoder width": (self.proprio_encoder.config.text_dim, tc.text_dim),
        }
        wrong = {name: pair for name, pair in expected.items() if pair[0] != pair[1]}
        if wrong:
            detail = ", ".join(f"{name} is {got}, needs {want}" for name, (got, want) in wrong.items())
            raise ValueError(f"FastWAM components do not fit together ({self.config.preset}): {detail}")

    def projector_modules(self) -> list[nn.Module]:
        """Input/output projections and condition embedders (the ``projectors`` precision group)."""
        ax = self.action_expert
        return [*wan.io_modules(self.transformer), ax.action_in, ax.condition_embedder, ax.proj_out, self.proprio_encoder]

    def _apply_precision(self) -> None:
        p = self.config.encoder_mode
        for expert in (self.transformer, self.action_expert):
            apply_precision(expert, p.backbone)  # the blocks, and the parameters outside every module group
        for module in self.projector_modules():
            apply_precision(module, p.projectors)
        apply_precision(self.text_encoder, p.text_encoder)
        apply_precision(self.vae, p.vae)

    @property
    def device(self) -> torch.device:
        return wan.parameter_device(self.transformer)

    @contextmanager
    def _precision(self, group: str):
        mode = getattr(self.config.encoder_mode, group)
        with precision_scope(mode, self.device):
            yield module_dtype(mode)

    def attention_backend(self) -> str:
        kind = self.device.type
        if kind not in self._backends:
            self._backends[kind] = resolve_attention_backend(self.config.backbone.attention_backend, self.device)
        return self._backends[kind]

    # ----------------------------------------------------------------- encoders
    @torch.no_grad()
    def encode_prompt(self, prompts: Sequence[str]) -> torch.Tensor:
        """(B, max_length, text_dim): positions past each prompt are zero and stay visible to the
        experts' cross-attention (FastWAM zeroes the padding and masks nothing, in training and inference)."""
        tokens = self.tokenizer(list(prompts), padding="max_length", max_length=self.config.text_encoder.max_length,
                                truncation=True, return_tensors="pt").to(self.device)
        with self._precision("text_encoder"):
            hidden = self.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask)
        return hidden.last_hidden_state.float() * tokens.attention_mask[..., None]

    def _latent_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1, 1, 1, 1)
        return (torch.tensor(self.vae.config.latents_mean, device=like.device).view(shape),
                torch.tensor(self.vae.config.latents_std, device=like.device).view(shape))

    @torch.no_grad()
    def encode_video(self, frames: torch.Tensor) -> torch.Tensor:
        """Pixels (B, 3, T, H, W) in [-1, 1] -> normalised latents (the VAE's mean, as FastWAM takes it)."""
        with self._precision("vae") as dtype:
            latents = self.vae.encode(frames.to(dtype)).latent_dist.mode().float()
        mean, std = self._latent_stats(latents)
        return (latents - mean) / std

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents -> pixels (B, 3, T, H, W) in [-1, 1]."""
        mean, std = self._latent_stats(latents)
        with self._precision("vae") as dtype:
            frames = self.vae.decode((latents * std + mean).to(dtype)).sample
        return frames.float().clamp(-1, 1)

    # ----------------------------------------------------------------- conditioning
    def _text(self, text: torch.Tensor, state: torch.Tensor, cache: CallCache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The context (instruction embeddings, then the proprio token) in each expert's width."""
        if cache is not None and cache.text is not None:
            return cache.text
        with self._precision("projectors") as dtype:
            context = torch.cat([text.to(dtype), self.proprio_encoder(state.to(dtype))], dim=1)
            projected = wan.project_text(self.transformer, context), wan.project_text(self.action_expert, context)
        if cache is not None:
            cache.text = projected
        return projected

    def _video_time(self, timestep: torch.Tensor, grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token timestep embedding of the video: 0 for the current frame's tokens, ``timestep`` (B,) after."""
        per_frame = grid[1] * grid[2]
        tokens = timestep.float()[:, None].repeat(1, grid[0] * per_frame)
        tokens[:, :per_frame] = 0
        return wan.embed_time_features(self.transformer, timestep_features(tokens, self.transformer.config.freq_dim))

    def _action_time(self, timestep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = timestep_features(timestep.float(), self.action_expert.config.freq_dim)
        return wan.embed_time_features(self.action_expert, features)

    def _context(self, video_mod, action_mod, texts, rotary, cache: CallCache | None) -> LayerContext:
        dtype = module_dtype(self.config.encoder_mode.backbone)
        return LayerContext(
            video_mod=video_mod, action_mod=action_mod, video_text=texts[0].to(dtype), action_text=texts[1].to(dtype),
            rotary=rotary, backend=self.attention_backend(), cross_kv=None if cache is None else cache.cross_kv,
        )

    # ----------------------------------------------------------------- denoiser
    def forward(
        self,
        latents: torch.Tensor,
        video_timestep: torch.Tensor,
        actions: torch.Tensor,
        action_timestep: torch.Tensor,
        text: torch.Tensor,
        state: torch.Tensor,
        cache: CallCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flow velocities of the future latents and of the actions, both experts jointly.

        latents (B, C, F, h, w): the clean current frame, then F-1 noisy future frames at
        ``video_timestep`` (B,); actions (B, T, A) noisy at ``action_timestep`` (B,); timesteps in
        [0, num_train_timesteps]; text (B, Lt, text_dim) from :meth:`encode_prompt`; state (B, S) the
        normalised proprio. Returns (B, C, F-1, h, w) and (B, T, A)."""
        tr, ax = self.transformer, self.action_expert
        grid = wan.patch_grid(tr, latents.shape)
        per_frame = grid[1] * grid[2]
        texts = self._text(text, state, cache)
        with self._precision("projectors") as dtype:
            xv, xa = wan.patchify(tr, latents.to(dtype)), ax.embed(actions.to(dtype))
            temb_v, mod_v = self._video_time(video_timestep, grid)
            _, mod_a = self._action_time(action_timestep)
        with self._precision("backbone") as dtype:
            ctx = dataclasses.replace(
                self._context(mod_v, mod_a, texts, wan.rotary(tr, latents), cache),
                attn_mask=block_mask(xv.shape[1], per_frame, xa.shape[1], xv.device),
                action_rotary=ax.rotary(xa.shape[1]),
            )
            xv, xa = xv.to(dtype), xa.to(dtype)
            for index, (video_block, action_block) in enumerate(zip(wan.expert_blocks(tr), wan.expert_blocks(ax))):
                xv, xa = mot_layer(video_block, action_block, xv, xa, ctx, index)
        with self._precision("projectors") as dtype:
            hidden = wan.output_head(tr, xv[:, per_frame:].to(dtype), temb_v[:, per_frame:])
            video = wan.unpatchify(tr, hidden, (grid[0] - 1, grid[1], grid[2])).float()
            return video, ax.head(xa.to(dtype)).float()

    def action_velocity(
        self,
        current: torch.Tensor,
        actions: torch.Tensor,
        action_timestep: torch.Tensor,
        text: torch.Tensor,
        state: torch.Tensor,
        cache: CallCache,
    ) -> torch.Tensor:
        """The actions' flow velocity (B, T, A) given only the current frame's latents (B, C, 1, h, w):
        FastWAM's action-only inference. The current frame's keys/values are computed on the first call
        with a ``cache`` and reused after; the result equals :meth:`forward`'s actions."""
        ax = self.action_expert
        texts = self._text(text, state, cache)
        if cache.video_kv is None:
            cache.video_kv = self._current_frame_keys_values(current, texts, cache)
        with self._precision("projectors") as dtype:
            xa = ax.embed(actions.to(dtype))
            _, mod_a = self._action_time(action_timestep)
        with self._precision("backbone") as dtype:
            ctx = dataclasses.replace(self._context(None, mod_a, texts, None, cache), action_rotary=ax.rotary(xa.shape[1]))
            xa = action_layers(wan.expert_blocks(ax), xa.to(dtype), cache.video_kv, ctx)
        with self._precision("projectors") as dtype:
            return ax.head(xa.to(dtype)).float()

    def _current_frame_keys_values(self, current: torch.Tensor, texts, cache: CallCache) -> KeysValues:
        tr = self.transformer
        grid = wan.patch_grid(tr, current.shape)
        if grid[0] != 1:
            raise ValueError(f"action-only inference takes the current frame alone, got {grid[0]} latent frames")
        with self._precision("projectors") as dtype:
            xv = wan.patchify(tr, current.to(dtype))
            _, mod_v = self._video_time(torch.zeros(current.shape[0], device=current.device), grid)
        with self._precision("backbone") as dtype:
            ctx = self._context(mod_v, None, texts, wan.rotary(tr, current), cache)
            return video_keys_values(wan.expert_blocks(tr), xv.to(dtype), ctx)
