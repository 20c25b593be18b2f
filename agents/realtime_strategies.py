"""How a real-time agent merges the chunks that arrive while the robot moves (``EVALUATION.realtime_strategy``).

Every chunk is anchored in time: chunk ``k`` was asked for at step ``s_k`` with that step's observation, so its
action ``i`` is meant for step ``s_k + i``; it arrives ``d`` steps later (agents/realtime.py). At step ``t``:

* ``hold`` (the default, the rule before strategies existed): the newest arrived chunk's action ``t - s_k``; once
  that chunk has run out, its last action repeated until the next arrives. Calls go out every
  ``max(replan_steps, d)`` steps.
* ``naive``: the same switch (the new chunk takes over at its action ``d``, whatever the jump), but the robot is not
  left holding: the next call goes out after ``min(replan_steps, horizon - d)`` steps (``d`` of the last call), so
  that a call as slow as the last arrives before the current chunk ends. With ``replan_steps + d <= horizon``
  it acts as ``hold`` step for step; they part where the delay eats the chunk's rest.
* ``ensemble``: temporal ensembling (ACT, Zhao et al. 2023): the mean of every arrived chunk's action for ``t``,
  weighted ``exp(-m i)`` with ``i = 0`` the oldest (ACT's ``m = 0.01``). Calls as ``naive``.
* ``rtc``: real-time chunking (agents/rtc.py): each call carries the actions the robot will execute from its step
  on (the current chunk's rest, held past its end up to ``d``), and the model's sampler continues them; the
  switch is ``naive``'s, so the first ``d`` actions of the new chunk are the committed ones. A fixed latency
  gives ``d`` in advance; a measured one is estimated by the last call's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STRATEGIES = ("hold", "naive", "ensemble", "rtc")
ENSEMBLE_DECAY = 0.01  # ACT's temporal-ensembling m: weight exp(-m i), i = 0 the oldest chunk


@dataclass(frozen=True)
class Anchored:
    """A chunk whose action ``i`` is meant for step ``start + i``."""

    start: int
    actions: np.ndarray  # (horizon, action_dim)

    def covers(self, t: int) -> bool:
        return 0 <= t - self.start < len(self.actions)


class Hold:
    """The newest chunk's action for ``t``; its last once it runs out."""

    name = "hold"
    carries_prefix = False  # whether calls carry the committed actions (rtc)

    def next_call_in(self, replan_steps: int, horizon: int, delay: int, expected: int) -> int:
        """Steps from a call to the next: never while one is in flight (at least ``delay``, this call's; 0 for an
        awaited one); ``expected``: the next call's delay as this one's suggests."""
        return max(replan_steps, delay, 1)

    def action(self, chunks: list[Anchored], t: int) -> tuple[np.ndarray, bool]:
        """(the action for step ``t``, whether it repeats a chunk's last action for want of one)."""
        newest = chunks[-1]
        if newest.covers(t):
            return newest.actions[t - newest.start], False
        return newest.actions[-1], True

    def committed(self, chunks: list[Anchored], t: int, delay: int) -> np.ndarray:
        """(k, A) the actions this strategy will execute from step ``t`` on if nothing arrives: the newest chunk's
        rest, its last action held up to ``delay`` steps."""
        newest = chunks[-1]
        rest = newest.actions[max(t - newest.start, 0):]
        if len(rest) < delay:
            rest = np.concatenate([rest, np.repeat(newest.actions[-1:], delay - len(rest), axis=0)])
        return rest


class Naive(Hold):
    name = "naive"

    def next_call_in(self, replan_steps: int, horizon: int, delay: int, expected: int) -> int:
        return max(min(replan_steps, horizon - expected), delay, 1)


class Ensemble(Naive):
    name = "ensemble"

    def __init__(self, decay: float = ENSEMBLE_DECAY):
        self.decay = decay

    def action(self, chunks: list[Anchored], t: int) -> tuple[np.ndarray, bool]:
        covering = [chunk.actions[t - chunk.start] for chunk in chunks if chunk.covers(t)]  # oldest first
        if not covering:
            return chunks[-1].actions[-1], True
        weights = np.exp(-self.decay * np.arange(len(covering)))
        return (np.tensordot(weights / weights.sum(), np.stack(covering), axes=1)).astype(np.float32), False


class RealTimeChunking(Naive):
    name = "rtc"
    carries_prefix = True


def strategy(name: str) -> Hold:
    """The strategy called ``name``."""
    kinds = {"hold": Hold, "naive": Naive, "ensemble": Ensemble, "rtc": RealTimeChunking}
    if name not in kinds:
        raise ValueError(f"EVALUATION.realtime_strategy={name!r}: choose one of {', '.join(STRATEGIES)}")
    return kinds[name]()


def kept(chunks: list[Anchored], t: int, strategy: Hold) -> list[Anchored]:
    """The chunks a strategy may still read at step ``t`` (the newest always)."""
    if not isinstance(strategy, Ensemble):
        return chunks[-1:]
    return [chunk for chunk in chunks[:-1] if chunk.start + len(chunk.actions) > t] + chunks[-1:]

