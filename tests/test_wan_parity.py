"""The diffusers seam: the MoT's video path, driven piece by piece through agents.wam.wan_adapter,
is diffusers' own WanTransformer3DModel.forward when the action expert and its tokens are removed.

A diffusers release that renames or changes a Wan internal the adapter reads fails here first."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agents.wam import build_model, preset
from agents.wam import wan_adapter as wan

B = 2
# fp32: on a CPU (diffusers 0.42.1, torch 2.13) the two paths came out bit-identical (max |diff| 0.0
# on outputs of about unit scale); the tolerance leaves room for other kernels (GPU SDPA, fp64 RoPE).
TOL = {"atol": 2e-5, "rtol": 2e-5}


def tiny(**backbone) -> torch.nn.Module:
    torch.manual_seed(0)
    config = preset("tiny")
    return build_model(dataclasses.replace(config, backbone=dataclasses.replace(config.backbone, **backbone)))


@pytest.fixture(scope="module")
def model():
    return tiny()


def inputs(model, frames: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    h, w = model.config.latent_size
    tc = model.transformer.config
    latents = torch.randn(B, tc.in_channels, frames, h, w, generator=g)
    sigma = torch.tensor([0.7, 0.25])
    text = torch.randn(B, 12, tc.text_dim, generator=g)
    text[0, 5:] = 0  # padded prompt positions are zero, as encode_prompt makes them
    return latents, sigma, text


def diffusers_forward(model, latents, sigma, text) -> torch.Tensor:
    """Wan's forward with the MoT's timesteps: 0 for the current frame's tokens, sigma * 1000 after."""
    f, gh, gw = wan.patch_grid(model.transformer, latents.shape)
    timestep = (sigma * 1000)[:, None].repeat(1, f * gh * gw)
    timestep[:, : gh * gw] = 0
    return model.transformer(latents, timestep, text, return_dict=False)[0][:, :, 1:]


@pytest.mark.parametrize("frames", [2, 3])
def test_video_path_without_actions_is_diffusers_forward(model, frames):
    latents, sigma, text = inputs(model, frames)
    with torch.no_grad():
        ours, actions = model(latents, sigma, None, None, None, text)
        ref = diffusers_forward(model, latents, sigma, text)
    assert actions is None and ours.shape == ref.shape == (B, latents.shape[1], frames - 1, *latents.shape[3:])
    torch.testing.assert_close(ours, ref, **TOL)


def test_parity_without_cross_attention_norm():
    # Wan's cross_attn_norm=False makes norm2 an Identity: the adapter must follow that too.
    model = tiny(cross_attn_norm=False)
    latents, sigma, text = inputs(model, 2)
    with torch.no_grad():
        ours = model(latents, sigma, None, None, None, text)[0]
        torch.testing.assert_close(ours, diffusers_forward(model, latents, sigma, text), **TOL)


def test_cached_text_and_gradient_checkpointing_keep_parity(model):
    latents, sigma, text = inputs(model, 3, seed=2)
    with torch.no_grad():
        ref = diffusers_forward(model, latents, sigma, text)
        cache: dict = {}
        for _ in range(2):  # the second call reads the text K/V from the cache
            torch.testing.assert_close(model(latents, sigma, None, None, None, text, cross_kv=cache)[0], ref, **TOL)
    assert "text" not in cache and set(cache) == {("video", i) for i in range(model.config.backbone.num_layers)}
    model.enable_gradient_checkpointing()
    try:
        torch.testing.assert_close(model(latents, sigma, None, None, None, text)[0].detach(), ref, **TOL)
    finally:
        model.enable_gradient_checkpointing(False)


def test_video_path_without_actions_never_touches_the_action_expert(model):
    latents, sigma, text = inputs(model, 2)
    model.zero_grad(set_to_none=True)
    video, _ = model(latents, sigma, None, None, None, text)
    video.square().mean().backward()
    assert all(p.grad is None for p in model.action_expert.parameters())
    assert all(p.grad is not None for p in wan.expert_blocks(model.transformer).parameters())
    model.zero_grad(set_to_none=True)


def test_video_only_forward_needs_future_frames(model):
    latents, sigma, text = inputs(model, 1)
    with pytest.raises(ValueError, match="future frames"):
        model(latents, sigma, None, None, None, text)


def test_image_conditioned_wan_is_refused():
    bb = preset("tiny").backbone
    width = bb.num_attention_heads * bb.attention_head_dim
    i2v = wan.WanTransformer3DModel(**{**bb.transformer_kwargs(), "image_dim": 8, "added_kv_proj_dim": width})
    with pytest.raises(ValueError, match="image-conditioned"):
        wan.check_video_expert(i2v)
