"""FastWAM's action-only inference, layer by layer: the current frame's keys and values once, then
the actions against them at every denoising step.

The block mask (:mod:`agents.wam.fastwam.mask`) lets the current frame see only itself and the actions
see only the current frame and each other, so with the future frames left out the video tokens do not
change within a call: :func:`video_keys_values` runs the video expert over them once (timestep 0) and
keeps each layer's self-attention keys and values; :func:`action_layers` then advances only the action
tokens, each layer attending to that layer's cached video keys/values and its own. This equals the
joint forward's actions exactly (tested against FastWAM's own full recompute) at a fraction of the cost.
Both attentions are unmasked here, so a FlashAttention kernel can take them.
"""

from __future__ import annotations

import torch
from torch import nn

from agents.wam import wan_adapter as wan
from agents.wam.attention import attention
from agents.wam.layers import LayerContext, cross_and_ffn

KeysValues = list[tuple[torch.Tensor, torch.Tensor]]


def video_keys_values(blocks: nn.ModuleList, x: torch.Tensor, ctx: LayerContext) -> KeysValues:
    """Self-attention (k, v), each (B, Lv, H, Dh), of every video layer for the current frame's tokens x."""
    cache = []
    for index, block in enumerate(blocks):
        mods = wan.block_modulation(block, ctx.video_mod)
        q, k, v = wan.self_attention_qkv(block, x, mods, ctx.rotary)
        cache.append((k, v))
        if index + 1 < len(blocks):  # the last layer's output feeds nothing: its keys/values are all we need
            x = wan.finish_self_attention(block, x, attention(q, k, v, ctx.backend).flatten(2), mods)
            x = cross_and_ffn(block, x, mods, ctx.video_text, ctx, ("video", index))
    return cache


def action_layers(blocks: nn.ModuleList, x: torch.Tensor, video_kv: KeysValues, ctx: LayerContext) -> torch.Tensor:
    """Advance the action tokens x (B, La, Da) through every layer against the cached video keys/values."""
    for index, (block, (video_k, video_v)) in enumerate(zip(blocks, video_kv, strict=True)):
        mods = wan.block_modulation(block, ctx.action_mod)
        q, k, v = wan.self_attention_qkv(block, x, mods, ctx.action_rotary)
        out = attention(q, torch.cat([video_k, k], 1), torch.cat([video_v, v], 1), ctx.backend)
        x = wan.finish_self_attention(block, x, out.flatten(2), mods)
        x = cross_and_ffn(block, x, mods, ctx.action_text, ctx, ("action", index))
    return x
