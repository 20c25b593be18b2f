"""FastWAM's embeddings that diffusers' Wan does not have, or computes another way.

* :class:`ProprioEncoder`: the proprio state becomes one more token of the text context (after the
  instruction's tokens), which both experts cross-attend to; FastWAM has no state token among the actions.
* :func:`timestep_features`: Wan's sinusoidal timestep features in float64, as Wan's original code and
  FastWAM compute them (diffusers computes them in float32: up to about 4e-5 apart at freq_dim 256,
  timesteps near 1000).
* :func:`rotary_1d`: the action tokens' positions, a 1-D RoPE over the whole head (the video tokens keep
  Wan's 3-D RoPE), in the interleaved-pair layout :func:`agents.wam.wan_adapter.apply_rotary` rotates.
"""

from __future__ import annotations

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

ROPE_THETA = 10000.0


class ProprioEncoder(ModelMixin, ConfigMixin):
    """(B, state_dim) proprio -> (B, 1, text_dim): one token appended to the instruction's."""

    @register_to_config
    def __init__(self, state_dim: int = 8, text_dim: int = 32):
        super().__init__()
        self.proj = nn.Linear(state_dim, text_dim)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.proj(state.to(self.proj.weight.dtype))[:, None]


def timestep_features(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """(...,) timesteps -> (..., dim) features [cos, sin] of t x 10000^(-i / (dim / 2)), computed in
    float64 and returned in the timesteps' dtype (as theirs: bf16 timesteps give bf16 features)."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=timesteps.device) / half)
    angles = timesteps.double()[..., None] * freqs
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(timesteps.dtype if timesteps.is_floating_point() else torch.float32)


def rotary_1d(length: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (1, length, 1, head_dim), of positions 0..length-1: channel pair i turns by
    position x theta^(-2i / head_dim); each angle is repeated for the pair's two channels."""
    freqs = ROPE_THETA ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float64, device=device), freqs)
    angles = angles.repeat_interleave(2, dim=-1)[None, :, None]
    return angles.cos().float(), angles.sin().float()
