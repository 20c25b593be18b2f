"""Padded action steps (ClipDataset's ``action_is_pad``: past an episode's end) are out of the loss:
their values change neither the loss nor its gradient; the mean is over real steps only."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from agents.wam import build_model, preset
from agents.wam.interface import LossInputs, Objective
from agents.wam.mot.objective import _masked_mse

B = 3


@pytest.fixture(scope="module")
def model():
    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, action_expert=dataclasses.replace(cfg.action_expert, predict_state=True))
    torch.manual_seed(0)
    return build_model(cfg).train()


@pytest.fixture(scope="module")
def batch(model):
    g = torch.Generator().manual_seed(5)
    cfg, (h, w) = model.config, model.config.latent_size
    t = cfg.action_horizon
    pad = torch.zeros(B, t, dtype=torch.bool)
    pad[0, t - 5 :] = True  # an episode's last steps
    pad[2, 1:] = True  # only the current step is real
    return {
        "latents": torch.randn(B, 4, cfg.latent_frames, h, w, generator=g),
        "actions": torch.rand(B, t, 4, generator=g) * 2 - 1,
        "state": torch.randn(B, 4, generator=g),
        "next_states": torch.randn(B, t, 4, generator=g),
        "text": model.encode_prompt(["reach", "push", "pick"]),
        "action_is_pad": pad,
    }


def loss_and_grads(model, batch, **objective):
    model.zero_grad(set_to_none=True)
    out = model.loss(LossInputs(**batch), Objective(**objective), torch.Generator().manual_seed(0))
    out["loss"].backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return {k: v.detach() for k, v in out.items()}, grads


def garbage_at_pads(batch, value=None):
    pad = batch["action_is_pad"]
    other = dict(batch)
    for key in ("actions", "next_states"):
        x = batch[key].clone()
        x[pad] = torch.randn(int(pad.sum()), x.shape[-1]) * 50 if value is None else value
        other[key] = x
    return other


@pytest.mark.parametrize("world_model_prob", [0.0, 0.5])
def test_padded_values_change_neither_loss_nor_gradient(model, batch, world_model_prob):
    losses, grads = loss_and_grads(model, batch, world_model_prob=world_model_prob)
    for changed in (garbage_at_pads(batch), garbage_at_pads(batch, value=1e4)):
        other_losses, other_grads = loss_and_grads(model, changed, world_model_prob=world_model_prob)
        for key, value in losses.items():
            assert torch.equal(other_losses[key], value), key
        assert torch.equal(other_grads, grads)
    assert torch.isfinite(grads).all() and losses["action_loss"] > 0 and losses["state_loss"] > 0


def test_real_steps_still_count(model, batch):
    losses, _ = loss_and_grads(model, batch)
    moved = dict(batch, actions=batch["actions"].clone())
    moved["actions"][0, 0] += 1.0  # a real step
    assert loss_and_grads(model, moved)[0]["action_loss"] != losses["action_loss"]


def test_without_pads_the_mask_changes_nothing(model, batch):
    plain = dict(batch)
    plain.pop("action_is_pad")
    unpadded = dict(batch, action_is_pad=torch.zeros_like(batch["action_is_pad"]))
    (a, ga), (b, gb) = loss_and_grads(model, plain), loss_and_grads(model, unpadded)
    assert all(torch.equal(a[k], b[k]) for k in a) and torch.equal(ga, gb)


def test_all_padded_rows_add_nothing_and_make_no_nan(model, batch):
    every = dict(batch, action_is_pad=torch.ones_like(batch["action_is_pad"]))
    losses, grads = loss_and_grads(model, every)
    assert losses["action_loss"].item() == 0.0 and losses["state_loss"].item() == 0.0
    assert torch.isfinite(losses["loss"]) and torch.isfinite(grads).all()
    # One all-padded row: it adds nothing, whatever it holds.
    one = batch["action_is_pad"].clone()
    one[1] = True
    row_padded = dict(batch, action_is_pad=one)
    base, base_grads = loss_and_grads(model, row_padded)
    other, other_grads = loss_and_grads(model, garbage_at_pads(row_padded))
    assert torch.equal(base["action_loss"], other["action_loss"]) and torch.equal(base_grads, other_grads)
    assert torch.isfinite(base["loss"])


def test_masked_mse_is_the_mean_over_real_steps():
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(3, 6, 4, generator=g), torch.randn(3, 6, 4, generator=g)
    steps = torch.rand(3, 6, generator=g) > 0.4
    steps[2] = False  # an all-padded row
    want = ((pred - target) ** 2)[steps].mean()
    torch.testing.assert_close(_masked_mse(pred, target, steps), want)
    assert torch.equal(_masked_mse(pred, target, torch.ones(3, 6, dtype=torch.bool)), F.mse_loss(pred, target))
    # Nothing selected: 0 and a zero gradient, even over inf and NaN.
    bad = pred.clone().requires_grad_(True)
    nothing = _masked_mse(bad, torch.full_like(target, float("nan")), torch.zeros(3, 6, dtype=torch.bool))
    nothing.backward()
    assert nothing.item() == 0.0 and torch.equal(bad.grad, torch.zeros_like(pred))
