"""LingBot-VA's training objective: ours computes what their trainer computes (tests/fixtures/lingbot_va_train, made
by scripts/lingbot_va_train_reference.py with their wan_va/train.py, model.py ``forward_train`` and dataset at
58c2ae5; fp32 on the CPU, their tiny transformer of tests/fixtures/lingbot_va, a batch of 2 clips of 9 latent frames).

Case ``a``: actions at shift 1.0, the noised video context, a window that cuts the mask; case ``b``: shift 0.05 (the
lingbot_va_libero convention's), the clean context, through the whole ``LingBotVA.loss`` call. Our draws from a
generator seeded as their global one are theirs, bit for bit; the clip's actions and mask are their dataset's, bit
for bit; both loss terms agree within 1e-5 relative (+1e-7), each parameter's gradient norm within 1e-4 relative.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from agents.wam.interface import LossInputs, Objective
from agents.wam.lingbot_va.checkpoint import load_transformer
from agents.wam.lingbot_va.config import LingBotVAConfig, LingBotVATraining, preset
from agents.wam.lingbot_va.inputs import convention
from agents.wam.lingbot_va.objective import draw, flow_matching_loss, model_actions
from agents.wam.lingbot_va.schedule import FlowSchedule
from agents.wam.lingbot_va.trained import random_parts
from agents.wam.lingbot_va.wam import LingBotVA

FIXTURES = Path(__file__).parent / "fixtures"
THEIRS = json.loads((FIXTURES / "lingbot_va_train" / "config.json").read_text())
CASES = {case["name"]: case for case in THEIRS["cases"]}
LOSS_TOL = dict(rtol=1e-5, atol=1e-7)
GRAD_TOL = dict(rtol=1e-4, atol=1e-7)
TRAINING = LingBotVATraining(text_dropout=0.0)  # their dataset swaps prompts before the batch: not part of the loss


@pytest.fixture(scope="module")
def io():
    return load_file(str(FIXTURES / "lingbot_va_train" / "io.safetensors"))


@pytest.fixture(scope="module")
def transformer():
    return load_transformer(FIXTURES / "lingbot_va" / "transformer").train().requires_grad_(True)


def _text(io) -> torch.Tensor:
    return F.pad(io["input.text"], (0, 0, 0, THEIRS["text_tokens"] - io["input.text"].shape[1]))


def _clip_actions(io) -> np.ndarray:
    """The clip's env actions after its first frame, in model units: what the training loop's clips carry."""
    steps = (THEIRS["frames"] - 1) * THEIRS["actions_per_frame"]
    return convention("lingbot_va_libero").model_units(io["input.env_actions"].numpy()[:, :steps])


def _libero_config() -> LingBotVAConfig:
    tiny = preset("lingbot_va_tiny")
    return dataclasses.replace(LingBotVAConfig.under(convention("lingbot_va_libero"), tiny.transformer, tiny.vae),
                               training=TRAINING)


def _their_draws(io, name: str) -> list[torch.Tensor]:
    return [io[f"{name}.draw.{key}"] for key in CASES[name]["draws"]]


@pytest.mark.parametrize("shift", [1.0, 5.0, 0.05])
def test_the_training_levels_and_weights_are_theirs(io, shift):
    schedule = FlowSchedule.training(shift)
    torch.testing.assert_close(schedule.timesteps, io[f"table.{shift}.timesteps"], rtol=0, atol=0)
    # float32 exp rounds differently on different CPUs' vector units (the fixture's machine was an AMD EPYC; an Intel
    # Xeon differs by up to 4.5e-6 relative on the smallest weights)
    torch.testing.assert_close(schedule.training_weights(), io[f"table.{shift}.weights"], rtol=1e-5, atol=1e-6)


def test_the_clip_actions_are_their_datasets(io):
    actions, mask = model_actions(_libero_config(), torch.from_numpy(_clip_actions(io)))
    torch.testing.assert_close(actions, io["input.model_actions"], rtol=0, atol=0)
    torch.testing.assert_close(mask, io["input.action_mask"].float(), rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_our_draws_are_theirs(io, name):
    case = CASES[name]
    ours = draw(TRAINING, io["input.latents"].shape, io["input.model_actions"].shape,
                torch.Generator().manual_seed(case["seed"]))
    drawn = [ours.video_levels, ours.video_noise, ours.context_levels, ours.context_noise, ours.action_levels,
             ours.action_noise]
    theirs = _their_draws(io, name)
    assert (ours.chunk, ours.window) == (case["chunk_size"], case["window_size"])
    assert (ours.context_levels is not None) == case["noisy_context"]
    # theirs: u draws (uniforms, made levels by their sample_timestep_id), noises, coins, chunk, window
    uniforms = [t for key, t in zip(case["draws"], theirs) if key.endswith("rand") and t.numel() > 1]
    noises = [t for key, t in zip(case["draws"], theirs) if key.endswith("normal")]
    levels = [(u * 1000).clamp(0, 999).long() for u in uniforms]
    if case["noisy_context"]:
        levels[1] = ((uniforms[1] * 0.5 + 0.5) * 1000).clamp(0, 999).long()
    ours_levels = [x for x in drawn[0::2] if x is not None]
    ours_noises = [x for x in drawn[1::2] if x is not None]
    for got, want in zip(ours_levels, levels, strict=True):
        assert torch.equal(got, want)
    for got, want in zip(ours_noises, noises, strict=True):
        assert torch.equal(got, want.reshape(got.shape))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_loss_and_its_gradients_are_theirs(io, transformer, name):
    case = CASES[name]
    config = preset("lingbot_va_tiny", video_shift=case["video_shift"], action_shift=case["action_shift"],
                    training=TRAINING)
    actions, mask = io["input.model_actions"], io["input.action_mask"]
    draws = draw(TRAINING, io["input.latents"].shape, actions.shape, torch.Generator().manual_seed(case["seed"]))
    transformer.zero_grad(set_to_none=True)
    terms = flow_matching_loss(transformer, config, io["input.latents"], actions, mask, _text(io), draws)
    torch.testing.assert_close(terms["video"].detach(), io[f"{name}.video_loss"], **LOSS_TOL)
    torch.testing.assert_close(terms["action"].detach(), io[f"{name}.action_loss"], **LOSS_TOL)
    (terms["video"] + terms["action"]).backward()
    assert sorted(n for n, p in transformer.named_parameters() if p.grad is not None) == case["parameters"]
    norms = torch.stack([transformer.get_parameter(n).grad.double().norm() for n in case["parameters"]])
    torch.testing.assert_close(norms, io[f"{name}.grad_norms"], **GRAD_TOL)


def test_the_whole_loss_call_is_theirs(io, transformer):
    """Case b through the interface's one loss call: clip actions in model units and the seeded generator in, their
    two terms out (the convention lingbot_va_libero trains its actions at its shift, 0.05)."""
    config = _libero_config()
    parts = random_parts(config)
    model = LingBotVA(config, transformer, parts["vae"], parts["text_encoder"], parts["tokenizer"])
    batch = LossInputs(latents=io["input.latents"], actions=torch.from_numpy(_clip_actions(io)),
                       state=torch.zeros(2, 1), text=_text(io))
    losses = model.loss(batch, Objective(), torch.Generator().manual_seed(CASES["b"]["seed"]))
    torch.testing.assert_close(losses["video"].detach(), io["b.video_loss"], **LOSS_TOL)
    torch.testing.assert_close(losses["action"].detach(), io["b.action_loss"], **LOSS_TOL)
