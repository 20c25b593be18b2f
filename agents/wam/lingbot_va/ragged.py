"""Many episodes' caches in one transformer call: ragged batching.

A batched call stacks the rows of several episodes, episode-major (each episode's ``rows`` rows: prompted, then
unprompted), all with the same number of new tokens. Each episode keeps its own :class:`KVCache`: its own slots,
fill, write ids and eviction. Per layer, each episode's new keys and values go into its own cache, and its rows
attend to its own valid slots only; episodes whose caches hold different numbers of valid slots are padded to the
longest, the padding masked out (SDPA's key-padding mask). Positions and timesteps are per row already (the
model's inputs), so rows at different frames and denoising steps share the call.

Nothing in a row depends on its company: a masked key adds exp(-inf) = 0 to the softmax, and its value is
weighted by that 0. What may differ is the last bits of a float sum, as with any change of batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from agents.wam.lingbot_va.cache import KVCache, WriteMode


class RaggedCaches:
    """The caches of the episodes in one call: their slots for this call's tokens, and what each row may see."""

    def __init__(self, caches: Sequence[KVCache], rows: int, tokens: int, mode: WriteMode):
        if any(rows > cache.rows for cache in caches):
            raise ValueError(f"a call of {rows} rows per episode, but a cache holds {min(c.rows for c in caches)}")
        self.caches, self.rows, self.mode = list(caches), rows, mode
        self.slots = [cache.reserve(tokens, mode) for cache in self.caches]
        self.visible = [cache.visible() for cache in self.caches]
        lengths = torch.tensor([len(slots) for slots in self.visible])
        self.longest = int(lengths.max())
        self.mask = None  # all rows see as many slots: nothing to mask (exactly the call of one episode)
        if bool((lengths != self.longest).any()):
            seen = torch.arange(self.longest)[None] < lengths[:, None]  # (episodes, longest)
            device = self.caches[0].valid.device
            self.mask = seen.repeat_interleave(rows, dim=0)[:, None, None].to(device)  # (B, 1, 1, longest): SDPA's

    @property
    def batch(self) -> int:
        return len(self.caches) * self.rows

    def attend(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new keys and values (B, tokens, heads, head_dim) in each episode's cache; every row's
        visible keys and values (B, longest, heads, head_dim), zero past its episode's own."""
        if keys.shape[0] != self.batch:
            raise ValueError(f"a call of {keys.shape[0]} rows; its episodes hold {self.batch}")
        seen_keys, seen_values = [], []
        for index, cache in enumerate(self.caches):
            rows = slice(index * self.rows, (index + 1) * self.rows)
            cache.store(layer, self.slots[index], keys[rows].detach(), values[rows].detach())
            k, v = cache.gather(layer, self.visible[index], self.rows)
            if keys.requires_grad:  # real-time chunking differentiates through this call's own keys: read them live
                at = torch.searchsorted(self.visible[index], self.slots[index])
                k, v = k.index_copy(1, at, keys[rows].to(k.dtype)), v.index_copy(1, at, values[rows].to(v.dtype))
            if k.shape[1] < self.longest:  # padded only where it sees fewer slots (a pad copies, even of nothing)
                pad = (0, 0, 0, 0, 0, self.longest - k.shape[1])
                k, v = F.pad(k, pad), F.pad(v, pad)
            seen_keys.append(k)
            seen_values.append(v)
        if len(self.caches) == 1:
            return seen_keys[0], seen_values[0]
        return torch.cat(seen_keys), torch.cat(seen_values)

    def close(self) -> None:
        """After the call: a temporary write's slots are freed in every episode's cache."""
        if self.mode == WriteMode.TEMPORARY:
            for cache, slots in zip(self.caches, self.slots):
                cache.release(slots)
