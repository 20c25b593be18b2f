"""Every registered WAM architecture has the same shape and the one model interface.

Its package's ``ARCHITECTURE`` resolves to a config class, presets, a policy and build/load/save; its tiny
model is a :class:`~agents.wam.interface.WAMModel` that trains through the one loss call (``LossInputs``,
``Objective``, a generator) and declares its per-episode state: none for the stateless MoT and FastWAM, LingBot-VA's
cache and streaming encoder for it.
"""

from __future__ import annotations

import pytest
import torch

from agents.wam.architectures import PACKAGES, Architecture, named, of_checkpoint, of_config
from agents.wam.config import ModelConfig
from agents.wam.interface import LossInputs, Objective, WAMModel
from agents.wam.policy import WAMPolicy

# A CPU-sized config of each architecture (a new one adds its own here).
TINY = {
    "mot": lambda arch: arch.preset_makers()["tiny"](),
    "fastwam": lambda arch: arch.preset_makers()["fastwam_tiny"](),
    "lingbot_va": lambda arch: arch.preset_makers()["lingbot_va_libero_tiny"](),
}
REMEMBERS_EPISODES = {"lingbot_va"}  # its policy keeps each episode's state, and loads its checkpoints itself
B = 2


@pytest.fixture(scope="module", params=sorted(PACKAGES))
def tiny(request) -> tuple[Architecture, WAMModel]:
    arch = named(request.param)
    torch.manual_seed(0)
    return arch, arch.build_model(TINY[arch.name](arch)).train()


def test_every_architecture_is_tested_here():
    assert sorted(TINY) == sorted(PACKAGES)


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_the_package_record_resolves_every_role(name):
    arch = named(name)
    assert (arch.name, arch.package) == (name, PACKAGES[name])
    policy = arch.policy_class()
    assert issubclass(arch.config_class(), ModelConfig)
    assert issubclass(policy, WAMPolicy) != (name in REMEMBERS_EPISODES) and callable(policy.from_checkpoint)
    assert all(callable(arch.export(role)) for role in (arch.build, arch.load, arch.save))
    for preset, make in arch.preset_makers().items():
        config = make()
        assert type(config) is arch.config_class() and config.preset == preset
        assert of_config(config) == arch  # its saved "architecture" names this package again


def test_preset_names_are_unique_across_architectures():
    names = [preset for name in PACKAGES for preset in named(name).preset_makers()]
    assert len(names) == len(set(names))  # one Hydra group, model=<preset>, holds them all


def test_the_tiny_model_is_a_wam_model_that_declares_its_episode_state(tiny):
    arch, model = tiny
    assert isinstance(model, WAMModel)
    assert (model.new_episode_state() is None) == (arch.name not in REMEMBERS_EPISODES)


def loss_inputs(model) -> LossInputs:
    cfg, g = model.config, torch.Generator().manual_seed(1)
    h, w = cfg.latent_size
    state_dim = cfg.state_dim or 1  # LingBot-VA never sees proprioception
    pad = torch.zeros(B, cfg.action_horizon, dtype=torch.bool)
    pad[1, -3:] = True
    return LossInputs(
        latents=torch.randn(B, cfg.vae.z_dim, cfg.latent_frames, h, w, generator=g),
        actions=torch.rand(B, cfg.action_horizon, cfg.action_dim, generator=g) * 2 - 1,
        state=torch.randn(B, state_dim, generator=g),
        text=model.encode_prompt(["reach", "push"]),
        next_states=torch.randn(B, cfg.action_horizon, state_dim, generator=g),
        action_is_pad=pad,
    )


def test_the_loss_trains_through_the_interface(tiny):
    arch, model = tiny
    inputs = loss_inputs(model)
    model.zero_grad(set_to_none=True)
    first = model.loss(inputs, Objective(), torch.Generator().manual_seed(0))
    again = model.loss(inputs, Objective(), torch.Generator().manual_seed(0))
    assert torch.isfinite(first["loss"]) and first["loss"].item() > 0
    assert all(torch.equal(first[k], again[k]) for k in first)  # every draw is the generator's
    weighted = model.loss(inputs, Objective(action_weight=2.0), torch.Generator().manual_seed(0))
    assert weighted["loss"].item() > first["loss"].item()  # the objective reaches the loss
    first["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_from_checkpoint_serves_the_checkpoint_with_its_architecture_policy(tiny_ckpt):
    from agents.wam.fastwam.policy import FastWAMPolicy
    from agents.wam.mot.policy import MoTPolicy

    assert of_checkpoint(tiny_ckpt).name == "mot"
    assert type(WAMPolicy.from_checkpoint(tiny_ckpt)) is MoTPolicy
    with pytest.raises(ValueError, match="holds a mot model, which FastWAMPolicy does not serve; load it with MoTPolicy"):
        FastWAMPolicy.from_checkpoint(tiny_ckpt)


def test_the_shared_policy_needs_an_architecture(tiny):
    with pytest.raises(TypeError, match="abstract"):
        WAMPolicy(tiny[1])
