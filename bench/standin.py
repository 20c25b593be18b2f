"""The stand-in workload that measures the broker's own quality (bench/broker.py --standin).

A model call on b requests takes ``L(b) = a + c*b`` seconds of *sleep*: device time the host
waits on, using no CPU, like a GPU kernel. An env step sleeps ``e`` seconds: envs on cores of
their own. Each actor replans every ``R`` steps. Then the best any scheduler can do is bounded
(``Workload.bound``: in closed form, or with one worker by a small graph's best cycle, which
whole batches allow), and what the broker reaches, divided by it, is the broker's
efficiency, undisturbed by software-rendered envs that share the model's cores. Sleeps end late
(the host's timer: ~0.15 ms idle, up to a few ms under load), so the stand-ins measure their own
sleeps, and ``as_run`` gives the workload as it really ran: its bound is the tightest one.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from agents.episode_memory import EPISODE
from agents.policy import EpisodicPolicy
from envs.protocol import INSTRUCTION, PIXELS, STATE

STATE_DIM, ACTION_DIM = 8, 4


@dataclass(frozen=True)
class Workload:
    actors: int  # N: envs, each its own actor
    workers: int  # W: model copies
    batch_size: int  # B: most requests one call takes
    image_size: int = 224  # pixels per side of each camera's image
    cameras: int = 2
    latency_s: float = 0.030  # a: a call's fixed cost
    per_row_s: float = 0.003  # c: each request's extra cost in a call
    env_step_s: float = 0.010  # e
    replan_steps: int = 8  # R: env steps per model call
    episodic: bool = False  # the model remembers episodes (EpisodicSleepPolicy): each actor's calls carry its episode

    def model_s(self, b: float) -> float:
        return self.latency_s + self.per_row_s * b

    def bound(self) -> float:
        """The most env-steps/s any scheduler can reach: the crossing bound, or with one worker the
        window bound where that is tighter (16 actors: 955 against 1000, what two groups of 8 reach)."""
        crossing = self.crossing()[0]
        if self.workers > 1 or min(self.actors, self.batch_size) > WINDOW_MAX_SIZES:
            return crossing
        reached = best_schedule(self)
        if reached >= crossing * (1 - 1e-9):  # a schedule reaches the crossing: nothing is tighter
            return crossing
        R = self.replan_steps
        window = one_worker_bound(self.actors, self.batch_size, self.latency_s, self.per_row_s,
                                  R * self.env_step_s, reached / R, crossing / R)
        return min(crossing, R * window)

    def crossing(self) -> tuple[float, float]:
        """The crossing bound on env-steps/s, and the batch size at the crossing.

        Let b be the mean batch size a request is served in. An actor's cycle is at least
        R*e + L(b) (its R steps, then its call), so requests/s <= N / (R*e + L(b)); the workers
        spend L(b') per batch of mean size b' <= b, so requests/s <= W * b / L(b) (b/L(b) grows
        with b). The first falls with b, the second rises: the bound is their crossing, or an end
        of [1, B]. Greedy batching reaches it when the workers are the bottleneck or idle.
        """
        N, W, R = self.actors, self.workers, self.replan_steps

        def rate(b: float) -> float:
            return min(N / (R * self.env_step_s + self.model_s(b)), W * b / self.model_s(b))

        hi = float(min(self.batch_size, N))
        if rate(1.0) == N / (R * self.env_step_s + self.model_s(1.0)):
            return R * rate(1.0), 1.0
        # Bisect for the crossing of the falling and the rising branch.
        lo = 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if W * mid / self.model_s(mid) < N / (R * self.env_step_s + self.model_s(mid)):
                lo = mid
            else:
                hi = mid
        return R * rate(hi), hi

    def issue_bound(self) -> float:
        """The issue's simpler estimate: every call batches ceil(N/W) requests (capped at B)."""
        b = min(math.ceil(self.actors / self.workers), self.batch_size)
        return self.actors * self.replan_steps / (self.replan_steps * self.env_step_s + self.model_s(b))

    def lockstep(self) -> float:
        """Env-steps/s of the synchronous loop: every env steps R times, then one batched call
        split over the W workers (each runs its ceil(N/W) rows in batches of at most B), repeat."""
        rows = math.ceil(self.actors / self.workers)
        full, rest = divmod(rows, self.batch_size)
        call = full * self.model_s(self.batch_size) + (self.model_s(rest) if rest else 0.0)
        return self.actors * self.replan_steps / (self.replan_steps * self.env_step_s + call)

    def observation(self, seed: int = 0) -> dict:
        """One env's observation, as a batch of one row (what an actor sends)."""
        rng = np.random.default_rng(seed)
        size = (1, self.image_size, self.image_size, 3)
        return {
            PIXELS: {f"cam{k}": rng.integers(0, 256, size, dtype=np.uint8) for k in range(self.cameras)},
            STATE: rng.normal(size=(1, STATE_DIM)).astype(np.float32),
            INSTRUCTION: ("pick up the red block",),
        } | ({EPISODE: np.array([seed])} if self.episodic else {})

    def request_bytes(self) -> int:
        return self.cameras * self.image_size**2 * 3 + STATE_DIM * 4


class SleepPolicy:
    """A model whose call on b rows sleeps L(b) seconds and answers zero actions, but for the first
    number of each row: how much longer than L(b) the sleep took (for ``as_run``)."""

    def __init__(self, latency_s: float, per_row_s: float, action_horizon: int, device: str = "cpu"):
        self.latency_s, self.per_row_s, self.action_horizon = latency_s, per_row_s, action_horizon

    def predict(self, obs, noise_seeds=None):
        b = len(obs[STATE])
        seconds, start = self.latency_s + self.per_row_s * b, time.perf_counter()
        time.sleep(seconds)
        actions = np.zeros((b, self.action_horizon, ACTION_DIM), np.float32)
        actions[:, 0, 0] = time.perf_counter() - start - seconds
        return {"actions": actions}


class EpisodicSleepPolicy(SleepPolicy, EpisodicPolicy):
    """A SleepPolicy that remembers episodes, as an autoregressive WAM's worker does (their caches, without their
    maths): the broker keeps each episode on it, and must never place more than ``episode_capacity`` at once."""

    def __init__(self, latency_s: float, per_row_s: float, action_horizon: int, episode_capacity: int,
                 device: str = "cpu"):
        super().__init__(latency_s, per_row_s, action_horizon, device)
        self.episode_capacity = episode_capacity
        self.held: set[int] = set()

    def predict(self, obs, noise_seeds=None):
        self.held.update(int(episode) for episode in obs[EPISODE])
        if len(self.held) > self.episode_capacity:
            raise ValueError(f"{len(self.held)} episodes held, capacity {self.episode_capacity}")
        return super().predict(obs, noise_seeds)

    def end_episode(self, episode: int) -> None:
        self.held.discard(episode)


def sleep_policy_factory(workload: Workload):
    """A PolicyFactory (device -> policy) for the broker's workers."""
    if workload.episodic:
        return functools.partial(EpisodicSleepPolicy, workload.latency_s, workload.per_row_s, workload.replan_steps,
                                 workload.actors)
    return functools.partial(SleepPolicy, workload.latency_s, workload.per_row_s, workload.replan_steps)


def run_actor(act, workload: Workload, seed: int, control) -> None:
    """One stand-in env: each step calls ``act(obs, step)`` (the policy side: a model call every
    R steps, or a server round trip every step), then sleeps e. Sends "ready" on ``control``,
    receives (start, stop) monotonic times, sends back what it measured: each step's finish time
    and how long its sleep took, and what ``act`` returned when (the stand-in model's overshoot
    per call, where it reports one)."""
    obs = workload.observation(seed)
    control.send("ready")
    start, stop = control.recv()
    time.sleep(max(0.0, start - time.monotonic()))
    times, slept, calls, step = [], [], [], 0
    while not times or times[-1] < stop:
        if (late := act(obs, step)) is not None:
            calls.append((time.monotonic(), late))
        before = time.monotonic()
        time.sleep(workload.env_step_s)
        times.append(time.monotonic())
        slept.append(times[-1] - before)
        step += 1
    control.send({"step_ends": np.asarray(times), "step_sleeps": np.asarray(slept),
                  "model_overshoot": np.asarray(calls).reshape(-1, 2)})


def as_run(workload: Workload, runs: list[dict], lo: float, hi: float) -> Workload:
    """``workload`` as it ran in [lo, hi) (the window steps are counted in; while 64 actors start,
    sleeps end far later): env steps as long as the actors' sleeps took, and each call's fixed cost
    lengthened by the stand-in model's mean overshoot. No scheduler can beat its bound with these
    envs and this model on this host; what is left below it is the broker's own cost."""

    def within(times):
        return (times >= lo) & (times < hi)

    sleeps = np.concatenate([run["step_sleeps"][within(run["step_ends"])] for run in runs])
    calls = np.concatenate([run["model_overshoot"] for run in runs])
    overshoot = calls[within(calls[:, 0]), 1]
    return replace(workload, env_step_s=float(np.mean(sleeps)) if len(sleeps) else workload.env_step_s,
                   latency_s=workload.latency_s + (float(np.mean(overshoot)) if len(overshoot) else 0.0))


def broker_actor(client, workload: Workload, control) -> None:
    """A process entry point: run_actor through a BrokerClient (the path eval's actors take),
    one call per R steps, as a ChunkQueueAgent executing action chunks makes."""

    def act(obs, step):
        if step % workload.replan_steps == 0:
            return float(client.predict(obs).actions[0, 0, 0])  # SleepPolicy's overshoot (as_run); unread for a real model
        return None

    client.begin_episode(client.actor_id)
    run_actor(act, workload, client.actor_id, control)


def start_broker_actors(broker, workload: Workload) -> tuple[list, list]:
    """N actor processes on ``broker`` (broker_actor), and our ends of their control pipes."""
    actors, controls = [], []
    for i in range(workload.actors):
        client = broker.client(i)
        ours, theirs = broker.ctx.Pipe()
        actors.append(broker.ctx.Process(target=broker_actor, args=(client, workload, theirs), daemon=True))
        actors[-1].start()
        client.close()  # the actor holds its pipe now: its death reads as EOF
        theirs.close()
        controls.append(ours)
    return actors, controls


@dataclass
class Window:
    """Steps are counted in [start + warmup_s, stop]: the first calls all arrive at once."""

    warmup_s: float = 1.0
    measure_s: float = 4.0

    def times(self, margin_s: float = 0.2) -> tuple[float, float]:
        start = time.monotonic() + margin_s
        return start, start + self.warmup_s + self.measure_s

    def counted(self, start: float) -> tuple[float, float]:
        """The monotonic times steps are counted between, for a run started at ``start``."""
        return start + self.warmup_s, start + self.warmup_s + self.measure_s

    def rate(self, start: float, runs: list[dict]) -> float:
        """Env-steps/s over the window, from run_actor's reports."""
        lo, hi = self.counted(start)
        return sum(int(((run["step_ends"] >= lo) & (run["step_ends"] < hi)).sum()) for run in runs) / self.measure_s


# The window bound's graph has 2*B^2 nodes (B = min(actors, batch cap)): a few seconds at 16. Beyond,
# the crossing bound stands alone.
WINDOW_MAX_SIZES = 16


@functools.cache
def one_worker_bound(actors: int, batch_cap: int, a: float, c: float, think: float, reached: float,
                     crossing: float, rel_tol: float = 1e-6) -> float:
    """The most requests/s one worker can serve ``actors`` that each think ``think`` seconds
    between an answer and their next request, with L(s) = a + c*s; at most ``crossing``. A
    schedule is known to reach ``reached``.

    The window argument. The worker runs batches one after another: batch j of s_j requests takes
    L(s_j), then the worker idles i_j. An actor answered by batch j can be in batch j+1 only if
    i_j >= think, and in batch j+2 only if i_j + L(s_j+1) + i_j+1 >= think. So in any three
    batches in a row, the pairs that cannot share an actor are disjoint, and their sizes add up
    to at most N (with idles short, s_j + s_j+1 <= N). An idle of ``think`` or more counts whole;
    a shorter one lies in at most two pairs (j, j+2), so counting half of what each such pair
    lacks (think - L(s_j+1)) undercounts the idle. Every schedule is thus a path in a graph whose
    nodes are (s_j, s_j+1, whether i_j >= think) and whose edges carry s_j+1 requests and at most
    the worker's time for batch j+1; its rate is at most the best requests-per-second ratio of a
    cycle, found by bisection with Bellman-Ford looking for a cycle above each ratio.
    """
    S = min(batch_cap, actors)
    s = np.arange(1.0, S + 1)
    axes = (S, S, S, 2, 2, 2)  # s_j, s_j+1, s_j+2, long idle after j, long idle after j+1, a pair (j, j+2)
    s0, s1, s2 = s.reshape(-1, 1, 1, 1, 1, 1), s.reshape(1, -1, 1, 1, 1, 1), s.reshape(1, 1, -1, 1, 1, 1)
    long0, long1, pair = np.arange(2.0).reshape(-1, 1, 1), np.arange(2.0).reshape(1, -1, 1), np.arange(2.0)
    apart01, apart12 = 1 - long0, 1 - long1
    apart02 = apart01 * apart12 * (1 - pair)
    actors_needed = np.maximum.reduce([np.broadcast_to(v, axes) for v in (
        s0, s1, s2, apart01 * (s0 + s1), apart12 * (s1 + s2), apart02 * (s0 + s2), apart01 * apart12 * apart02 * (s0 + s1 + s2))])
    model = a + c * s1
    seconds = np.broadcast_to(model + think * long1 + 0.5 * np.maximum(0.0, think - model) * pair * apart01 * apart12, axes)
    requests = np.broadcast_to(s1, axes)
    possible = actors_needed <= actors

    def cycle_above(rate: float) -> bool:
        gain = np.where(possible, requests - rate * seconds, -np.inf)
        longest = np.zeros((S, S, 2))  # the longest path's gain into each node (s_j, s_j+1, long idle after j)
        for _ in range(2 * S * S + 1):
            longer = np.maximum(longest, (longest[:, :, None, :, None, None] + gain).max(axis=(0, 3, 5)))
            if np.array_equal(longer, longest):
                return False
            longest = longer
        return True

    lo, hi = reached * (1 - rel_tol), crossing
    if not cycle_above(hi):
        while hi - lo > rel_tol * hi:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cycle_above(mid) else (lo, mid)
    return hi


def best_schedule(workload: Workload) -> float:
    """Env-steps/s of the best fixed schedule a scheduler knowing L, e and R in advance can run:
    the actors in k groups taking turns on the workers, the best k (wam_gym.broker.batching.schedule: a
    reachable rate, so the true optimum lies between it and ``bound``)."""
    from wam_gym.broker.batching import schedule

    w = workload
    cycle, _ = schedule(w.actors, w.workers, w.batch_size, w.latency_s, w.per_row_s, w.replan_steps * w.env_step_s)
    return w.actors * w.replan_steps / cycle


def simulate(workload: Workload, wait_ms: float, pacing: bool = True, seconds: float = 60.0,
             warmup_s: float = 5.0, jitter: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Env-steps/s and mean batch size of the broker's batching rule (its real Batcher and Pacer)
    with zero overhead: the rule's own quality. Each think time varies by up to ``jitter``."""
    import heapq
    import random

    from wam_gym.broker.batching import Batcher, Pacer, Request

    w, rng = workload, random.Random(seed)
    batcher, pacer = Batcher(w.batch_size, wait_ms), Pacer(w.batch_size) if pacing else None
    if pacer is not None:
        batcher.verdict = pacer.verdict
    events = [(rng.uniform(0, 1e-3), 0, "request", i) for i in range(w.actors)]  # (time, tiebreak, kind, what)
    heapq.heapify(events)
    order, idle, steps, sizes = 1, list(range(w.workers)), 0, []
    while events:
        now, _, kind, what = heapq.heappop(events)
        if now > seconds:
            break
        if kind == "request":
            batcher.add(Request(what, order, {}, None, now))
            if pacer is not None:
                pacer.arrived(what, now)
        elif kind == "done":
            worker, batch, batch_id = what
            if pacer is not None and not idle:
                batcher.free_since = now  # as the broker's _free
            idle.append(worker)
            if pacer is not None:
                pacer.batch_done(len(batch), w.model_s(len(batch)))
            for request in batch:
                steps += w.replan_steps if now > warmup_s else 0
                if pacer is not None:
                    pacer.answered(request.actor_id, now, batch_id)
                think = w.replan_steps * w.env_step_s * (1 + rng.uniform(0, jitter))
                order += 1
                heapq.heappush(events, (now + think, order, "request", request.actor_id))
            if pacer is not None:
                batcher.limit = pacer.target(w.workers, now)
                batcher.hold_s = pacer.hold_s()
        while idle and (batch := batcher.pop_ready(now)):
            sizes.append(len(batch))
            order += 1
            heapq.heappush(events, (now + w.model_s(len(batch)), order, "done", (idle.pop(), batch, len(sizes))))
        if idle and (deadline := batcher.next_deadline()) is not None:
            order += 1
            heapq.heappush(events, (max(deadline, now) + 1e-9, order, "tick", None))
    return steps / (seconds - warmup_s), sum(sizes) / max(len(sizes), 1)
