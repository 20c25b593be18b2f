"""The observation/batch protocol: key names, and batches <-> rows. Numpy only.

An observation is a dict: ``PIXELS`` (camera name -> uint8 image), ``STATE`` (float vector),
``INSTRUCTION`` (text), optionally ``PRIVILEGED_STATE``; a world model's request adds
``ACTION`` (the chunk to imagine). A *batch* holds the same keys with a leading env axis on
every array and a sequence of strings for the instruction (a VectorEnv's layout); a *row* is
one env's observation out of a batch. The same helpers cut and join model predictions, whose
fields may be ``None`` (a model without a video or state head).

It sits at the bottom of the stack so that envs, agents, training and wam_gym (the broker
splits batches into requests and its model workers stack them back) share one definition.
Tests keep literal key names on purpose: they pin the format that files and clients see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# -- the env contract's observation keys (see envs/contract.py)
PIXELS = "pixels"
STATE = "state"
INSTRUCTION = "instruction"
PRIVILEGED_STATE = "privileged_state"  # full simulator state, for scripted experts
ACTION = "action"  # a world model's request: the action chunk (B, n, A) to imagine
IS_SUCCESS = "is_success"  # the ``info`` key every env sets on every step
PIXELS_RENDERED = "pixels_rendered"  # the ``info`` key of an env made with lazy_pixels=True (envs/contract.py)

# -- LeRobot v3 feature names (datasets on disk, their meta/stats.json, checkpoint statistics)
LEROBOT_STATE = "observation.state"
LEROBOT_ACTION = "action"
LEROBOT_IMAGE_PREFIX = "observation.images."  # + camera name


def batch_size(obs: Mapping[str, Any]) -> int | None:
    """Number of rows of a batch, or None for one env's observation (its state is a vector)."""
    state = np.asarray(obs[STATE])
    return state.shape[0] if state.ndim == 2 else None


def nonfinite_state(state: np.ndarray) -> str | None:
    """Why a state (a row (D,) or a batch (B, D)) must not reach a model, or None: where it holds NaN/inf.
    The one check of it: a WAM's policy and the policy server (for any served policy) both ask here."""
    bad = ~np.isfinite(state)
    if not bad.any():
        return None
    rows, dims = (sorted({int(i) for i in axis}) for axis in np.nonzero(np.atleast_2d(bad)))
    where = f"rows {rows}, dimensions {dims}" if state.ndim == 2 else f"dimensions {dims}"
    return (f"the observation's state holds NaN/inf ({where}), as the env or client sent it: the model was not called. "
            "Check the env's state (a simulator that diverged) or what the client sends")


def take_row(batch: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Row ``i`` of a batch, without the batch axis."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, Mapping):
            out[key] = take_row(value, i)
        else:
            out[key] = None if value is None else value[i]
    return out


# Arrays of a batch at least this large are stacked into kept memory when the caller keeps some.
REUSE_MIN_BYTES = 64 * 1024


def stack_rows(rows: Sequence[Mapping[str, Any]], reuse: dict | None = None) -> dict[str, Any]:
    """Rows -> one batch (arrays stacked on a new first axis, strings gathered in a tuple).

    ``reuse``, a dict the caller keeps across calls, keeps the memory of large arrays: the next
    call stacks into it again (a model worker's batches of 16 two-camera rows spent 1.5-5 ms
    faulting in a fresh 5 MB each, 0.2 ms reused). Its batch is then valid until that next call.
    """
    out: dict[str, Any] = {}
    for key, value in rows[0].items():
        if isinstance(value, Mapping):
            out[key] = stack_rows([r[key] for r in rows], None if reuse is None else reuse.setdefault(key, {}))
        elif value is None:
            out[key] = None
        elif isinstance(value, str):
            out[key] = tuple(r[key] for r in rows)
        else:
            out[key] = _stack([np.asarray(r[key]) for r in rows], key, reuse)
    return out


def _stack(arrays: list[np.ndarray], key: str, reuse: dict | None) -> np.ndarray:
    """``np.stack(arrays)``, into ``reuse[key]`` if it is large: the kept array grows to the
    largest batch seen, and a smaller batch takes its first rows."""
    n, row = len(arrays), arrays[0]
    if reuse is None or n * row.nbytes < REUSE_MIN_BYTES:
        return np.stack(arrays)
    kept = reuse.get(key)
    if kept is None or kept.shape[1:] != row.shape or kept.dtype != row.dtype or len(kept) < n:
        kept = reuse[key] = np.empty((n, *row.shape), row.dtype)
    return np.stack(arrays, out=kept[:n])


def select_rows(batch: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
    """The sub-batch of the rows at ``indices``, in that order."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, Mapping):
            out[key] = select_rows(value, indices)
        elif value is None:
            out[key] = None
        elif isinstance(value, np.ndarray):
            out[key] = value[list(indices)]
        else:  # instructions: any sequence of strings (a tuple, or a vector env's shared-memory view)
            out[key] = tuple(value[i] for i in indices)
    return out
