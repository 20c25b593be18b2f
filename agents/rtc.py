"""Real-time chunking (RTC): the next chunk continues the actions already committed.

Black, Galliker and Levine 2025, "Real-Time Execution of Action Chunking Flow Policies". While a model call
runs for ``d`` control steps, the robot executes ``d`` more actions of the current chunk: they are committed.
RTC denoises the next chunk as an inpainting of the current one: at every denoising step the velocity is
steered (a vector-Jacobian product, as PiGDM) toward the current chunk's remaining actions, weighted by a soft
mask over the new chunk's positions (:func:`soft_mask`): 1 on the first ``d`` (committed), decaying
exponentially over the rest of the overlap, 0 over the last ``s`` (past the current chunk's end: free). The
guidance weight is clipped at ``beta`` (:class:`RTCConfig`). After denoising the first ``d`` actions are
overwritten with the committed ones, so they are exact (:func:`commit`).

This module is the request side, numpy only (a remote or python agent needs no torch): the knobs, the
entries a model call carries and the mask. The entries travel as observation keys, one value per row, so
the inference broker batches and routes them as any other (rows with different ``d`` share a call); a
flow-matching WAM's sampler reads them (agents/wam/rtc.py). A call without them is a plain call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

PREFIX = "rtc_prefix"  # (H, A) float32, env units: the current chunk's actions from this call's step on, 0 past OVERLAP
DELAY = "rtc_delay"  # int: the first d of them run before the new chunk arrives (committed)
OVERLAP = "rtc_overlap"  # int: how many of PREFIX are actions (the rest is padding: the chunk ended)
KEYS = (PREFIX, DELAY, OVERLAP)
SCHEDULES = ("exp", "linear", "ones", "zeros")  # the paper's soft mask (exp) and its ablations


@dataclass(frozen=True)
class RTCConfig:
    """RTC's knobs, with the paper's defaults."""

    max_guidance_weight: float = 5.0  # beta: the clip of the guidance weight (the paper's 5)
    schedule: str = "exp"  # the mask past d: exp (the paper's), linear, ones, zeros (the committed actions only)
    # s: the new chunk's last s actions are free (weight 0). None: those the current chunk has no action for
    execution_horizon: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_guidance_weight, (int, float)) and self.max_guidance_weight > 0):
            raise ValueError(f"rtc max_guidance_weight={self.max_guidance_weight!r} must be > 0 (the paper's is 5.0)")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"rtc schedule={self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        if self.execution_horizon is not None and self.execution_horizon < 0:
            raise ValueError(f"rtc execution_horizon={self.execution_horizon} must be >= 0, or null (the agent's)")


def soft_mask(delay: int, overlap: int, horizon: int, config: RTCConfig | None = None) -> np.ndarray:
    """(horizon,) float32 weights of a new chunk's positions: 1 on the first ``delay``, then the schedule down to
    0 at the overlap's end (``min(overlap, horizon - s)``), 0 after (the paper's equation 5:
    ``c_i (e^c_i - 1) / (e - 1)``, ``c_i = (end - i) / (end - d + 1)``)."""
    config = config or RTCConfig()
    end = overlap if config.execution_horizon is None else min(overlap, horizon - config.execution_horizon)
    end = max(min(end, horizon), 0)
    weights = np.zeros(horizon, np.float64)
    if config.schedule != "zeros":
        i = np.arange(delay, end)
        c = (end - i) / (end - delay + 1)
        ramp = {"exp": c * np.expm1(c) / (math.e - 1), "linear": c, "ones": np.ones_like(c)}[config.schedule]
        weights[delay:end] = ramp
    weights[: min(delay, horizon)] = 1.0
    return weights.astype(np.float32)


def entries(rest: np.ndarray | None, delay: int, horizon: int, action_dim: int) -> dict[str, Any]:
    """One row's RTC entries: ``rest`` (k, A) the current chunk's actions from the call's step on (None: no chunk
    yet), of which the first ``delay`` will have run when the new chunk arrives."""
    prefix = np.zeros((horizon, action_dim), np.float32)
    overlap = 0 if rest is None else min(len(rest), horizon)
    if overlap:
        prefix[:overlap] = rest[:overlap]
    if delay > overlap:
        raise ValueError(f"rtc_delay={delay} commits more actions than the {overlap} the current chunk has left: "
                         "the agent must hold (repeat) the last action into the prefix it sends")
    return {PREFIX: prefix, DELAY: np.int64(delay), OVERLAP: np.int64(overlap)}


@dataclass(frozen=True)
class Request:
    """A batch's RTC entries: ``prefix`` (B, H, A) env units, ``delay`` and ``overlap`` (B,)."""

    prefix: np.ndarray
    delay: np.ndarray
    overlap: np.ndarray

    @classmethod
    def of(cls, obs: Mapping[str, Any], rows: int, horizon: int, action_dim: int) -> Request | None:
        """The batch's request, checked, or None for a plain call (no RTC entries)."""
        present = [key for key in KEYS if key in obs]
        if not present:
            return None
        if len(present) < len(KEYS):
            raise ValueError(f"an RTC call carries {', '.join(KEYS)}; this one has only {present}: build its rows "
                             "with agents.rtc.entries")
        prefix = np.asarray(obs[PREFIX], np.float32)
        delay, overlap = (np.asarray(obs[key]).astype(np.int64).reshape(-1) for key in (DELAY, OVERLAP))
        if prefix.shape != (rows, horizon, action_dim) or delay.shape != (rows,) or overlap.shape != (rows,):
            raise ValueError(f"{PREFIX} is {prefix.shape}, {DELAY}/{OVERLAP} {delay.shape}/{overlap.shape}; the model "
                             f"takes ({rows}, {horizon}, {action_dim}) and ({rows},): the prefix must be padded to the "
                             "model's action_horizon")
        if (delay < 0).any() or (delay > overlap).any() or (overlap > horizon).any() or not np.isfinite(prefix).all():
            raise ValueError(f"{DELAY}={delay.tolist()}, {OVERLAP}={overlap.tolist()}: each row needs 0 <= delay <= "
                             f"overlap <= {horizon} and a finite prefix")
        return cls(prefix, delay, overlap)

    @property
    def guides(self) -> bool:
        """Whether any row has an action to continue (else the call is exactly the plain sampler's)."""
        return bool((self.overlap > 0).any())

    def mask(self, config: RTCConfig) -> np.ndarray:
        """(B, H) each row's soft mask."""
        horizon = self.prefix.shape[1]
        return np.stack([soft_mask(int(d), int(k), horizon, config) for d, k in zip(self.delay, self.overlap)])


def commit(actions: np.ndarray, request: Request | None) -> np.ndarray:
    """(B, H, A) env actions with each row's first ``delay`` replaced by the committed ones, bit for bit."""
    if request is None:
        return actions
    actions = np.array(actions, copy=True)
    for row, d in enumerate(request.delay):
        actions[row, :d] = request.prefix[row, :d]
    return actions
