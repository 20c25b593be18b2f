"""Dynamic batching: group pending requests by input shape, release a group when it is full
(``inference_batch_size``) or when its oldest request has waited ``inference_batch_wait_ms``.

Pure bookkeeping (no processes, no clocks of its own), so the policy is easy to test.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def shape_key(obs: Mapping[str, Any]) -> Hashable:
    """Requests batch together only if every array has the same shape and dtype."""
    key = []
    for name in sorted(obs):
        value = obs[name]
        if isinstance(value, Mapping):
            key.append((name, shape_key(value)))
        elif isinstance(value, np.ndarray):
            key.append((name, value.shape, value.dtype.str))
    return tuple(key)


@dataclass
class Request:
    """One env's observation waiting for a model call."""

    actor_id: int
    request_id: int
    obs: dict[str, Any]
    noise_seed: int | None
    arrived: float  # time.monotonic() when the broker received it
    key: Hashable = field(init=False)

    def __post_init__(self) -> None:
        self.key = shape_key(self.obs)


class Batcher:
    def __init__(self, batch_size: int, wait_ms: float):
        if batch_size < 1:
            raise ValueError(f"MULTIRUN.inference_batch_size must be >= 1, got {batch_size}")
        if wait_ms < 0:
            raise ValueError(f"MULTIRUN.inference_batch_wait_ms must be >= 0, got {wait_ms}")
        self.batch_size = batch_size
        self.wait_s = wait_ms / 1000
        self._groups: OrderedDict[Hashable, list[Request]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def add(self, request: Request, front: bool = False) -> None:
        """Queue a request; ``front`` for one coming back from a dead worker (it goes first)."""
        group = self._groups.setdefault(request.key, [])
        group.insert(0, request) if front else group.append(request)

    def drop_actor(self, actor_id: int) -> None:
        """Forget the requests of an actor that died: nobody waits for their replies."""
        for key in list(self._groups):
            kept = [r for r in self._groups[key] if r.actor_id != actor_id]
            if kept:
                self._groups[key] = kept
            else:
                del self._groups[key]

    def next_deadline(self) -> float | None:
        """When the oldest pending group must be released (monotonic seconds), if any."""
        oldest = [g[0].arrived for g in self._groups.values()]
        return min(oldest) + self.wait_s if oldest else None

    def pop_ready(self, now: float) -> list[Request] | None:
        """The next batch to run: a full group first, else the group whose wait expired first."""
        for key, group in self._groups.items():
            if len(group) >= self.batch_size:
                return self._take(key)
        expired = [(g[0].arrived, k) for k, g in self._groups.items() if now - g[0].arrived >= self.wait_s]
        return self._take(min(expired, key=lambda pair: pair[0])[1]) if expired else None

    def _take(self, key: Hashable) -> list[Request]:
        group = self._groups[key]
        batch, rest = group[: self.batch_size], group[self.batch_size :]
        if rest:
            self._groups[key] = rest
        else:
            del self._groups[key]
        return batch
