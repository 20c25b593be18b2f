"""One Mixture-of-Transformers layer: two experts, one attention.

Each expert keeps its own projections, norms and feed-forward; in self-attention the video
tokens and the (state, action) tokens are concatenated, so every token attends to both
modalities. Cross-attention to the text and the feed-forward stay per expert. Blocks are
diffusers ``WanTransformerBlock`` (video) and :class:`~agents.wam.action_expert.ActionBlock`,
which share attribute names, so one function drives both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from agents.wam.attention import attention


@dataclass
class LayerContext:
    """What every layer of one forward pass shares."""

    video_mod: torch.Tensor  # (B, Lv, 6, Dv) per-token timestep modulation of the video expert
    action_mod: torch.Tensor  # (B, 6, Da) timestep modulation of the action expert
    video_text: torch.Tensor  # (B, Lt, Dv) text projected for the video expert
    action_text: torch.Tensor  # (B, Lt, Da) text projected for the action expert
    rotary: tuple[torch.Tensor, torch.Tensor]  # Wan's 3-D RoPE (cos, sin) of the video tokens
    backend: str  # resolved attention backend
    # Cross-attention K/V of the (static) text, per (expert, layer); None recomputes every call.
    cross_kv: dict | None = None


def modulation(block: nn.Module, temb: torch.Tensor) -> list[torch.Tensor]:
    """The block's six adaLN terms (shift, scale, gate for attention; the same for the FFN)."""
    if temb.ndim == 4:  # per-token timesteps (B, L, 6, D)
        return [m.squeeze(2) for m in (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)]
    return list((block.scale_shift_table + temb.float()).chunk(6, dim=1))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs of x (B, L, H, D) by the given angles (Wan's RoPE layout)."""
    even, odd = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2].float(), sin[..., 1::2].float()
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2).type_as(x)


def _heads(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(2, (attn.heads, -1))


def _self_qkv(attn: nn.Module, x: torch.Tensor, rotary=None):
    q = _heads(attn, attn.norm_q(attn.to_q(x)))
    k = _heads(attn, attn.norm_k(attn.to_k(x)))
    v = _heads(attn, attn.to_v(x))
    if rotary is not None:
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    return q, k, v


def _cross_kv(attn: nn.Module, text: torch.Tensor, cache: dict | None, key) -> tuple[torch.Tensor, torch.Tensor]:
    if cache is not None and key in cache:
        return cache[key]
    kv = _heads(attn, attn.norm_k(attn.to_k(text))), _heads(attn, attn.to_v(text))
    if cache is not None:
        cache[key] = kv
    return kv


def _modulated(norm: nn.Module, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (norm(x.float()) * (1 + scale) + shift).type_as(x)


def _gated(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return (x.float() + update.float() * gate).type_as(x)


def _cross_and_ffn(block, x, mod, text, ctx: LayerContext, key) -> torch.Tensor:
    """Per-expert second half of a layer: text cross-attention, then the gated feed-forward."""
    _, _, _, ffn_shift, ffn_scale, ffn_gate = mod
    attn = block.attn2
    q = _heads(attn, attn.norm_q(attn.to_q(block.norm2(x.float()).type_as(x))))
    k, v = _cross_kv(attn, text, ctx.cross_kv, key)
    x = x + attn.to_out[0](attention(q, k, v, ctx.backend).flatten(2))
    return _gated(x, block.ffn(_modulated(block.norm3, x, ffn_shift, ffn_scale)), ffn_gate)


def mot_layer(
    video_block: nn.Module, action_block: nn.Module, xv: torch.Tensor, xa: torch.Tensor, ctx: LayerContext, index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance video tokens ``xv`` (B, Lv, Dv) and action tokens ``xa`` (B, La, Da) by one layer."""
    mv, ma = modulation(video_block, ctx.video_mod), modulation(action_block, ctx.action_mod)
    qv, kv, vv = _self_qkv(video_block.attn1, _modulated(video_block.norm1, xv, mv[0], mv[1]), ctx.rotary)
    qa, ka, va = _self_qkv(action_block.attn1, _modulated(action_block.norm1, xa, ma[0], ma[1]))
    joint = attention(torch.cat([qv, qa], 1), torch.cat([kv, ka], 1), torch.cat([vv, va], 1), ctx.backend)
    ov, oa = joint.flatten(2).split([xv.shape[1], xa.shape[1]], dim=1)
    xv = _gated(xv, video_block.attn1.to_out[0](ov), mv[2])
    xa = _gated(xa, action_block.attn1.to_out[0](oa), ma[2])
    xv = _cross_and_ffn(video_block, xv, mv, ctx.video_text, ctx, ("video", index))
    xa = _cross_and_ffn(action_block, xa, ma, ctx.action_text, ctx, ("action", index))
    return xv, xa
