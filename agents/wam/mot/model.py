"""The MoT World Action Model: a Wan video expert and an action expert that share attention.

Components (each a standard library class, saved in its own library's format):
    transformer    diffusers ``WanTransformer3DModel``: the video expert (patchify, blocks, head)
    action_expert  :class:`ActionExpert` (diffusers ``ModelMixin``)
    vae            diffusers ``AutoencoderKLWan``: pixels <-> latents, frozen
    text_encoder   transformers ``UMT5EncoderModel``, frozen; ``tokenizer`` beside it
The encoders' part (building, freezing, precision, encode/decode) is the base class
:class:`~agents.wam.encoders.FrozenEncoders`, shared with FastWAM.

Both experts are trained by flow matching (x_t = (1 - s) x0 + s noise, target noise - x0),
each with its own noise level, conditioned on the clean current-frame latent, the proprio
state and the instruction. The current frame's tokens carry timestep 0 (Wan2.2 TI2V style).
"""

from __future__ import annotations

import logging

import torch
from diffusers import AutoencoderKLWan
from torch import nn
from transformers import UMT5EncoderModel

from agents.wam import wan_adapter as wan
from agents.wam.attention import ResolvedBackends
from agents.wam.encoders import FrozenEncoders
from agents.wam.interface import LossInputs, Objective
from agents.wam.layers import LayerContext, mot_layers
from agents.wam.mot.action_expert import ActionExpert
from agents.wam.mot.config import MoTConfig
from agents.wam.mot.objective import flow_matching_loss
from agents.wam.precision import apply_precision
from agents.wam.wan_adapter import WanTransformer3DModel

logger = logging.getLogger(__name__)


class MoTWAM(FrozenEncoders):
    """Predicts future latent frames and an action chunk from one observation."""

    def __init__(
        self,
        config: MoTConfig,
        transformer: WanTransformer3DModel | None = None,
        action_expert: ActionExpert | None = None,
        vae: AutoencoderKLWan | None = None,
        text_encoder: UMT5EncoderModel | None = None,
        tokenizer=None,
    ):
        super().__init__()
        self.config = config
        bb = config.backbone
        self.transformer = transformer or WanTransformer3DModel(**bb.transformer_kwargs())
        self.action_expert = action_expert or ActionExpert(
            dim=config.action_expert.dim,
            ffn_dim=config.action_expert.ffn_dim,
            num_layers=bb.num_layers,
            num_attention_heads=bb.num_attention_heads,
            attention_head_dim=bb.attention_head_dim,
            action_dim=config.action_dim,
            state_dim=config.state_dim,
            text_dim=bb.text_dim,
            max_actions=config.action_horizon,
            freq_dim=config.action_expert.freq_dim,
            eps=config.action_expert.eps,
            predict_state=config.action_expert.predict_state,
        )
        self._init_encoders(vae, text_encoder, tokenizer)
        self._check_shapes()
        self._apply_precision()
        self._backends = ResolvedBackends()
        self.train(False)

    # ----------------------------------------------------------------- structure
    def _check_shapes(self) -> None:
        tr, ax = self.transformer, self.action_expert
        wan.check_video_expert(tr)
        self._check_fit("MoT", tr, {
            "action expert layers": (len(wan.expert_blocks(ax)), len(wan.expert_blocks(tr))),
            "action expert heads": (ax.config.num_attention_heads, tr.config.num_attention_heads),
        })

    def projector_modules(self) -> list[nn.Module]:
        """Input/output projections and condition embedders of both experts (precision group)."""
        tr, ax = self.transformer, self.action_expert
        heads = [ax.proj_out] if ax.state_out is None else [ax.proj_out, ax.state_out]
        return [*wan.io_modules(tr), ax.state_in, ax.action_in, ax.condition_embedder, *heads]

    def _apply_precision(self) -> None:
        p = self.config.encoder_mode
        for blocks in (wan.expert_blocks(self.transformer), wan.expert_blocks(self.action_expert)):
            apply_precision(blocks, p.backbone)
        for module in self.projector_modules():
            apply_precision(module, p.projectors)
        self._apply_encoder_precision()

    @property
    def device(self) -> torch.device:
        return wan.parameter_device(self.transformer)

    def attention_backend(self) -> str:
        """The concrete attention kernel for this model's device (resolved and logged once)."""
        return self._backends.on(self.config.backbone.attention_backend, self.device)

    def new_episode_state(self) -> None:
        """None: a MoT is stateless, each call conditions on its observation alone."""
        return None

    # ----------------------------------------------------------------- video target
    def video_target(self, current: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        """What the video stream denoises (``model.video_target``), from normalised latents: the
        future (B, C, F', h, w) itself, or its change from the current frame (B, C, 1, h, w)."""
        return future - current if self.config.video_target == "change" else future

    def future_latents(self, current: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`video_target`: the future latents from a denoised target."""
        return current + target if self.config.video_target == "change" else target

    # ----------------------------------------------------------------- denoiser
    def forward(
        self,
        latents: torch.Tensor,
        video_sigma: torch.Tensor,
        actions: torch.Tensor | None,
        action_sigma: torch.Tensor | None,
        state: torch.Tensor | None,
        text: torch.Tensor,
        cross_kv: dict | None = None,
        return_state: bool = False,
    ) -> tuple[torch.Tensor | None, ...]:
        """Flow velocities of the future latents and of the actions.

        latents (B, C, F, h, w): the clean current frame, then F-1 noisy future frames at
        ``video_sigma`` (B,) (F = 1: action-only). actions (B, T, A) noisy at ``action_sigma``
        (B,); state (B, S); text (B, Lt, text_dim) from :meth:`encode_prompt`. ``cross_kv``: a
        dict kept for the whole inference call to reuse the text's cross-attention K/V.
        Returns (B, C, F-1, h, w) (None when F = 1) and (B, T, A); with ``return_state`` also
        (B, T, S), the normalised state after each action (needs ``action_expert.predict_state``).

        ``actions`` None: no action tokens and no action expert, the video expert alone (then
        exactly Wan's forward with the current frame at timestep 0); returns (video, None).
        """
        tr, ax = self.transformer, self.action_expert
        with_actions = actions is not None
        if not with_actions and (return_state or latents.shape[2] == 1):
            raise ValueError("a forward without actions predicts video only: it needs future frames and no return_state")
        grid = wan.patch_grid(tr, latents.shape)
        per_frame = grid[1] * grid[2]

        with self._precision("projectors") as dtype:
            xv = wan.patchify(tr, latents.to(dtype))
            # The current frame is clean: its tokens get timestep 0, the future ones video_sigma.
            t_video = (video_sigma.float() * 1000)[:, None].repeat(1, grid[0] * per_frame)
            t_video[:, :per_frame] = 0
            temb_v, mod_v = wan.time_embedding(tr, t_video)
            video_text, action_text = self._project_text(text.to(dtype), cross_kv, with_actions)
            if with_actions:
                temb_a, mod_a = wan.time_embedding(ax, action_sigma.float() * 1000)
                xa = ax.embed(state.to(dtype), actions.to(dtype))

        with self._precision("backbone") as dtype:
            ctx = LayerContext(
                video_mod=mod_v, action_mod=mod_a if with_actions else None,
                video_text=video_text.to(dtype), action_text=action_text.to(dtype) if with_actions else None,
                rotary=wan.rotary(tr, latents), backend=self.attention_backend(), cross_kv=cross_kv,
            )
            xv = xv.to(dtype)
            xa = xa.to(dtype) if with_actions else None
            action_blocks = wan.expert_blocks(ax) if with_actions else [None] * len(wan.expert_blocks(tr))
            xv, xa = mot_layers(wan.expert_blocks(tr), action_blocks, xv, xa, ctx,
                                self.config.backbone.use_gradient_checkpointing)

        return self._heads(xv, temb_v, xa, temb_a if with_actions else None, grid, return_state)

    def _heads(self, xv, temb_v, xa, temb_a, grid, return_state: bool) -> tuple[torch.Tensor | None, ...]:
        """The experts' output heads: the future frames' velocity (the current frame's tokens dropped), the actions'
        (None without action tokens) and, with ``return_state``, the states after each action."""
        tr, ax, per_frame = self.transformer, self.action_expert, grid[1] * grid[2]
        with self._precision("projectors") as dtype:
            action_velocity = ax.head(xa.to(dtype), temb_a).float() if xa is not None else None
            video_velocity = None
            if grid[0] > 1:
                hidden = wan.output_head(tr, xv[:, per_frame:].to(dtype), temb_v[:, per_frame:])
                video_velocity = wan.unpatchify(tr, hidden, (grid[0] - 1, grid[1], grid[2])).float()
            if return_state:
                return video_velocity, action_velocity, ax.next_states(xa.to(dtype)).float()
        return video_velocity, action_velocity

    def _project_text(
        self, text: torch.Tensor, cross_kv: dict | None, with_actions: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if cross_kv is not None and "text" in cross_kv:
            return cross_kv["text"]
        video = wan.project_text(self.transformer, text)
        if not with_actions:  # not cached: a later call with actions needs both
            return video, None
        projected = video, wan.project_text(self.action_expert, text)
        if cross_kv is not None:
            cross_kv["text"] = projected
        return projected

    # ----------------------------------------------------------------- training
    def loss(self, batch: LossInputs, objective: Objective, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """The flow-matching loss of :func:`agents.wam.mot.objective.flow_matching_loss`."""
        return flow_matching_loss(self, batch, objective, generator)
