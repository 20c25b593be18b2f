"""Teacher forcing: every chunk of a clip in one transformer call, under LingBot-VA's block-causal mask.

Their trainer (wan_va/modules/model.py ``forward_train``, ``FlexAttnFunc.init_mask``) runs four groups of tokens
together, in this order: the noisy video, a clean copy of it (the context later chunks see, as the KV cache holds
the observed frames at inference), the noisy actions and a clean copy of them. Latent frame f of the clip belongs
to chunk f // chunk_size; chunk c's video is block 2c and its actions block 2c + 1, so a chunk's actions come after
its video, as at inference (the action stream attends to the video just predicted). A query sees a key when
their blocks are at most ``window`` apart and

* clean -> clean: the key's block is the query's or earlier (the context is causal);
* noisy -> clean: the key's block is earlier (a chunk is denoised from what came before it, never itself);
* noisy -> noisy: the same block (a chunk denoises itself, its video apart from its actions).

That is the attention of inference's calls: the video stream's chunk on the cache and itself, then the action
stream's on the cache, the chunk's video and itself. The mask is the same for every row of a batch (their rows are
cut from one packed sequence by its sequence ids; here they are the batch axis).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Streams:
    """The four token groups of one teacher-forced call, each with its timesteps per row and latent frame (B, F)."""

    noisy_video: torch.Tensor  # (B, C, F, H, W) latents at video_t
    video_t: torch.Tensor
    context_video: torch.Tensor  # (B, C, F, H, W) the clean latents (or noised at context_t)
    context_t: torch.Tensor
    noisy_actions: torch.Tensor  # (B, A, F, N) model-space actions at action_t
    action_t: torch.Tensor
    context_actions: torch.Tensor  # (B, A, F, N) the clean actions, at timestep 0
    context_action_t: torch.Tensor


def block_causal_mask(frames: int, video_per_frame: int, actions_per_frame: int, chunk: int, window: int,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """(L, L) bool, True where a query (row) attends to a key (column), for the token order of :class:`Streams`:
    noisy video, clean video, noisy actions, clean actions, each frame-major."""
    if chunk < 1 or window < 0:
        raise ValueError(f"a block-causal mask needs chunk >= 1 and window >= 0, got chunk={chunk}, window={window}")
    video = torch.arange(frames, device=device).repeat_interleave(video_per_frame) // chunk * 2
    action = torch.arange(frames, device=device).repeat_interleave(actions_per_frame) // chunk * 2 + 1
    block = torch.cat([video, video, action, action])
    clean = torch.cat([torch.zeros_like(video), torch.ones_like(video), torch.zeros_like(action),
                       torch.ones_like(action)]).bool()
    q, k = block[:, None], block[None, :]
    clean_q, clean_k = clean[:, None], clean[None, :]
    allowed = (clean_q & clean_k & (k <= q)) | (~clean_q & clean_k & (k < q)) | (~clean_q & ~clean_k & (k == q))
    return allowed & ((q - k).abs() <= window)
