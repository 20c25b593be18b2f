"""Dynamic batching: group pending requests by input shape, release a group when it is full
or when its oldest request has waited ``inference_batch_wait_ms``.

"Full" is ``inference_batch_size``, or less when the ``Pacer`` says smaller batches serve the
actors sooner. Pure bookkeeping (no processes, no clocks of its own), so the policy is easy to
test, and bench/broker.py simulates it against the best schedule.
"""

from __future__ import annotations

import statistics
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wam_gym.broker.shared_obs import SharedArray

# How a partial group waits for company (Pacer.verdict): up to the batch wait, up to one call's fixed
# cost for its stragglers, or not at all.
WAIT, HOLD, GO = "wait", "hold", "go"


def shape_key(obs: Mapping[str, Any]) -> Hashable:
    """Requests batch together only if every array has the same shape and dtype."""
    key = []
    for name in sorted(obs):
        value = obs[name]
        if isinstance(value, Mapping):
            key.append((name, shape_key(value)))
        elif isinstance(value, np.ndarray):
            key.append((name, value.shape, value.dtype.str))
        elif isinstance(value, SharedArray):
            key.append((name, value.shape, value.dtype))
    return tuple(key)


@dataclass
class Request:
    """One env's observation waiting for a model call."""

    actor_id: int
    request_id: int
    obs: dict[str, Any]
    noise_seed: int | None
    arrived: float  # time.monotonic() when its actor sent it (one clock for all processes of a machine)
    segment: str | None = None  # the actor's shared-memory slot holding obs's large arrays
    worker: int | None = None  # the model worker that holds its episode (the broker's sessions); None: any
    key: Hashable = field(init=False)

    def __post_init__(self) -> None:
        self.key = shape_key(self.obs)


class Batcher:
    """Pending requests in groups that may share a batch: the same input shapes and the same route (a request
    of an episode goes to the model worker that holds it, ``Request.worker``; others to any worker). Methods
    that take a ``worker`` consider only the groups it may take (None: every group)."""

    def __init__(self, batch_size: int, wait_ms: float):
        if batch_size < 1:
            raise ValueError(f"MULTIRUN.inference_batch_size must be >= 1, got {batch_size}")
        if wait_ms < 0:
            raise ValueError(f"MULTIRUN.inference_batch_wait_ms must be >= 0, got {wait_ms}")
        self.batch_size = batch_size
        self.limit = batch_size  # the batch size released at once (the Pacer's target, at most batch_size)
        self.wait_s = wait_ms / 1000
        # Set by the broker when batches are paced (Pacer.verdict): a partial group that must HOLD (members
        # of its last batch are still out) waits up to ``hold_s`` instead of ``wait_s``, from when a worker
        # could take it (its oldest request's arrival, or a worker freed after that); one that may GO (it is
        # its members' whole last batch: a group of the plan, all back) waits for nobody.
        self.free_since = float("-inf")
        self.hold_s = 0.0
        self.verdict: Callable[[list[Request]], str] | None = None
        self._groups: OrderedDict[tuple[int | None, Hashable], list[Request]] = OrderedDict()  # (route, shapes)

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def add(self, request: Request, front: bool = False) -> None:
        """Queue a request; ``front`` for one coming back from a dead worker (it goes first)."""
        group = self._groups.setdefault((request.worker, request.key), [])
        group.insert(0, request) if front else group.append(request)

    def drop_actor(self, actor_id: int) -> None:
        """Forget the requests of an actor that died: nobody waits for their replies."""
        for key in list(self._groups):
            kept = [r for r in self._groups[key] if r.actor_id != actor_id]
            if kept:
                self._groups[key] = kept
            else:
                del self._groups[key]

    def take_routed(self, worker: int) -> list[Request]:
        """Remove and return every request bound for ``worker`` (it lost its episodes)."""
        taken = []
        for key in [k for k in self._groups if k[0] == worker]:
            taken += self._groups.pop(key)
        return taken

    def next_deadline(self, workers: Collection[int] | None = None) -> float | None:
        """When the oldest pending group that one of ``workers`` may take must be released (monotonic
        seconds), if any."""
        return min((self._due(g) for k, g in self._groups.items() if _routable(k, workers)), default=None)

    def _due(self, group: list[Request]) -> float:
        """When a partial group is released without more company."""
        verdict = WAIT if self.verdict is None else self.verdict(group)
        if verdict == HOLD:
            return max(group[0].arrived, self.free_since) + max(self.hold_s, self.wait_s)
        return group[0].arrived + (0.0 if verdict == GO else self.wait_s)

    def pop_ready(self, now: float, worker: int | None = None) -> list[Request] | None:
        """The next batch to run (on ``worker``): a full group first, else the group whose wait expired first."""
        if full := self.pop_full(worker):
            return full
        workers = None if worker is None else (worker,)
        expired = [(g[0].arrived, k) for k, g in self._groups.items() if _routable(k, workers) and now >= self._due(g)]
        return self._take(min(expired, key=lambda pair: pair[0])[1]) if expired else None

    def pop_full(self, worker: int | None = None) -> list[Request] | None:
        """A full group (``limit`` requests) ``worker`` may take, if there is one: what may wait for a busy worker."""
        workers = None if worker is None else (worker,)
        for key, group in self._groups.items():
            if len(group) >= self.limit and _routable(key, workers):
                return self._take(key)
        return None

    def _take(self, key: tuple[int | None, Hashable]) -> list[Request]:
        group = self._groups[key]
        batch, rest = group[: self.limit], group[self.limit :]
        if rest:
            self._groups[key] = rest
        else:
            del self._groups[key]
        return batch


def _routable(key: tuple[int | None, Hashable], workers: Collection[int] | None) -> bool:
    """Whether one of ``workers`` (None: any) may take the group ``key``: it is bound for none, or for one of them."""
    return workers is None or (key[0] is None and bool(workers)) or key[0] in workers


# Batch timings kept per batch size, and think times kept, for the Pacer's estimates.
PACER_WINDOW = 64
# Actors answered this many cycles (think time + a batch) ago and not back are not counted as
# active (an episode reset, a session that went quiet); those waiting in the queue always are.
PACER_IDLE_CYCLES = 4
# The target is worked out again at most this often (medians over the windows cost ~0.3 ms).
PACER_REFRESH_S = 0.1
# Groups count as fragmented when the mean of this many recent batches is under FRAGMENTED x the target.
PACER_RECENT, FRAGMENTED = 12, 0.8


class Pacer:
    """How many requests to release at once, so that actors wait least.

    Actors in a closed loop come back one think time (their env steps) after their answer. If
    every batch takes all the requests waiting (up to the batch size), actors fall into step
    with each other: all wait for one large batch, then the workers idle while all think. The
    best schedule splits the N actors into k groups served in turn by whichever worker is free:
    one cycle lasts P(k) = max(the k batches' times over the W workers, think + the largest
    batch's time), and the k that minimises P(k) wins (:func:`schedule`). Released at that group
    size, batches keep the groups apart: simulated with zero overhead on bench/broker.py
    --standin's workload, >= 0.97 of that best schedule.

    The batch time is fitted as a + c*b to the medians of recent batches of each size. The broker
    times a batch as long as it kept its worker from the next one (from hand-over, or the end of
    the batch before, to its result), not the model call alone: the pipes' and the stacking's
    cost per batch then count, and the schedule keeps the slack they need (64 actors on 4
    workers: groups of 7, 0.93 of the bound, where groups of 6 left the workers no slack: 0.90).

    Groups stay together only if nobody is left behind: a group whose last member is a few ms
    late (on a busy host, 16 actors writing 300 kB each do not all come back at once) would go
    without it, the straggler would get a batch of its own, and nothing joins groups again (32
    actors settled into batches of 5, 13 and 14 where the plan was 16 and 16). So each actor's
    group is the batch that last answered it, and a partial group with members still out
    (:meth:`holds`) waits up to one call's fixed cost for them (:meth:`hold_s`): what a batch of
    their own would cost. A group that is all back, of a size the plan has, goes at once: nobody
    else is due to join it, and the batch wait would idle a free worker (8 actors on one worker:
    the plan's group of 2 waited 5 ms a cycle, 0.972 of the bound where the best schedule reaches
    0.989); a smaller one waits, so that remnants join again. Groups that did fragment (8 actors in
    four pairs where the plan is 3, 3 and 2: each pair a whole group, so nobody is missing) are
    joined again: while recent batches average under ``FRAGMENTED`` x the target, a partial group
    also waits for whoever is due next.
    """

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._times: dict[int, deque[float]] = {}  # batch size -> recent model seconds
        self._think: deque[float] = deque(maxlen=PACER_WINDOW)
        self._answered: dict[int, float] = {}  # actor -> when its last answer left (until it comes back)
        self._cohort: dict[int, int] = {}  # actor -> the batch that answered it last (its group)
        self._out: Counter[int] = Counter()  # batch -> its actors not back yet (those in _answered)
        self._seen: set[int] = set()  # actors that sent a request (until forgotten)
        self._sizes: deque[int] = deque(maxlen=PACER_RECENT)  # recent batch sizes
        self._target, self._refresh_at = batch_size, float("-inf")
        self._smallest = batch_size  # the plan's smallest group: its N actors in k groups of floor or ceil(N/k)

    def batch_done(self, size: int, seconds: float) -> None:
        self._times.setdefault(size, deque(maxlen=PACER_WINDOW)).append(seconds)
        self._sizes.append(size)

    def answered(self, actor_id: int, now: float, batch: int) -> None:
        self._back(actor_id)
        self._answered[actor_id], self._cohort[actor_id] = now, batch
        self._out[batch] += 1

    def arrived(self, actor_id: int, when: float) -> None:
        if actor_id in self._answered:
            self._think.append(max(0.0, when - self._answered[actor_id]))
        self._back(actor_id)
        self._seen.add(actor_id)

    def forget(self, actor_id: int) -> None:
        self._back(actor_id)
        self._cohort.pop(actor_id, None)
        self._seen.discard(actor_id)

    def _back(self, actor_id: int) -> None:
        """``actor_id`` is no longer out (it came back, or is forgotten)."""
        if self._answered.pop(actor_id, None) is not None:
            batch = self._cohort[actor_id]
            self._out[batch] -= 1
            if not self._out[batch]:
                del self._out[batch]

    def verdict(self, group: list) -> str:
        """How the partial ``group`` waits for company: HOLD for stragglers (:meth:`holds`); GO when every
        member was batched before and none of their last batches' actors is out (the group is back whole);
        else WAIT, the batch wait (actors new to the broker gather in it)."""
        if self.holds(group):
            return HOLD
        return GO if len(group) >= self._smallest and all(r.actor_id in self._cohort for r in group) else WAIT

    def holds(self, group: list) -> bool:
        """Whether some actor that was batched with a member of ``group`` last time is not back yet: a
        straggler of the same group, due any moment. Released without it, it would cost a batch of its
        own, and the groups would fragment for good (nothing joins them again). An actor that went
        quiet instead (an env reset, an exit) costs its group one hold: the batch that then goes is the
        group's new cohort, without it."""
        if any(self._out.get(self._cohort.get(r.actor_id, -1), 0) for r in group):
            return True
        return bool(self._out) and len(group) < self._target and self.fragmented()

    def fragmented(self) -> bool:
        """Recent batches are well under the planned size: groups split and did not join again (in
        simulation, forced into pairs for 5 s, 8 actors stayed in pairs at 0.82 of the bound)."""
        sizes = self._sizes
        return len(sizes) >= PACER_RECENT * 2 // 3 and sum(sizes) < FRAGMENTED * self._target * len(sizes)

    def hold_s(self) -> float:
        """How long a group waits for its stragglers: one call's fixed cost, what a batch of its own costs."""
        fit = self.batch_time()
        return 0.0 if fit is None else fit[0]

    def batch_time(self) -> tuple[float, float] | None:
        """(a, c) of a + c*b, fitted once two batch sizes were timed. Before, from the one size s
        seen, a prior: L(s) = a + c*s with a full batch costing twice a single request (c = a/B).
        None before any batch. In plain Python: the dispatcher fits after every batch, and numpy's
        median and polyfit on a few points cost it ~1 ms a batch (statistics' ~10 us)."""
        points = [(b, statistics.median(t)) for b, t in self._times.items()]
        if len(points) == 1:
            (size, seconds), = points
            a = seconds / (1 + size / self.batch_size)
            return a, a / self.batch_size
        if not points:
            return None
        c, a = statistics.linear_regression(*zip(*points))  # least squares
        return max(a, 0.0), max(c, 0.0)

    def target(self, workers: int, now: float) -> int:
        """The batch size to release at once, worked out again every PACER_REFRESH_S."""
        if now >= self._refresh_at:
            (self._target, self._smallest), self._refresh_at = self._work_out(workers, now), now + PACER_REFRESH_S
        return self._target

    def _work_out(self, workers: int, now: float) -> tuple[int, int]:
        """The plan's (largest, smallest) group: the target, and the least a group that goes at once holds."""
        fit = self.batch_time()
        if fit is None or not self._think or workers < 1:
            return self.batch_size, self.batch_size
        think = statistics.median(self._think)
        a, c = fit
        horizon = PACER_IDLE_CYCLES * (think + a + c * self.batch_size)
        active = max(1, sum(1 for actor in self._seen if now - self._answered.get(actor, now) <= horizon))
        largest = schedule(active, workers, self.batch_size, a, c, think)[1]
        return largest, active // -(-active // largest)


def schedule(actors: int, workers: int, batch_size: int, a: float, c: float, think: float) -> tuple[float, int]:
    """(cycle seconds, batch size) of the best schedule for ``actors`` that think ``think`` seconds
    between calls of a + c*b seconds, served by ``workers``: the actors in k groups that take turns
    on whichever worker is free, one cycle lasting max(the k batches spread over the workers,
    think + the largest batch); or, with more actors than the workers' batches hold and the workers
    the bottleneck, full batches back to back: every actor is back before the batch in flight
    ends, so no worker idles and each actor's cycle is N/(W*B) full batches (fewer than the
    ceil(N/B) equal groups cost when N is no multiple of B: 148 actors, B = 64 and a fixed cost
    a >> c*B run 2.31 batches a cycle, not 3).

    Groups are not tied to workers: 64 actors on 4 workers run best as 11 groups of 6 in turn
    (0.98 of the bound), where 4 workers each serving its own 16 actors in 2 groups of 8 reach
    0.955 of it (the k groups of one worker must be a multiple of the workers)."""
    best_cycle, best_size = float("inf"), batch_size
    for k in range(-(-actors // batch_size), actors + 1):
        largest = -(-actors // k)
        busy = (k * a + c * actors) / workers  # the k batches, spread over the workers
        cycle = max(busy, think + a + c * largest)
        if cycle < best_cycle * (1 - 1e-9):  # ties: fewer, larger batches
            best_cycle, best_size = cycle, largest
    full = a + c * batch_size
    rolling = actors / (workers * batch_size) * full
    if actors > workers * batch_size and rolling >= think + full and rolling < best_cycle:
        best_cycle, best_size = rolling, batch_size
    return best_cycle, best_size
