"""LingBot-VA's inference, one chunk at a time (their wan_va/wan_va_server.py ``_infer`` and ``_compute_kv_cache``),
for one episode or many at once.

:func:`infer_chunk` predicts the next ``frame_chunk_size`` latent frames, then their actions:

1. video: noise denoised over the video schedule, every step a TEMPORARY call that attends to the cache
   (kept past frames and actions) and to itself; guidance mixes the prompted and unprompted rows. One more
   call at timestep 0 writes the denoised latents as PREDICTED.
2. actions: the same over the action schedule, now also attending to the predicted latents, then written as
   PREDICTED. Unused action channels are zeroed before every call and at the end.

In an episode's first chunk, latent frame 0 is the first observation (its latents held at timestep 0) and the
actions of frame 0 are zeros held at timestep 0 (their ``latent_cond``/``action_cond``): that frame is the present,
not predicted, and the client skips its actions.

:func:`feed_back` then replaces the prediction by what happened (their ``_compute_kv_cache``): predicted entries
are cleared, the key frames seen while the chunk ran are encoded by the streaming VAE (after the first
observation's latents, in the first chunk) and written as KEPT at timestep 0, then so is the executed chunk
(model-space actions: normalised, the robot's channels in their places), and the frame index moves on.

Noise is drawn from the episode's generator, latents first, then actions, as their server draws it from the
global one. Actions stay in the model's space here; turning them into robot actions and back is the input
convention's business.

:func:`infer_chunks` and :func:`feed_back_chunks` do the same for several episodes in one batch: every
transformer call stacks the episodes' rows (:class:`~agents.wam.lingbot_va.state.EpisodeBatch`), episodes at
different frames, cache fill and first chunk or not side by side; each keeps its own cache, generator and
streaming VAE state, so its results do not depend on its company. Without action guidance the action stream
runs the prompted row alone: their code also runs the unprompted one, whose actions (and predicted cache
entries, cleared before the next feedback) nothing reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from diffusers import AutoencoderKLWan

from agents.wam.lingbot_va.cache import WriteMode
from agents.wam.lingbot_va.config import LingBotVAConfig
from agents.wam.lingbot_va.model import LingBotVATransformer
from agents.wam.lingbot_va.observations import encode_frames
from agents.wam.lingbot_va.positions import action_positions, video_positions
from agents.wam.lingbot_va.schedule import FlowSchedule
from agents.wam.lingbot_va.state import EpisodeBatch, EpisodeState
from agents.wam.rtc import PrefixGuide


@dataclass
class Chunk:
    """One chunk's prediction."""

    latents: torch.Tensor  # (1, C, F, h, w) video latents (normalised, cameras side by side)
    actions: torch.Tensor  # (1, A, F, N) model-space actions, unused channels zero


def infer_chunk(model: LingBotVATransformer, vae: AutoencoderKLWan, config: LingBotVAConfig, state: EpisodeState,
                first_pixels: torch.Tensor | None = None) -> Chunk:
    """The next chunk of the episode. ``first_pixels`` (cameras, 3, 1, H, W) in [-1, 1]: the first observation,
    needed by the episode's first chunk only."""
    return infer_chunks(model, vae, config, [state], [first_pixels])[0]


@torch.no_grad()
def infer_chunks(model: LingBotVATransformer, vae: AutoencoderKLWan, config: LingBotVAConfig,
                 states: Sequence[EpisodeState], first_pixels: Sequence[torch.Tensor | None],
                 rtc: PrefixGuide | None = None) -> list[Chunk]:
    """The next chunk of each episode, in one batch; ``first_pixels`` as :func:`infer_chunk`'s, one per episode.
    ``rtc``: the action steps guided toward each episode's committed prefix (real-time chunking, agents/wam/rtc.py;
    target and weights in the actions' (E, A, F, N) layout)."""
    batch = EpisodeBatch(states)
    for state, pixels in zip(states, first_pixels, strict=True):
        if state.frame == 0 and not state.started:
            if pixels is None:
                raise ValueError("the episode's first chunk needs first_pixels: the first observation, (cameras, 3, 1, H, W)")
            state.first_latents = encode_frames(vae, pixels, state.vae_cache)
    c, (h, w) = config.transformer.in_channels, config.latent_size
    f, n = config.frame_chunk_size, config.action_per_frame
    noise = []
    for state in states:  # each episode's own draws, in their order
        like = dict(generator=state.generator, device=state.generator.device, dtype=state.text.dtype)
        noise.append((torch.randn((1, c, f, h, w), **like), torch.randn((1, config.transformer.action_dim, f, n), **like)))
    held = {i: state.first_latents for i, state in enumerate(states) if state.frame == 0}  # their first chunks
    latents = _denoise_video(model, config, batch, torch.cat([latent for latent, _ in noise]), held)
    actions = _denoise_actions(model, config, batch, torch.cat([action for _, action in noise]), held.keys(), rtc)
    actions = actions * _kept_channels(config, actions)
    return [Chunk(latents[i : i + 1], actions[i : i + 1]) for i in range(len(states))]


def _denoise_video(model, config: LingBotVAConfig, batch: EpisodeBatch, latents, held: dict) -> torch.Tensor:
    """Latents (E, C, F, h, w) from noise; episode i in ``held`` has its frame 0 held to held[i] at timestep 0."""
    schedule = FlowSchedule.build(config.video_steps, config.video_shift)
    rows, frames = batch.rows, config.frame_chunk_size
    _, p_h, p_w = config.transformer.patch_size
    h, w = config.latent_size
    positions = video_positions(batch.starts(rows), frames, h // p_h, w // p_w)
    for index, t in enumerate([*schedule.timesteps, torch.tensor(0.0)]):  # the extra call writes the result
        last = index == len(schedule)
        frame_t = torch.full((len(batch) * rows, frames), float(t), device=latents.device)
        for i, condition in held.items():
            latents[i : i + 1, :, :1], frame_t[i * rows : (i + 1) * rows, 0] = condition, 0
        velocity = model.video(latents.repeat_interleave(rows, dim=0), frame_t, positions, None, batch.caches,
                               WriteMode.PREDICTED if last else WriteMode.TEMPORARY, batch.text_kv(model, rows))
        if not last:
            latents = schedule.step(latents, _guided(velocity, config.video_guidance, rows), index)
        for i, condition in held.items():
            latents[i : i + 1, :, :1] = condition
    return latents


def _denoise_actions(model, config: LingBotVAConfig, batch: EpisodeBatch, actions, first,
                     rtc: PrefixGuide | None = None) -> torch.Tensor:
    """Actions (E, A, F, N) from noise; episodes in ``first`` have frame 0's actions held to zero at timestep 0."""
    schedule = FlowSchedule.build(config.action_steps, config.action_shift)
    rows = batch.rows if config.action_guidance > 1 else 1  # unguided: the unprompted row would go unused
    frames = config.frame_chunk_size
    positions = action_positions(batch.starts(rows), frames, config.action_per_frame)
    keep = _kept_channels(config, actions)
    for index, t in enumerate([*schedule.timesteps, torch.tensor(0.0)]):
        last = index == len(schedule)
        frame_t = torch.full((len(batch) * rows, frames), float(t), device=actions.device)
        for i in first:
            actions[i, :, :1], frame_t[i * rows : (i + 1) * rows, 0] = 0, 0
        actions = actions * keep

        def velocity_of(a: torch.Tensor, frame_t=frame_t, last=last) -> torch.Tensor:
            velocity = model.action(a.repeat_interleave(rows, dim=0), frame_t, positions, None, batch.caches,
                                    WriteMode.PREDICTED if last else WriteMode.TEMPORARY, batch.text_kv(model, rows))
            return _guided(velocity, config.action_guidance, rows)

        if last:
            velocity_of(actions)  # writes the result as PREDICTED: no step
        elif rtc is None:
            actions = schedule.step(actions, velocity_of(actions), index)
        else:
            actions = schedule.step(actions, rtc.velocity(velocity_of, actions, schedule.sigmas[index]), index)
        for i in first:
            actions[i, :, :1] = 0
    return actions


def feed_back(model: LingBotVATransformer, vae: AutoencoderKLWan, config: LingBotVAConfig, state: EpisodeState,
              pixels: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Write what happened during the last chunk into the cache. ``pixels`` (cameras, 3, T, H, W) in [-1, 1]: the
    key frames seen (4 per latent frame; in the first chunk, all but frame 0's); ``actions`` (1, A, F, N): the
    executed chunk in model space. Returns the latents written (1, C, F, h, w): the real frames the chunk
    predicted (the first observation's first, in the first chunk)."""
    return feed_back_chunks(model, vae, config, [state], [pixels], [actions])[0]


@torch.no_grad()
def feed_back_chunks(model: LingBotVATransformer, vae: AutoencoderKLWan, config: LingBotVAConfig,
                     states: Sequence[EpisodeState], pixels: Sequence[torch.Tensor], actions: Sequence[torch.Tensor]
                     ) -> list[torch.Tensor]:
    """:func:`feed_back` of several episodes in one batch: the key frames and executed chunk of each."""
    if not all(state.started for state in states):
        raise ValueError("feed_back before the episode's first chunk: run infer_chunk first")
    latents = []
    for state, seen in zip(states, pixels, strict=True):  # each through its own streaming VAE state
        state.cache.clear_predicted()
        encoded = encode_frames(vae, seen, state.vae_cache)
        latents.append(torch.cat([state.first_latents, encoded], dim=2) if state.frame == 0 else encoded)
    frames = {latent.shape[2] for latent in latents}
    expected = (1, config.transformer.action_dim, max(frames), config.action_per_frame)
    if len(frames) > 1 or any(tuple(chunk.shape) != expected for chunk in actions):
        raise ValueError(f"executed actions of shapes {sorted({tuple(a.shape) for a in actions})} for key frames making "
                         f"{sorted(frames)} latent frames; each episode's must be (1, action_dim, frames, "
                         f"action_per_frame) = {expected} (4 key frames per frame)")
    batch, rows, stacked = EpisodeBatch(states), states[0].cache.rows, torch.cat(latents)
    _, p_h, p_w = config.transformer.patch_size
    at_rest = torch.zeros(len(batch) * rows, stacked.shape[2], device=stacked.device)
    grid = video_positions(batch.starts(rows), stacked.shape[2], stacked.shape[3] // p_h, stacked.shape[4] // p_w)
    text_kv = batch.text_kv(model, rows)
    model.video(stacked.repeat_interleave(rows, dim=0), at_rest, grid, None, batch.caches, WriteMode.KEPT, text_kv)
    executed = torch.cat([chunk * _kept_channels(config, chunk) for chunk in actions]).to(states[0].text.dtype)
    places = action_positions(batch.starts(rows), stacked.shape[2], config.action_per_frame)
    model.action(executed.repeat_interleave(rows, dim=0), at_rest, places, None, batch.caches, WriteMode.KEPT, text_kv)
    for state in states:
        state.frame += stacked.shape[2]
    return latents


def _guided(velocity: torch.Tensor, scale: float, rows: int) -> torch.Tensor:
    """Their classifier-free guidance, per episode of ``rows`` rows: unprompted + scale (prompted - unprompted); no
    guidance: the prompted row."""
    velocity = velocity.unflatten(0, (-1, rows))
    if scale > 1:
        return velocity[:, 1] + scale * (velocity[:, 0] - velocity[:, 1])
    return velocity[:, 0]


def _kept_channels(config: LingBotVAConfig, like: torch.Tensor) -> torch.Tensor:
    """(A, 1, 1): 1 on the robot's action channels, 0 elsewhere (multiplying, as theirs, keeps -0.0 where they do)."""
    keep = torch.zeros(config.transformer.action_dim, 1, 1, dtype=like.dtype, device=like.device)
    keep[list(config.action_channels)] = 1
    return keep
