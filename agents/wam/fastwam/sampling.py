"""FastWAM's two inference modes, from noise to an action chunk.

* :func:`sample_actions` (``video_mode=action_only``, their ``infer_action``, what their LIBERO evaluation
  runs): the current frame's keys/values once, then only the action expert at each step.
* :func:`sample_joint` (``video_mode=joint``, their ``infer_joint``): both experts at each step; also
  returns the denoised future latents. Its actions equal :func:`sample_actions`' (the block mask keeps the
  actions from seeing the future video), as FastWAM itself checks.

Each modality steps on its own schedule (``config.video_schedule``, ``config.action_schedule``); ``shift``
overrides both inference shifts at once, as their ``sigma_shift`` does. Noise is an input: :func:`their_noise`
draws exactly what their code draws for a seed (:func:`their_row_noise`: a row's, both modalities).

``config.sampler_precision`` says in which dtype the noise, the timesteps and the Euler steps are kept:
``fp32`` (ours), or ``model_dtype``, the backbone's, as their code does (under bf16 their timesteps are
rounded to bf16 before the model sees them, and every Euler step adds in bf16). An fp32 model is the same
either way; docs/fastwam_libero.md measures the two under bf16.
"""

from __future__ import annotations

import torch

from agents.wam.fastwam.model import CallCache, FastWAM
from agents.wam.fastwam.schedule import FlowSchedule, euler_step
from agents.wam.precision import module_dtype
from agents.wam.rtc import PrefixGuide


def their_noise(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 CPU noise FastWAM draws for ``seed`` and ``shape``: from a generator of its own seeded with
    ``seed`` (one per modality, so each modality's noise starts afresh from the seed)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def their_row_noise(seed: int, action_shape: tuple[int, ...], video_shape: tuple[int, ...] | None = None) -> dict:
    """One row's noise as their ``infer_joint`` draws it for ``seed`` (``infer_action`` draws the actions' alone):
    ``action`` (T, A); ``video`` the future latents' (C, F - 1, h, w) of ``video_shape`` (C, F, h, w), which
    they draw with the current frame and then overwrite it."""
    noise = {"action": their_noise(seed, action_shape)}
    if video_shape is not None:
        noise["video"] = their_noise(seed, video_shape)[:, 1:]
    return noise


def sampler_dtype(model: FastWAM) -> torch.dtype:
    """The dtype the sampler keeps noise, timesteps and steps in (``config.sampler_precision``)."""
    if model.config.sampler_precision == "model_dtype":
        return module_dtype(model.config.encoder_mode.backbone)
    return torch.float32


def _grid(schedule, steps: int, shift: float | None, batch: int, model: FastWAM):
    timesteps, deltas = FlowSchedule(schedule).inference(steps, shift, model.device)
    dtype = sampler_dtype(model)  # their grid is float32, then cast to the latents' dtype
    return [(t.to(dtype).expand(batch), d.to(dtype)) for t, d in zip(timesteps, deltas)]


@torch.no_grad()
def sample_actions(
    model: FastWAM, current: torch.Tensor, text: torch.Tensor, state: torch.Tensor, noise: torch.Tensor,
    steps: int, shift: float | None = None, rtc: PrefixGuide | None = None,
) -> torch.Tensor:
    """(B, T, A) normalised float32 actions from the current frame's latents (B, C, 1, h, w), the
    instruction's embeddings (B, Lt, text_dim), the normalised proprio (B, S) and the action noise (B, T, A).
    ``rtc``: each step's velocity guided toward the committed prefix (real-time chunking, agents/wam/rtc.py)."""
    cache, actions = CallCache(), noise.to(model.device).to(sampler_dtype(model))
    for timestep, delta in _grid(model.config.action_schedule, steps, shift, actions.shape[0], model):
        def velocity_of(a: torch.Tensor, timestep=timestep) -> torch.Tensor:
            return model.action_velocity(current, a, timestep, text, state, cache)

        velocity = velocity_of(actions) if rtc is None else rtc.velocity(velocity_of, actions, _sigma(timestep, model))
        actions = euler_step(actions, velocity, delta)
    return actions.float()


def _sigma(timestep: torch.Tensor, model: FastWAM) -> torch.Tensor:
    """A step's noise level per row (the model is told ``sigma x num_train_timesteps``)."""
    return timestep.float() / float(model.config.action_schedule.num_train_timesteps)


@torch.no_grad()
def sample_joint(
    model: FastWAM, current: torch.Tensor, text: torch.Tensor, state: torch.Tensor, video_noise: torch.Tensor,
    action_noise: torch.Tensor, steps: int, shift: float | None = None, rtc: PrefixGuide | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(future latents (B, C, F-1, h, w), actions (B, T, A)), denoised together, float32; ``video_noise``
    covers the future frames only. ``rtc`` as :func:`sample_actions`' (the video is not steered)."""
    cache, batch, dtype = CallCache(), current.shape[0], sampler_dtype(model)
    future, actions = video_noise.to(model.device).to(dtype), action_noise.to(model.device).to(dtype)
    video_grid = _grid(model.config.video_schedule, steps, shift, batch, model)
    action_grid = _grid(model.config.action_schedule, steps, shift, batch, model)
    for (video_t, video_d), (action_t, action_d) in zip(video_grid, action_grid):
        latents, video = torch.cat([current.to(dtype), future], dim=2), []

        def velocity_of(a: torch.Tensor, latents=latents, video_t=video_t, action_t=action_t, video=video) -> torch.Tensor:
            video_v, action_v = model(latents, video_t, a, action_t, text, state, cache)
            video.append(video_v.detach())
            return action_v

        action_v = velocity_of(actions) if rtc is None else rtc.velocity(velocity_of, actions, _sigma(action_t, model))
        video_v = video[0]
        future, actions = euler_step(future, video_v, video_d), euler_step(actions, action_v, action_d)
    return future.float(), actions.float()
