"""FastWAM's block mask over the joined (video, action) tokens of its shared self-attention.

    queries \\ keys     first frame   future frames   actions
    first frame         yes           no              no
    future frames       yes           yes             no
    actions             yes           no              yes

The current frame is clean and sees only itself ("first-frame causal"), video never sees the actions,
and the actions see the current frame and each other. So the actions depend on the current frame alone,
never on the noisy future video: action-only inference drops the future frames and computes the
current frame's keys and values once per call (:mod:`agents.wam.fastwam.layers`); there every
attention is unmasked (the current frame alone; actions over the current frame and themselves), which
lets a FlashAttention kernel take the calls.
"""

from __future__ import annotations

import torch


def block_mask(video_tokens: int, tokens_per_frame: int, action_tokens: int, device=None) -> torch.Tensor:
    """(L, L) bool, True = may attend, L = video_tokens + action_tokens (video first)."""
    first = min(tokens_per_frame, video_tokens)
    total = video_tokens + action_tokens
    mask = torch.zeros(total, total, dtype=torch.bool, device=device)
    mask[:first, :first] = True
    mask[first:video_tokens, :video_tokens] = True
    mask[video_tokens:, :first] = True
    mask[video_tokens:, video_tokens:] = True
    return mask
