"""LingBot-VA's transformer: one stack of Wan2.2 blocks that serves a video stream and an action stream.

Their wan_va/modules/model.py ``WanTransformer3DModel`` (parameter names here are theirs, one to one, so a
release's transformer/ folder loads as it is: :mod:`agents.wam.lingbot_va.checkpoint`). A call runs one stream:

* video: latents (B, C, F, H, W) cut into (1, 2, 2) patches and projected by a linear map
  (``patch_embedding_mlp``, channel-major patches), timesteps embedded by ``condition_embedder``, output by
  ``proj_out`` back onto the latent grid (B, C, F, H, W);
* action: actions (B, A, F, N), one token per action (``action_embedder``), timesteps embedded by
  ``condition_embedder_action``, output by ``action_proj_out`` (B, A, F, N).

Both streams share the blocks, the text projection (``condition_embedder.text_embedder``), the output norm and
its modulation table. Timesteps are per row and frame (B, F), spread over the frame's tokens; positions are per
row and token (B, 3, L) (:mod:`agents.wam.lingbot_va.positions`). Every block is a Wan2.2 block (adaLN from
per-token timesteps, self-attention with RMS-normed q/k and 3-axis RoPE, text cross-attention, gated GELU
feed-forward), built from diffusers' parts and driven by :mod:`agents.wam.wan_adapter`. Self-attention goes
through the episodes' :class:`~agents.wam.lingbot_va.cache.KVCache` when they are given (one per episode, its
rows consecutive in the batch: :mod:`agents.wam.lingbot_va.ragged`): the call's keys and values are written (in
the call's :class:`~agents.wam.lingbot_va.cache.WriteMode`) and each row's queries attend to every valid slot of
its own episode, the call's own included.

Training calls :meth:`LingBotVATransformer.teacher_forced` instead: all chunks of a clip, both streams, noisy and
clean, in one call under the block-causal mask of :mod:`agents.wam.lingbot_va.teacher` (their ``forward_train``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn
from torch.utils.checkpoint import checkpoint

from agents.wam import wan_adapter as wan
from agents.wam.attention import attention
from agents.wam.layers import LayerContext, cross_and_ffn
from agents.wam.lingbot_va.cache import KVCache, WriteMode
from agents.wam.lingbot_va.positions import action_positions, rotary, video_positions
from agents.wam.lingbot_va.ragged import RaggedCaches
from agents.wam.lingbot_va.teacher import Streams


class LingBotVATransformer(ModelMixin, ConfigMixin):
    """Their WanTransformer3DModel's weights and maths, one stream per call."""

    @register_to_config
    def __init__(
        self,
        patch_size: tuple[int, int, int] = (1, 2, 2),
        num_attention_heads: int = 24,
        attention_head_dim: int = 128,
        in_channels: int = 48,
        out_channels: int = 48,
        action_dim: int = 30,
        text_dim: int = 4096,
        freq_dim: int = 256,
        ffn_dim: int = 14336,
        num_layers: int = 30,
        cross_attn_norm: bool = True,
        eps: float = 1e-6,
        rope_max_seq_len: int = 1024,
    ):
        super().__init__()
        dim = num_attention_heads * attention_head_dim
        self.patch_embedding_mlp = nn.Linear(in_channels * math.prod(patch_size), dim)
        self.action_embedder = nn.Linear(action_dim, dim)
        self.condition_embedder = wan.time_text_embedder(dim, freq_dim, text_dim)
        self.condition_embedder_action = wan.time_text_embedder(dim, freq_dim, text_dim)  # its text part is unused
        self.blocks = nn.ModuleList(
            wan.WanBlock(dim, ffn_dim, num_attention_heads, attention_head_dim, eps) for _ in range(num_layers)
        )
        self.norm_out = wan.output_norm(dim, eps)
        self.proj_out = nn.Linear(dim, out_channels * math.prod(patch_size))
        self.action_proj_out = nn.Linear(dim, action_dim)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self.attention_kernel = "sdpa"  # a resolved agents.wam.attention backend (diffusers' own dispatcher is unused)

    # ----------------------------------------------------------------- streams
    def video(self, latents: torch.Tensor, timesteps: torch.Tensor, positions: torch.Tensor, text: torch.Tensor | None,
              caches: Sequence[KVCache] = (), mode: WriteMode = WriteMode.TEMPORARY, text_kv: dict | None = None
              ) -> torch.Tensor:
        """Velocity (B, C, F, H, W) of video latents (B, C, F, H, W) at per-frame timesteps (B, F), positions
        (B, 3, L) and text-encoder states (B, Lt, text_dim) (None: ``text_kv`` holds every layer's). ``caches``:
        the episodes' caches, whose rows split the batch evenly in order (none: no cache). ``text_kv``: where to
        keep each layer's text keys and values for later calls with the same text (both streams share them)."""
        hidden, grid = self._video_tokens(latents)
        out = self._stream(hidden, self.condition_embedder, self.proj_out, timesteps.repeat_interleave(grid[1] * grid[2], dim=1),
                           positions, text, text_kv, caches, mode)
        return wan.unpatchify(self, out, grid)

    def action(self, actions: torch.Tensor, timesteps: torch.Tensor, positions: torch.Tensor, text: torch.Tensor | None,
               caches: Sequence[KVCache] = (), mode: WriteMode = WriteMode.TEMPORARY, text_kv: dict | None = None
               ) -> torch.Tensor:
        """Velocity (B, A, F, N) of actions (B, A, F, N) at per-frame timesteps (B, F); the rest as :meth:`video`."""
        b, a, f, n = actions.shape
        hidden = self._action_tokens(actions)
        out = self._stream(hidden, self.condition_embedder_action, self.action_proj_out,
                           timesteps.repeat_interleave(n, dim=1), positions, text, text_kv, caches, mode)
        return out.transpose(1, 2).unflatten(2, (f, n))

    def text_keys_values(self, text: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Each block's text cross-attention keys and values (B, Lt, heads, head_dim) of text-encoder states (B, Lt,
        text_dim): what every call with this text attends to (their model recomputes them in every call; the
        numbers are the same), as ``text_kv``."""
        projected = self.condition_embedder.text_embedder(text)
        return {index: wan.cross_attention_kv(block, projected) for index, block in enumerate(self.blocks)}

    # ----------------------------------------------------------------- training: both streams, every chunk
    def teacher_forced(self, streams: Streams, text: torch.Tensor, attn_mask: torch.Tensor, recompute: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Velocities of the noisy video (B, C, F, H, W) and noisy actions (B, A, F, N) of ``streams``: every chunk of
        the clips in one call, the four groups under ``attn_mask`` (L, L) (their ``forward_train``); text (B, Lt,
        text_dim). Positions start at frame 0. ``recompute``: each block recomputed in backward."""
        b, _, f = streams.noisy_video.shape[:3]
        n = streams.noisy_actions.shape[-1]
        groups = []
        for latents, t in ((streams.noisy_video, streams.video_t), (streams.context_video, streams.context_t)):
            tokens, grid = self._video_tokens(latents)
            groups.append((tokens, self.condition_embedder, t.repeat_interleave(grid[1] * grid[2], dim=1)))
        for actions, t in ((streams.noisy_actions, streams.action_t), (streams.context_actions, streams.context_action_t)):
            groups.append((self._action_tokens(actions), self.condition_embedder_action, t.repeat_interleave(n, dim=1)))
        hidden = torch.cat([tokens for tokens, _, _ in groups], dim=1)
        times = [_time_embedding(embedder, t, hidden.dtype) for _, embedder, t in groups]
        temb, mod = (torch.cat([pair[i] for pair in times], dim=1) for i in (0, 1))
        start = torch.zeros(b, device=hidden.device)
        video_at, action_at = video_positions(start, f, grid[1], grid[2]), action_positions(start, f, n)
        ctx = LayerContext(
            video_mod=mod, action_mod=None, video_text=self.condition_embedder.text_embedder(text), action_text=None,
            rotary=rotary(torch.cat([video_at, video_at, action_at, action_at], dim=2), self.config.attention_head_dim),
            backend=self.attention_kernel, attn_mask=attn_mask[None, None],
        )
        for index, block in enumerate(self.blocks):
            if recompute and torch.is_grad_enabled():
                hidden = checkpoint(self._block, block, index, hidden, ctx, None, use_reentrant=False)
            else:
                hidden = self._block(block, index, hidden, ctx, None)
        out = self._head(hidden, temb)
        video_len, action_len = groups[0][0].shape[1], groups[2][0].shape[1]
        video = wan.unpatchify(self, self.proj_out(out[:, :video_len]), grid)
        action = self.action_proj_out(out[:, 2 * video_len : 2 * video_len + action_len])
        return video, action.transpose(1, 2).unflatten(2, (f, n))

    # ----------------------------------------------------------------- shared body
    def _video_tokens(self, latents: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """Latents (B, C, F, H, W) -> tokens (B, L, D) and their grid (frames, rows, columns)."""
        p_t, p_h, p_w = self.config.patch_size
        b, _, f, h, w = latents.shape
        patches = latents.reshape(b, -1, f // p_t, p_t, h // p_h, p_h, w // p_w, p_w)
        tokens = patches.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4).flatten(1, 3)  # (B, L, C x patch), C outermost
        return self.patch_embedding_mlp(tokens), (f // p_t, h // p_h, w // p_w)

    def _action_tokens(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions (B, A, F, N) -> one token per action (B, F N, D), frame-major."""
        return self.action_embedder(actions.flatten(2).transpose(1, 2))

    def _head(self, hidden: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        """The output norm, modulated by each token's timestep embedding (before the stream's projection)."""
        shift, scale = (self.scale_shift_table[None] + temb[:, :, None]).unbind(2)
        return (self.norm_out(hidden.float()) * (1 + scale) + shift).type_as(hidden)

    def _stream(self, hidden, embedder, proj_out, timesteps, positions, text, text_kv, caches, mode) -> torch.Tensor:
        """Tokens (B, L, D) at per-token timesteps (B, L) through every block, then the stream's output head."""
        temb, mod = _time_embedding(embedder, timesteps, hidden.dtype)
        known = text_kv is not None and len(text_kv) == len(self.blocks)  # then the projected text is not needed
        ragged = RaggedCaches(caches, hidden.shape[0] // len(caches), hidden.shape[1], mode) if caches else None
        ctx = LayerContext(
            video_mod=mod, action_mod=None, video_text=None if known else self.condition_embedder.text_embedder(text),
            action_text=None, rotary=rotary(positions, self.config.attention_head_dim), backend=self.attention_kernel,
            cross_kv=text_kv, attn_mask=None if ragged is None else ragged.mask,
        )
        for index, block in enumerate(self.blocks):
            hidden = self._block(block, index, hidden, ctx, ragged)
        if ragged is not None:
            ragged.close()
        return proj_out(self._head(hidden, temb))

    def _block(self, block, index, hidden, ctx: LayerContext, ragged: RaggedCaches | None) -> torch.Tensor:
        mods = wan.block_modulation(block, ctx.video_mod)
        q, k, v = wan.self_attention_qkv(block, hidden, mods, ctx.rotary)
        if ragged is not None:
            k, v = ragged.attend(index, k, v)
        out = attention(q, k.to(q.dtype), v.to(q.dtype), ctx.backend, ctx.attn_mask)
        hidden = wan.finish_self_attention(block, hidden, out.flatten(2), mods)
        return cross_and_ffn(block, hidden, mods, ctx.video_text, ctx, index)


def _time_embedding(embedder: nn.Module, timesteps: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token timesteps (B, L) -> temb (B, L, D) in ``dtype`` and the blocks' modulation (B, L, 6, D) (their
    WanTimeTextImageEmbedding.forward: diffusers' float32 sinusoids, the embedder in its own dtype)."""
    features = embedder.timesteps_proj(timesteps.flatten())
    temb = embedder.time_embedder(features.to(embedder.time_embedder.linear_1.weight.dtype)).to(dtype)
    mod = embedder.time_proj(embedder.act_fn(temb))
    return temb.unflatten(0, timesteps.shape), mod.unflatten(0, timesteps.shape).unflatten(-1, (6, -1))
