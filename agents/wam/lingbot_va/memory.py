"""What a LingBot-VA episode holds in memory, how many fit on a worker, and the pool their caches come from.

An episode keeps, for as long as it runs (:class:`~agents.wam.lingbot_va.state.EpisodeState`):

* its KV cache: keys and values of every layer, guidance row and slot (``cache_slots``: attn_window // 2 chunks of
  video and action tokens), in the model's dtype;
* its text's cross-attention keys and values, every layer and guidance row (made once, reused by every call);
* a batched call stacks the text keys and values of its episodes once more (for each row count it runs), so each
  episode is counted with that copy too; the streaming VAE's feature cache (a few MB at full size) is in the
  headroom.

A worker holds :func:`episodes_that_fit` episodes: its free memory once the weights are loaded, less a headroom
for activations, over one episode's bytes, capped by ``max_episodes``. Their caches are allocated then, all at
once (:class:`CachePool`), so an episode admitted later never runs out of memory: the broker admits no more
episodes on a worker than it holds (agents.policy.EpisodicPolicy.episode_capacity).
"""

from __future__ import annotations

import math
import os

import torch

from agents.wam.lingbot_va.cache import KVCache
from agents.wam.lingbot_va.config import LingBotVAConfig, uses_guidance

HEADROOM = 0.1  # of the free memory, kept for activations and the allocator's slack


def rows(config: LingBotVAConfig) -> int:
    """Guidance rows every episode's cache holds: prompted, and unprompted when either stream is guided."""
    return 2 if uses_guidance(config) else 1


def cache_shape(config: LingBotVAConfig) -> tuple[int, int, int, int, int]:
    """(layers, rows, slots, heads, head_dim): the shape of one episode's keys, and of its values."""
    t = config.transformer
    return t.num_layers, rows(config), config.cache_slots, t.num_attention_heads, t.attention_head_dim


def cache_bytes(config: LingBotVAConfig, dtype: torch.dtype) -> int:
    """One episode's KV cache: keys and values of every layer, row and slot."""
    return 2 * math.prod(cache_shape(config)) * dtype.itemsize


def text_bytes(config: LingBotVAConfig, dtype: torch.dtype) -> int:
    """One episode's text cross-attention keys and values, every layer and row."""
    t = config.transformer
    return 2 * t.num_layers * rows(config) * config.text_tokens * t.num_attention_heads * t.attention_head_dim * dtype.itemsize


def episode_bytes(config: LingBotVAConfig, dtype: torch.dtype) -> int:
    """What one more episode costs a worker: its cache, its text keys and values, and their copy in a batch."""
    return cache_bytes(config, dtype) + 2 * text_bytes(config, dtype)


def free_bytes(device: torch.device | str) -> int:
    """Memory free on ``device`` now: the GPU's (CUDA), or the host's available pages."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def episodes_that_fit(config: LingBotVAConfig, dtype: torch.dtype, free: int, max_episodes: int) -> int:
    """How many episodes a worker with ``free`` bytes left after its weights holds, at most ``max_episodes``."""
    fit = int(free * (1 - HEADROOM)) // episode_bytes(config, dtype)
    if fit < 1:
        raise MemoryError(f"one LingBot-VA episode needs {episode_bytes(config, dtype) / 2**30:.2f} GiB ("
                          f"{config.inputs or config.preset}, attn_window={config.attn_window}, {dtype}); "
                          f"{free / 2**30:.2f} GiB are free after the weights: use a larger device, a smaller "
                          "attn_window, or bf16")
    return min(fit, max_episodes)


class CachePool:
    """A worker's episode caches, allocated once: ``capacity`` blocks, one per episode held."""

    def __init__(self, config: LingBotVAConfig, capacity: int, dtype: torch.dtype, device: torch.device | str):
        shape = (capacity, *cache_shape(config))
        self._keys = torch.zeros(shape, dtype=dtype, device=device)
        self._values = torch.zeros(shape, dtype=dtype, device=device)
        self._free = list(range(capacity))  # blocks not in use
        self._held: dict[int, int] = {}  # episode -> its block

    @property
    def capacity(self) -> int:
        return self._keys.shape[0]

    def take(self, episode: int) -> KVCache:
        """A fresh cache for ``episode`` (every slot free)."""
        if episode in self._held:
            raise ValueError(f"episode {episode} holds a cache already: give it back first")
        if not self._free:
            raise ValueError(f"all {self.capacity} episode caches are in use: end an episode first (the broker admits "
                             "no more episodes than a worker holds), or raise max_episodes")
        block = self._free.pop()
        self._held[episode] = block
        return KVCache(self._keys[block], self._values[block])

    def give_back(self, episode: int) -> None:
        """``episode`` is over: its block serves the next one (no-op for an episode holding none)."""
        block = self._held.pop(episode, None)
        if block is not None:
            self._free.append(block)
