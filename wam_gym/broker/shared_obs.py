"""Observations in shared memory: only small handles cross the broker's pipes.

An actor's camera images are most of a request's bytes (two 224x224 cameras: 300 kB). Pickled
through the dispatcher and again to a worker, they cost the one dispatcher thread a copy per hop,
and a message larger than a pipe's buffer is read in pieces while its writer is scheduled in,
stalling every other actor behind it. So each actor writes its large arrays into a shared-memory
slot of its own and sends ``SharedArray`` handles; the model worker reads them straight into the
batch it stacks. The dispatcher never touches the pixels.

The slot is reused call after call: an actor waits for its answer before it writes again, so a
worker never reads a slot being written, except for a request the actor abandoned after an error,
whose answer nobody reads. The actor unlinks its slot when it exits; if it is killed, the broker
unlinks it when it learns the actor is gone (and the resource tracker at the very end otherwise).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from multiprocess import shared_memory, util

# Arrays smaller than this (a state vector) travel in the message itself. Images go to the slot
# whatever their size: a batch of 16 requests with three 64x64 cameras inline is 590 kB, and the
# dispatcher would pickle it twice (3 % slower than vla-eval's server at 64 actors on one worker).
MIN_SHARED_BYTES = 1024
# Segments a worker keeps attached (one per actor it has served; older ones are closed).
MAX_ATTACHED = 256
# Where Linux keeps POSIX shared memory: a segment whose file is gone was unlinked by its actor.
SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class SharedArray:
    """Where an array lies: segment name, byte offset, shape and dtype."""

    segment: str
    offset: int
    shape: tuple[int, ...]
    dtype: str


class ObservationSlot:
    """An actor's shared-memory slot: ``share`` copies large arrays in and returns handles."""

    def __init__(self) -> None:
        self.memory: shared_memory.SharedMemory | None = None
        self._release: util.Finalize | None = None

    def __getstate__(self) -> dict:
        return {}  # a slot belongs to one process: another one that gets this client makes its own

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    @property
    def name(self) -> str | None:
        return self.memory.name if self.memory is not None else None

    def share(self, rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` with every large array replaced by a handle into this slot."""
        needed = sum(_large_bytes(row) for row in rows)
        if needed == 0:
            return [dict(row) for row in rows]
        if self.memory is None or self.memory.size < needed:
            self.close()
            self.memory = shared_memory.SharedMemory(create=True, size=needed)
            # Runs when the slot is garbage (a server's finished session) or the process exits
            # (multiprocess children skip atexit, not these).
            self._release = util.Finalize(self, _release, args=(self.memory,), exitpriority=10)
        offset = [0]
        return [self._place(row, offset) for row in rows]

    def _place(self, row: Mapping[str, Any], offset: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(value, Mapping):
                out[key] = self._place(value, offset)
            elif _is_large(value):
                value = np.ascontiguousarray(value)
                view = np.ndarray(value.shape, value.dtype, buffer=self.memory.buf, offset=offset[0])
                view[...] = value
                out[key] = SharedArray(self.memory.name, offset[0], value.shape, value.dtype.str)
                offset[0] += value.nbytes
            else:
                out[key] = value
        return out

    def close(self) -> None:
        """Release and unlink the slot (also before growing it)."""
        if self._release is not None:
            self._release()
        self.memory = self._release = None


def _release(memory: shared_memory.SharedMemory) -> None:
    """Close and unlink ``memory``; the other side (an actor, the broker) may have unlinked it already."""
    memory.close()
    try:
        memory.unlink()
    except FileNotFoundError:  # the broker took its actor for gone, or a session ended meanwhile
        pass


class AttachedSegments:
    """A reader's segments, attached once and kept (least recently used closed first)."""

    def __init__(self, limit: int = MAX_ATTACHED):
        self.limit = limit
        self._segments: OrderedDict[str, shared_memory.SharedMemory] = OrderedDict()

    def resolve(self, obs: Mapping[str, Any], copy: bool = False) -> dict[str, Any]:
        """``obs`` with every handle replaced by a view of the shared array (copy it before the
        actor may write again: stacking a batch does), or by a copy (``copy``: for workers that
        cannot attach, Ray's)."""
        out: dict[str, Any] = {}
        for key, value in obs.items():
            if isinstance(value, Mapping):
                out[key] = self.resolve(value, copy)
            elif isinstance(value, SharedArray):
                memory = self._attach(value.segment)
                view = np.ndarray(value.shape, np.dtype(value.dtype), buffer=memory.buf, offset=value.offset)
                out[key] = view.copy() if copy else view
            else:
                out[key] = value
        return out

    def _attach(self, name: str) -> shared_memory.SharedMemory:
        if name in self._segments:
            self._segments.move_to_end(name)
            return self._segments[name]
        self._prune()
        try:
            memory = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            raise RuntimeError(f"the observation's shared memory {name} is gone (its actor exited)") from None
        self._segments[name] = memory
        while len(self._segments) > self.limit:
            self._segments.popitem(last=False)[1].close()
        return memory

    def _prune(self) -> None:
        """Let go of segments their actors unlinked (a server's sessions come and go): a mapping
        kept would hold the memory."""
        if SHM_DIR.is_dir():
            for name in [n for n in self._segments if not (SHM_DIR / n.lstrip("/")).exists()]:
                self._segments.pop(name).close()

    def __len__(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        for memory in self._segments.values():
            memory.close()
        self._segments.clear()


def unlink(name: str) -> None:
    """Remove a segment by name (the broker, for an actor that was killed)."""
    try:
        memory = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    _release(memory)


def _is_large(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.nbytes >= MIN_SHARED_BYTES


def _large_bytes(row: Mapping[str, Any]) -> int:
    """Bytes of ``row``'s large arrays: what its slot must hold."""
    return sum(_large_bytes(v) if isinstance(v, Mapping) else v.nbytes if _is_large(v) else 0 for v in row.values())
