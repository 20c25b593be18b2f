"""FastWAM: a Wan2.2 video expert and an action DiT that share one masked attention in every layer.

Components (each a standard library class, saved in its library's own format):
    transformer      diffusers ``WanTransformer3DModel``: the video expert (Wan2.2-TI2V-5B at full size)
    action_expert    :class:`~agents.wam.fastwam.action_dit.FastWAMActionDiT`
    proprio_encoder  :class:`~agents.wam.fastwam.embeddings.ProprioEncoder`: proprio -> one text-context token
    vae              diffusers ``AutoencoderKLWan``, frozen
    text_encoder     transformers ``UMT5EncoderModel``, frozen; ``tokenizer`` beside it
The encoders' part is the base class our MoT has too, :class:`~agents.wam.encoders.FrozenEncoders`.

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
from dataclasses import dataclass, field

import torch
from diffusers import AutoencoderKLWan
from torch import nn
from transformers import UMT5EncoderModel

from agents.wam import wan_adapter as wan
from agents.wam.attention import ResolvedBackends
from agents.wam.encoders import FrozenEncoders
from agents.wam.fastwam.action_dit import FastWAMActionDiT
from agents.wam.fastwam.config import FastWAMConfig
from agents.wam.fastwam.embeddings import ProprioEncoder, timestep_features
from agents.wam.fastwam.layers import KeysValues, action_layers, video_keys_values
from agents.wam.fastwam.mask import block_mask
from agents.wam.fastwam.objective import flow_matching_loss
from agents.wam.interface import LossInputs, Objective
from agents.wam.layers import LayerContext, mot_layers
from agents.wam.precision import apply_precision, module_dtype
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


class FastWAM(FrozenEncoders):
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
        self._init_encoders(vae, text_encoder, tokenizer)
        self._check_shapes()
        self._apply_precision()
        self._backends = ResolvedBackends()
        self.train(False)

    # ----------------------------------------------------------------- structure
    def _check_shapes(self) -> None:
        tc, ac = self.transformer.config, self.action_expert.config
        wan.check_video_expert(self.transformer)
        self._check_fit("FastWAM", self.transformer, {
            "action expert layers": (ac.num_layers, tc.num_layers),
            "action expert heads": (ac.num_attention_heads, tc.num_attention_heads),
            "action expert head size": (ac.attention_head_dim, tc.attention_head_dim),
            "proprio encoder width": (self.proprio_encoder.config.text_dim, tc.text_dim),
        })

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
        self._apply_encoder_precision()

    @property
    def device(self) -> torch.device:
        return wan.parameter_device(self.transformer)

    def attention_backend(self) -> str:
        """The concrete attention kernel for this model's device (resolved and logged once)."""
        return self._backends.on(self.config.backbone.attention_backend, self.device)

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
        tokens = timestep[:, None].repeat(1, grid[0] * per_frame)
        tokens[:, :per_frame] = 0
        return wan.embed_time_features(self.transformer, timestep_features(tokens, self.transformer.config.freq_dim))

    def _action_time(self, timestep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = timestep_features(timestep, self.action_expert.config.freq_dim)
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
            xv, xa = mot_layers(wan.expert_blocks(tr), wan.expert_blocks(ax), xv.to(dtype), xa.to(dtype), ctx,
                                self.config.backbone.use_gradient_checkpointing)
        with self._precision("projectors") as dtype:
            hidden = wan.output_head(tr, xv[:, per_frame:].to(dtype), temb_v[:, per_frame:])
            video = wan.unpatchify(tr, hidden, (grid[0] - 1, grid[1], grid[2])).float()
            return video, ax.head(xa.to(dtype)).float()

    def loss(self, batch: LossInputs, objective: Objective, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """FastWAM's training loss (:func:`~agents.wam.fastwam.objective.flow_matching_loss`) behind the
        interface every WAM has: ``objective.video_dropout`` is the chance a batch leaves the video term out (its
        actions see only the current frame either way); a FastWAM has no state head (``batch.next_states`` and
        ``objective.state_weight`` have nothing to train) and no world-model mode (``world_model_prob`` must be 0)."""
        if objective.world_model_prob:
            raise ValueError(f"world_model_prob={objective.world_model_prob}: a FastWAM has no world-model mode (it "
                             "never holds actions clean); set world_model_prob=0")
        drop = objective.video_dropout > 0 and torch.rand((), generator=generator).item() < objective.video_dropout
        return flow_matching_loss(self, batch.latents, batch.actions, batch.state, batch.text,
                                  action_is_pad=batch.action_is_pad, generator=generator,
                                  video_weight=0.0 if drop else 1.0, action_weight=objective.action_weight)

    def new_episode_state(self) -> None:
        """None: a FastWAM is stateless, each call conditions on its observation alone."""
        return None

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
