"""FastWAM's training objective (their ``FastWAM.training_loss``), for fine-tuning a FastWAM here.

Flow matching on both modalities, each with its own noise level drawn from its own schedule
(:class:`~agents.wam.fastwam.schedule.FlowSchedule`): the current frame stays clean, the loss on the video
covers the future latent frames only, padded frames and padded actions are left out of each row's mean,
and each row's loss is weighted by its schedule's bell over the timestep before the batch mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agents.wam.fastwam.schedule import FlowSchedule


@dataclass
class Draws:
    """A loss's random draws. Drawn by :func:`draw` in FastWAM's order (video noise, video timesteps,
    action noise, action timesteps), so a generator seeded like their global one draws what they draw."""

    video_noise: torch.Tensor  # like the latents (B, C, F, h, w)
    video_timestep: torch.Tensor  # (B,)
    action_noise: torch.Tensor  # like the actions (B, T, A)
    action_timestep: torch.Tensor  # (B,)


def draw(model, latents: torch.Tensor, actions: torch.Tensor, generator: torch.Generator | None = None) -> Draws:
    cfg, batch = model.config, latents.shape[0]

    def noise(like: torch.Tensor) -> torch.Tensor:
        return torch.randn(like.shape, generator=generator, dtype=torch.float32).to(like.device)

    video_noise = noise(latents)
    video_timestep = FlowSchedule(cfg.video_schedule).sample_timesteps(batch, generator, latents.device)
    action_noise = noise(actions)
    action_timestep = FlowSchedule(cfg.action_schedule).sample_timesteps(batch, generator, latents.device)
    return Draws(video_noise, video_timestep, action_noise, action_timestep)


def latent_frame_padding(image_is_pad: torch.Tensor, temporal_factor: int) -> torch.Tensor:
    """(B, T) padded pixel frames -> (B, (T - 1) / factor) padded future latent frames: a latent frame is
    padding when all the pixel frames it encodes are."""
    tail = image_is_pad[:, 1:]
    if tail.shape[1] % temporal_factor:
        raise ValueError(f"image_is_pad covers {image_is_pad.shape[1]} frames; it needs 1 + a multiple of {temporal_factor}")
    return tail.reshape(tail.shape[0], -1, temporal_factor).all(dim=2)


def _row_means(errors: torch.Tensor, is_pad: torch.Tensor | None) -> torch.Tensor:
    """(B, N) errors -> (B,) means over the entries that are not padding (a row all padding gives 0)."""
    if is_pad is None:
        return errors.mean(dim=1)
    valid = (~is_pad.to(errors.device)).to(errors.dtype)
    return (errors * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1.0)


def flow_matching_loss(
    model,
    latents: torch.Tensor,
    actions: torch.Tensor,
    state: torch.Tensor,
    text: torch.Tensor,
    *,
    action_is_pad: torch.Tensor | None = None,
    image_is_pad: torch.Tensor | None = None,
    draws: Draws | None = None,
    generator: torch.Generator | None = None,
    video_weight: float = 1.0,
    action_weight: float = 1.0,
) -> dict[str, torch.Tensor]:
    """``{"loss", "video", "action"}`` on a clip: normalised latents (B, C, F, h, w) with frame 0 the
    current frame, normalised actions (B, T, A), the current proprio (B, S), the instruction's embeddings;
    ``action_is_pad`` (B, T) and ``image_is_pad`` (B, pixel frames) mark what lies past the episode's end.
    ``draws``: the noise and timesteps to use (else drawn from ``generator``). ``video``/``action`` are
    the weighted terms (their ``loss_dict``); ``loss`` is their sum."""
    cfg = model.config
    video_schedule, action_schedule = FlowSchedule(cfg.video_schedule), FlowSchedule(cfg.action_schedule)
    d = draws or draw(model, latents, actions, generator)
    noisy = video_schedule.add_noise(latents, d.video_noise, d.video_timestep)
    noisy[:, :, :1] = latents[:, :, :1]  # the current frame is clean
    noisy_actions = action_schedule.add_noise(actions, d.action_noise, d.action_timestep)
    video_v, action_v = model(noisy, d.video_timestep, noisy_actions, d.action_timestep, text, state)

    video_target = (d.video_noise - latents)[:, :, 1:]
    frame_errors = F.mse_loss(video_v.float(), video_target.float(), reduction="none").mean(dim=(1, 3, 4))
    frame_pad = None if image_is_pad is None else latent_frame_padding(image_is_pad, cfg.vae.scale_factor_temporal)
    video = (_row_means(frame_errors, frame_pad) * video_schedule.training_weight(d.video_timestep)).mean()

    action_errors = F.mse_loss(action_v.float(), (d.action_noise - actions).float(), reduction="none").mean(dim=2)
    action = (_row_means(action_errors, action_is_pad) * action_schedule.training_weight(d.action_timestep)).mean()
    video, action = video_weight * video, action_weight * action
    return {"loss": video + action, "video": video, "action": action}
