"""LingBot-VA's training objective (their wan_va/train.py at 58c2ae5), through our transformer's teacher-forced call.

A batch is clips of F latent frames, each with ``action_per_frame`` actions per frame. Frame 0's actions are the
zero condition their dataset puts there (``_action_post_process`` pads the env actions with zeros in front, then
normalises: the normalised physical zero, trained like every other frame). Per batch their trainer draws, in this
order (:func:`draw`, from one generator: a seeded one draws what their seeded global generator draws):

1. a training level per latent frame for the noisy video (``sample_timestep_id``: uniform over the 1000 levels of
   the video schedule, shift ``snr_shift``), shared by the batch's rows, and the video's noise;
2. with probability ``noisy_context`` (their 0.5) the clean video context is noised too, at a level per frame from
   the less noisy half, with noise of its own (its timesteps then condition that context);
3. the actions' level per frame (shift ``action_snr_shift``) and noise, and the actions' noisy-context coin (its
   probability is 0 in their trainer, but it is drawn);
4. the chunk size (1..4 latent frames a block) and the window (4..64 blocks) of the mask
   (:func:`~agents.wam.lingbot_va.teacher.block_causal_mask`).

Noisy samples are ``(1 - sigma) x + sigma noise`` and the targets ``noise - x`` (flow matching); the actions'
unused channels are masked out of the samples, the targets and the context. Each frame's squared error is weighted
by its level's bell weight (:meth:`~agents.wam.lingbot_va.schedule.FlowSchedule.training_weights`) and averaged
over the frame (the actions' over their used channels), then over rows and frames. The loss is the video term
plus the action term (their ``_train_step``). Frames past an episode's end (padded clips; their whole-episode
samples have none) are left out of both terms' frames but still counted in the mean, as their masked action
frames are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from agents.wam.lingbot_va.config import LingBotVAConfig, LingBotVATraining
from agents.wam.lingbot_va.model import LingBotVATransformer
from agents.wam.lingbot_va.schedule import NUM_TRAIN_TIMESTEPS, FlowSchedule
from agents.wam.lingbot_va.teacher import Streams, block_causal_mask

NOISY_CONTEXT_LOW = 0.5  # a noised context's level is drawn from the less noisy half (their min_timestep_bd)


@dataclass
class Draws:
    """One batch's random draws (see the module docstring); levels index the 1000-level training schedules."""

    video_levels: torch.Tensor  # (F,) int64
    video_noise: torch.Tensor  # like the latents
    context_levels: torch.Tensor | None  # (F,) int64; None: the video context is clean
    context_noise: torch.Tensor | None  # like the latents
    action_levels: torch.Tensor  # (F,) int64
    action_noise: torch.Tensor  # like the model actions (B, A, F, N)
    chunk: int  # latent frames per block of the mask
    window: int  # blocks a query sees either side


def _levels(frames: int, generator: torch.Generator | None, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    u = torch.rand(frames, generator=generator) * (high - low) + low
    return (u * NUM_TRAIN_TIMESTEPS).clamp(min=0, max=NUM_TRAIN_TIMESTEPS - 1).to(torch.int64)


def _noise(shape, generator: torch.Generator | None) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32)


def draw(training: LingBotVATraining, latents_shape, actions_shape, generator: torch.Generator | None = None) -> Draws:
    """Their ``_prepare_input_dict``'s draws, in their order, on the CPU (moved to the batch's device later)."""
    frames = latents_shape[2]
    video_levels, video_noise = _levels(frames, generator), _noise(latents_shape, generator)
    context_levels = context_noise = None
    if torch.rand(1, generator=generator).item() < training.noisy_context:
        context_levels, context_noise = _levels(frames, generator, low=NOISY_CONTEXT_LOW), _noise(latents_shape, generator)
    action_levels, action_noise = _levels(frames, generator), _noise(actions_shape, generator)
    torch.rand(1, generator=generator)  # the actions' noisy-context coin: never taken, but it moves the generator
    (low, high), (w_low, w_high) = training.chunk_sizes, training.windows
    chunk = int(torch.randint(low, high + 1, (1,), generator=generator).item())
    window = int(torch.randint(w_low, w_high + 1, (1,), generator=generator).item())
    return Draws(video_levels, video_noise, context_levels, context_noise, action_levels, action_noise, chunk, window)


def model_actions(config: LingBotVAConfig, actions: torch.Tensor, is_pad: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip actions (B, T, C) in model units (the convention's ``model_units``), T = (F - 1) x action_per_frame ->
    (actions, mask), each (B, A, F, N): frame 0 the normalised physical zero, the robot's channels in their places,
    the others 0 and masked, padded steps (``is_pad`` (B, T)) 0 and masked."""
    b, steps, c = actions.shape
    n, channels = config.action_per_frame, list(config.action_channels)
    if steps % n or c != len(channels):
        raise ValueError(f"clip actions of shape {tuple(actions.shape)}: LingBot-VA takes (batch, latent frames x "
                         f"{n}, {len(channels)}), each latent frame's actions after the first")
    zero = torch.from_numpy(config.convention().model_units(np.zeros(c))).to(actions)
    chunk = torch.cat([zero.expand(b, n, c), actions], dim=1).transpose(1, 2)  # (B, C, F N)
    keep = torch.ones(b, 1, steps + n, dtype=actions.dtype, device=actions.device)
    if is_pad is not None:
        keep[:, 0, n:] = (~is_pad.to(actions.device)).to(actions.dtype)
    out = actions.new_zeros(b, config.transformer.action_dim, steps + n)
    mask = torch.zeros_like(out)
    out[:, channels], mask[:, channels] = chunk * keep, keep.expand(-1, c, -1)
    return out.unflatten(2, (-1, n)), mask.unflatten(2, (-1, n))


def _noised(clean: torch.Tensor, noise: torch.Tensor, schedule: FlowSchedule, levels: torch.Tensor) -> torch.Tensor:
    """``(1 - sigma) x + sigma noise`` with each latent frame (axis 2) at its level."""
    shape = [1] * clean.ndim
    shape[2] = levels.numel()
    sigma = schedule.sigmas[levels.cpu()].to(clean).view(shape)
    return (1 - sigma) * clean + sigma * noise


def _streams(latents, actions, mask, draws: Draws, video: FlowSchedule, action: FlowSchedule,
             dtype: torch.dtype) -> Streams:
    """The four groups, noised in fp32, in the transformer's ``dtype`` (bf16 weights under DeepSpeed take bf16, as
    their forward_train casts them)."""
    b, frames = latents.shape[0], latents.shape[2]
    on = latents.device

    def rows(values: torch.Tensor) -> torch.Tensor:
        return values.to(on)[None].repeat(b, 1)

    noise = {k: v.to(on) for k, v in (("video", draws.video_noise), ("action", draws.action_noise))}
    context, context_t = latents, torch.zeros(frames)
    if draws.context_levels is not None:
        context = _noised(latents, draws.context_noise.to(on), video, draws.context_levels)
        context_t = video.timesteps[draws.context_levels]
    return Streams(
        noisy_video=_noised(latents, noise["video"], video, draws.video_levels).to(dtype),
        video_t=rows(video.timesteps[draws.video_levels]), context_video=context.to(dtype), context_t=rows(context_t),
        noisy_actions=(_noised(actions, noise["action"], action, draws.action_levels) * mask).to(dtype),
        action_t=rows(action.timesteps[draws.action_levels]), context_actions=(actions * mask).to(dtype),
        context_action_t=rows(torch.zeros(frames)),
    )


def _per_frame(errors: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, X, F, ...) squared errors -> (B, F): weighted by each frame's level, summed over the frame, divided by
    what the mask counts there (+1e-6, theirs)."""
    shape = [1] * errors.ndim
    shape[2] = weights.numel()
    errors = errors * weights.to(errors).view(shape)
    if mask is not None:
        errors = errors * mask
    frames = errors.movedim(1, -1).flatten(2)  # (B, F, rest), channels innermost as their permute
    counted = torch.ones_like(frames) if mask is None else mask.movedim(1, -1).flatten(2).to(frames)
    return frames.sum(dim=2) / (counted.sum(dim=2) + 1e-6)


def flow_matching_loss(model: LingBotVATransformer, config: LingBotVAConfig, latents: torch.Tensor,
                       actions: torch.Tensor, mask: torch.Tensor, text: torch.Tensor, draws: Draws,
                       frame_valid: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``{"video", "action"}``: their two loss terms for latents (B, C, F, h, w), model actions and mask (B, A, F, N)
    (:func:`model_actions`), prompt embeddings (B, Lt, text_dim) and ``draws``; ``frame_valid`` (B, F) leaves out
    frames past the episode's end."""
    video, action = FlowSchedule.training(config.video_shift), FlowSchedule.training(config.action_shift)
    mask, dtype = mask.to(actions), model.patch_embedding_mlp.weight.dtype
    streams = _streams(latents, actions, mask, draws, video, action, dtype)
    _, p_h, p_w = config.transformer.patch_size
    per_frame = (latents.shape[3] // p_h) * (latents.shape[4] // p_w)
    attend = block_causal_mask(latents.shape[2], per_frame, actions.shape[-1], draws.chunk, draws.window, latents.device)
    video_v, action_v = model.teacher_forced(streams, text.to(dtype), attend, config.training.gradient_checkpointing)
    video_target = draws.video_noise.to(latents) - latents
    action_target = (draws.action_noise.to(actions) - actions) * mask
    video_frames = _per_frame(F.mse_loss(video_v.float(), video_target.float(), reduction="none"),
                              video.training_weights()[draws.video_levels], None)
    action_frames = _per_frame(F.mse_loss(action_v.float(), action_target.float(), reduction="none"),
                               action.training_weights()[draws.action_levels], mask.float())
    if frame_valid is not None:
        video_frames, action_frames = video_frames * frame_valid, action_frames * frame_valid
    return {"video": video_frames.mean(), "action": action_frames.mean()}


def frames_in_episode(is_pad: torch.Tensor | None, frames: int, per_frame: int) -> torch.Tensor | None:
    """(B, F) float: 0 for a latent frame all of whose actions lie past the episode's end (frame 0 never does)."""
    if is_pad is None:
        return None
    past = is_pad.unflatten(1, (frames - 1, per_frame)).all(dim=2)
    return torch.cat([torch.zeros_like(past[:, :1]), past], dim=1).logical_not().float()
