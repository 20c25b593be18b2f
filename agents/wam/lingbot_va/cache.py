"""LingBot-VA's per-episode KV cache: the keys and values of every layer's self-attention, in fixed slots.

Their wan_va/modules/model.py keeps one cache per layer (``WanAttention.init_kv_cache``, ``allocate_slots``,
``update_cache``, ``restore_cache``, ``clear_pred_cache``); every layer goes through the same bookkeeping in
every call, so here one slot table serves all layers:

* ``keys``/``values`` (layers, rows, slots, heads, head_dim): rows are the guidance rows (prompted, unprompted);
  keys are stored rotated (after RoPE), as the attention uses them.
* ``valid`` (slots,): which slots the attention sees; ``write_id`` (slots,): the call that wrote each slot, counting
  up from the newest valid one (0 when none is valid); ``predicted`` (slots,): written as a prediction.

A call writes its tokens in one of three modes (their ``update_cache`` 0/1/2, :class:`WriteMode`): TEMPORARY
while denoising (the tokens see themselves, and their slots are freed after the call), PREDICTED at a stream's
last denoising step (kept until :meth:`KVCache.clear_predicted`, which the next feedback starts with), KEPT
for the observed frames and the executed chunk fed back. When too few slots are free the oldest writes are
evicted (lowest write id first), whatever the mode of the call that needs the room: a temporary write can
evict kept tokens for good. Free slots are taken lowest index first, and the attention sees valid slots in
index order, as theirs.
"""

from __future__ import annotations

import enum

import torch


class WriteMode(enum.IntEnum):
    """How a call's keys and values enter the cache (their ``update_cache`` values)."""

    TEMPORARY = 0  # seen by the call itself, freed after it (denoising steps)
    PREDICTED = 1  # kept until the next clear_predicted (a stream's last denoising step)
    KEPT = 2  # kept until evicted (observed frames, executed actions)


class KVCache:
    """Fixed-size self-attention cache of one episode, shared by the video and action streams, over storage
    ``keys``/``values`` (layers, rows, slots, heads, head_dim) of its own (a block of a worker's
    :class:`~agents.wam.lingbot_va.memory.CachePool`): every slot starts free, and a slot is written before it
    is read, so the storage needs no clearing between episodes."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        if keys.shape != values.shape or keys.dim() != 5:
            raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must both be (layers, rows, "
                             "slots, heads, head_dim)")
        self.keys, self.values = keys, values
        slots, device = keys.shape[2], keys.device
        self.valid = torch.zeros(slots, dtype=torch.bool, device=device)
        self.write_id = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.predicted = torch.zeros(slots, dtype=torch.bool, device=device)

    @classmethod
    def empty(cls, layers: int, rows: int, slots: int, heads: int, head_dim: int,
              dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> KVCache:
        """A cache over storage of its own."""
        shape = (layers, rows, slots, heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def rows(self) -> int:
        return self.keys.shape[1]

    @property
    def slots(self) -> int:
        return self.valid.numel()

    def reserve(self, count: int, mode: WriteMode) -> torch.Tensor:
        """Slots (count,) for one call's tokens, marked valid under a new write id; evicts the oldest writes if
        too few are free."""
        free = (~self.valid).nonzero().squeeze(-1)
        if free.numel() < count:
            self._evict(count - free.numel())
            free = (~self.valid).nonzero().squeeze(-1)
        if free.numel() < count:
            raise ValueError(f"a call of {count} tokens does not fit a KV cache of {self.slots} slots; raise attn_window")
        slots = free[:count]
        newest = self.write_id[self.valid]
        self.write_id[slots] = newest.max() + 1 if newest.numel() else 0
        self.valid[slots] = True
        self.predicted[slots] = mode == WriteMode.PREDICTED
        return slots

    def _evict(self, count: int) -> None:
        used = self.valid.nonzero().squeeze(-1)
        # Stable: when only part of a write goes, its lowest slots go first (their argsort leaves ties unordered;
        # with the chunk sizes of a config, writes are evicted whole and the order does not matter).
        oldest = used[torch.argsort(self.write_id[used], stable=True)[:count]]
        self.valid[oldest] = False
        self.write_id[oldest] = -1

    def store(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write one layer's keys and values (rows, count, heads, head_dim) into ``slots``: the first ``rows`` rows
        (a call may run fewer rows than the cache holds: the action stream without guidance runs the prompted one)."""
        rows = keys.shape[0]
        self.keys[layer][:rows, slots] = keys.to(self.keys.dtype)
        self.values[layer][:rows, slots] = values.to(self.values.dtype)

    def visible(self) -> torch.Tensor:
        """The valid slots, in index order (what every layer of a call attends to)."""
        return self.valid.nonzero().squeeze(-1)

    def gather(self, layer: int, slots: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values (rows, len(slots), heads, head_dim) at ``slots``, of the first ``rows`` rows
        (None: all)."""
        return self.keys[layer][:rows, slots], self.values[layer][:rows, slots]

    def release(self, slots: torch.Tensor) -> None:
        """End a temporary write: its slots are no longer seen (their ``restore_cache``)."""
        self.valid[slots] = False

    def clear_predicted(self) -> None:
        """Forget every predicted write (their ``clear_pred_cache``), before the real frames and actions come."""
        self.valid[self.predicted] = False
