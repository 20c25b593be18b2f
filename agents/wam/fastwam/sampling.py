"""FastWAM's two inference modes, from noise to an action chunk.

* :func:`sample_actions` (``video_mode=action_only``, their ``infer_action``, what their LIBERO evaluation
  runs): the current frame's keys/values once, then only the action expert at each step.
* :func:`sample_joint` (``video_mode=joint``, their ``infer_joint``): both experts at each step; also
  returns the denoised future latents. Its actions equal :func:`sample_actions`' (the block mask keeps the
  actions from seeing the future video), as FastWAM itself checks.

Each modality steps on its own schedule (``config.video_schedule``, ``config.action_schedule``); ``shift``
overrides both inference shifts at once, as their ``sigma_shift`` does. Noise is an input: pass
:func:`their_noise` to draw exactly what their code draws for a seed.
"""

from __future__ import annotations

import torch

from agents.wam.fastwam.model import CallCache, FastWAM
from agents.wam.fastwam.schedule import FlowSchedule, euler_step


def their_noise(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 CPU noise FastWAM draws for ``seed``: each modality from its own generator seeded
    with ``seed`` (their video noise also covers the current frame, which they then overwrite)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _grid(schedule, steps: int, shift: float | None, batch: int, device):
    timesteps, deltas = FlowSchedule(schedule).inference(steps, shift, device)
    return [(t.expand(batch), d) for t, d in zip(timesteps, deltas)]


@torch.no_grad()
def sample_actions(
    model: FastWAM, current: torch.Tensor, text: torch.Tensor, state: torch.Tensor, noise: torch.Tensor,
    steps: int, shift: float | None = None,
) -> torch.Tensor:
    """(B, T, A) normalised actions from the current frame's latents (B, C, 1, h, w), the instruction's
    embeddings (B, Lt, text_dim), the normalised proprio (B, S) and the action noise (B, T, A)."""
    cache, actions = CallCache(), noise.to(model.device).float()
    for timestep, delta in _grid(model.config.action_schedule, steps, shift, actions.shape[0], model.device):
        velocity = model.action_velocity(current, actions, timestep, text, state, cache)
        actions = euler_step(actions, velocity, delta)
    return actions


@torch.no_grad()
def sample_joint(
    model: FastWAM, current: torch.Tensor, text: torch.Tensor, state: torch.Tensor, video_noise: torch.Tensor,
    action_noise: torch.Tensor, steps: int, shift: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(future latents (B, C, F-1, h, w), actions (B, T, A)), denoised together; ``video_noise`` covers
    the future frames only."""
    cache, batch = CallCache(), current.shape[0]
    future, actions = video_noise.to(model.device).float(), action_noise.to(model.device).float()
    video_grid = _grid(model.config.video_schedule, steps, shift, batch, model.device)
    action_grid = _grid(model.config.action_schedule, steps, shift, batch, model.device)
    for (video_t, video_d), (action_t, action_d) in zip(video_grid, action_grid):
        latents = torch.cat([current, future], dim=2)
        video_v, action_v = model(latents, video_t, actions, action_t, text, state, cache)
        future, actions = euler_step(future, video_v, video_d), euler_step(actions, action_v, action_d)
    return future, actions
