"""LingBot-VA behind the interface every WAM has (:class:`~agents.wam.interface.WAMModel`): what ``python -m
training`` and the checkpoint functions hold.

:class:`LingBotVA` keeps their transformer (the only part that trains; LoRA adapters go on its blocks as the
``video`` expert) with the frozen parts that feed it: Wan2.2's VAE, UMT5 and its tokenizer. Clips are encoded as
the episode's frames are at inference (:mod:`agents.wam.lingbot_va.observations`: each camera on its own through
the streaming encoder, the first frame alone, then the rest, latents side by side); prompts as their server
encodes them (:mod:`agents.wam.lingbot_va.prompt`). The loss is their training objective
(:mod:`agents.wam.lingbot_va.objective`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from agents.wam.interface import LossInputs, Objective
from agents.wam.lingbot_va.config import LingBotVAConfig, uses_guidance
from agents.wam.lingbot_va.model import LingBotVATransformer
from agents.wam.lingbot_va.objective import draw, flow_matching_loss, frames_in_episode, model_actions
from agents.wam.lingbot_va.observations import encode_frames, new_feature_cache
from agents.wam.lingbot_va.prompt import PromptEncoder
from agents.wam.lingbot_va.state import EpisodeState, new_episode


class LingBotVA(nn.Module):
    """Their transformer, VAE, text encoder and tokenizer, under one config."""

    def __init__(self, config: LingBotVAConfig, transformer: LingBotVATransformer, vae, text_encoder, tokenizer):
        super().__init__()
        if vae.config.z_dim != transformer.config.in_channels or text_encoder.config.d_model != transformer.config.text_dim:
            raise ValueError(f"{config.preset}: the VAE's {vae.config.z_dim} latent channels and UMT5's "
                             f"{text_encoder.config.d_model}-d states must be what the transformer reads "
                             f"({transformer.config.in_channels}, {transformer.config.text_dim})")
        self.config = config
        self.transformer = transformer
        self.vae = vae.requires_grad_(False)
        self.text_encoder = text_encoder.requires_grad_(False)
        self.tokenizer = tokenizer
        self._empty: torch.Tensor | None = None  # the empty prompt's embeddings (text dropout), made once
        self.train(False)

    @property
    def device(self) -> torch.device:
        return self.transformer.patch_embedding_mlp.weight.device

    def train(self, mode: bool = True) -> LingBotVA:
        """Train the transformer; the frozen parts stay in eval mode."""
        super().train(mode)
        self.vae.eval()
        self.text_encoder.eval()
        return self

    def prompt_encoder(self) -> PromptEncoder:
        return PromptEncoder(self.tokenizer, self.text_encoder, self.config.text_tokens)

    # ----------------------------------------------------------------- encoders
    @torch.no_grad()
    def encode_video(self, frames: torch.Tensor) -> torch.Tensor:
        """Pixels (B, 3, T, H, W x cameras) in [-1, 1] -> latents (B, C, 1 + (T-1)/4, h, w x cameras)."""
        cameras = len(self.config.cameras)
        rows = []
        for clip in frames.to(self.device, self.vae.dtype):
            per_camera = torch.stack(clip.chunk(cameras, dim=-1))  # (cameras, 3, T, H, W)
            cache = new_feature_cache(self.vae)
            first = encode_frames(self.vae, per_camera[:, :, :1], cache)
            rows.append(torch.cat([first, encode_frames(self.vae, per_camera[:, :, 1:], cache)], dim=2))
        return torch.cat(rows).float()

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents (B, C, F, h, w x cameras) -> pixels (B, 3, T, H, W x cameras) in [-1, 1]."""
        shape = (1, -1, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean, device=latents.device).view(shape)
        std = torch.tensor(self.vae.config.latents_std, device=latents.device).view(shape)
        cameras = [self.vae.decode((part * std + mean).to(self.vae.dtype)).sample
                   for part in latents.chunk(len(self.config.cameras), dim=-1)]
        return torch.cat(cameras, dim=-1).float().clamp(-1, 1)

    @torch.no_grad()
    def encode_prompt(self, prompts: Sequence[str]) -> torch.Tensor:
        """(B, text_tokens, text_dim): UMT5's states, zero past each prompt (their ``_get_t5_prompt_embeds``)."""
        encoder = self.prompt_encoder()
        return torch.cat([encoder.embed(prompt) for prompt in prompts]).float()

    # ----------------------------------------------------------------- training
    def loss(self, batch: LossInputs, objective: Objective, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Their training loss (:mod:`~agents.wam.lingbot_va.objective`); after their draws, each row's text is the
        empty prompt's with probability ``training.text_dropout`` and ``objective.video_dropout`` may drop the video
        term. Actions weigh ``objective.action_weight``; there is no state head and no world-model mode."""
        if objective.world_model_prob:
            raise ValueError(f"world_model_prob={objective.world_model_prob}: LingBot-VA trains its world model in "
                             "its own objective (the video stream); set world_model_prob=0")
        cfg = self.config
        actions, mask = model_actions(cfg, batch.actions, batch.action_is_pad)
        draws = draw(cfg.training, batch.latents.shape, actions.shape, generator)
        text = self._text_dropout(batch.text, generator)
        drop = objective.video_dropout > 0 and torch.rand((), generator=generator).item() < objective.video_dropout
        valid = frames_in_episode(batch.action_is_pad, batch.latents.shape[2], cfg.action_per_frame)
        terms = flow_matching_loss(self.transformer, cfg, batch.latents, actions, mask, text, draws,
                                   None if valid is None else valid.to(batch.latents.device))
        video = terms["video"] * (0.0 if drop else 1.0)
        action = objective.action_weight * terms["action"]
        return {"loss": video + action, "video": video, "action": action}

    def _text_dropout(self, text: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        rate = self.config.training.text_dropout
        if rate <= 0:
            return text
        dropped = (torch.rand(text.shape[0], generator=generator) < rate).to(text.device)
        if not dropped.any():
            return text
        if self._empty is None:
            self._empty = self.encode_prompt([""])
        return torch.where(dropped[:, None, None], self._empty.to(text), text)

    def enable_gradient_checkpointing(self, enabled: bool = True) -> None:
        self.config.training.gradient_checkpointing = enabled

    def attention_backend(self) -> str:
        return self.transformer.attention_kernel

    def new_episode_state(self) -> EpisodeState:
        """An empty episode under the empty prompt (the served policy makes each episode's own, with its
        instruction and noise seed: :class:`~agents.wam.lingbot_va.policy.LingBotVAPolicy`)."""
        empty = self.encode_prompt([""])
        generator = torch.Generator(self.device)
        return new_episode(self.config, self.vae, empty, empty if uses_guidance(self.config) else None, generator,
                           self.transformer.dtype)
