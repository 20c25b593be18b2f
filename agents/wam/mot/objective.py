"""MoTWAM's training objective: flow matching on the future latents and the action chunk, each with its own noise
level, and the world-model mode in which a row's actions are given clean (``objective.world_model_prob``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from agents.wam.interface import LossInputs, Objective


def flow_matching_loss(model, batch: LossInputs, objective: Objective, generator: torch.Generator | None = None
                       ) -> dict[str, torch.Tensor]:
    """MoTWAM's (``model``) flow-matching loss on a clip's normalised latents (B, C, F, h, w) (frame 0 = the
    current frame) and normalised actions (B, T, A). Video and actions draw independent
    noise levels (logit-normal), so either can be denoised while the other is noisy.

    ``objective.video_dropout``: the chance a batch is trained action-only (video_mode=action_only).
    ``objective.world_model_prob``: the chance a row gets its actions clean (noise level 0) and learns
    only the video (and, with ``batch.next_states`` (B, T, S) and a state head, the states) that
    follow from them: the world-model mode of :class:`agents.wam.mot.world_model.WorldModel`.

    ``batch.action_is_pad`` (B, T) bool: steps past the episode's end (``ClipDataset``'s key of that
    name). They are left out of the action and state losses (a mean over real steps only; a
    row with none adds nothing) and, as model input, hold the row's last real action, so
    neither the losses nor their gradients depend on the values at padded steps."""
    latents, actions, next_states = batch.latents, batch.actions, batch.next_states
    world_model_prob = objective.world_model_prob
    b, device = latents.shape[0], latents.device
    real = torch.ones(actions.shape[:2], dtype=torch.bool, device=device)
    if batch.action_is_pad is not None:
        real = ~batch.action_is_pad.to(device=device, dtype=torch.bool)
        actions = _hold_last_real(actions, real)
    # Draws happen on the CPU generator so a seeded loss is the same on every device.
    sigma_v, sigma_a = torch.sigmoid(torch.randn(2, b, generator=generator)).to(device)
    action_only = bool(torch.rand((), generator=generator) < objective.video_dropout) or latents.shape[2] == 1
    current, target = latents[:, :, :1], model.video_target(latents[:, :, :1], latents[:, :, 1:])
    noise_v = torch.randn(target.shape, generator=generator).to(device)
    noise_a = torch.randn(actions.shape, generator=generator).to(device)
    given = torch.zeros(b, dtype=torch.bool)
    if world_model_prob > 0 and not action_only:  # drawn only when used: other runs keep their noise
        given = torch.rand(b, generator=generator) < world_model_prob
    given = given.to(device)
    sigma_a = torch.where(given, torch.zeros_like(sigma_a), sigma_a)
    noisy_actions = _interpolate(actions, noise_a, sigma_a)
    video_in = current if action_only else torch.cat([current, _interpolate(target, noise_v, sigma_v)], 2)
    with_state = next_states is not None and model.action_expert.state_out is not None
    video_pred, action_pred, *state_pred = model(
        video_in, sigma_v, noisy_actions, sigma_a, batch.state, batch.text, return_state=with_state
    )
    action_loss = _masked_mse(action_pred, noise_a - actions, (~given)[:, None] & real)
    video_loss = torch.zeros((), device=device) if action_only else F.mse_loss(video_pred, noise_v - target)
    losses = {"video_loss": video_loss, "action_loss": action_loss}
    total = video_loss + objective.action_weight * action_loss
    if with_state:
        # Trained where the actions were given, as in world-model inference (all rows if none are).
        rows = given if world_model_prob > 0 else torch.ones_like(given)
        losses["state_loss"] = _masked_mse(state_pred[0], next_states.to(device), rows[:, None] & real)
        total = total + objective.state_weight * losses["state_loss"]
    return {"loss": total, **losses}



def _masked_mse(pred: torch.Tensor, target: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """MSE of (B, T, D) predictions over the selected (row, step) pairs ``steps`` (B, T), each
    step weighing the same (0 when none is selected); plain MSE when all are, bit for bit.
    Unselected steps add exactly nothing, to the value or the gradient, whatever they hold (inf and NaN too)."""
    if bool(steps.all()):
        return F.mse_loss(pred, target)
    diff = torch.where(steps[..., None], pred - target, torch.zeros_like(pred))
    return (diff**2).mean(-1).sum() / steps.sum().clamp(min=1)


def _hold_last_real(actions: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, T, A) actions with every padded step (``real`` False) replaced by the row's last real
    action before it (zeros where none is): what ClipDataset pads with, from real values only."""
    steps = torch.arange(actions.shape[1], device=actions.device).expand_as(real)
    last = torch.where(real, steps, torch.full_like(steps, -1)).cummax(dim=1).values
    held = actions.gather(1, last.clamp(min=0)[..., None].expand_as(actions))
    return torch.where((last >= 0)[..., None], held, torch.zeros_like(actions))


def _interpolate(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    s = sigma.view(-1, *([1] * (x0.ndim - 1)))
    return (1 - s) * x0 + s * noise
