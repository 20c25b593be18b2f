"""Batch pacing, measured where it is exact: against the closed-form bound and the best schedule
of bench/standin.py's workload, by simulating the broker's own Batcher and Pacer (no clocks)."""

from __future__ import annotations

import pytest

from bench.standin import Workload, best_schedule, simulate
from wam_gym.broker.batching import Batcher, Pacer, Request, schedule


def test_bound_is_the_crossing_of_actor_and_worker_limits():
    # 8 actors, 1 worker: requests/s <= 8 / (0.08 + L(b)) and <= b / L(b), L(b) = 0.03 + 0.003 b.
    rate, b = Workload(8, 1, 16).crossing()
    assert b == pytest.approx(2.5618, abs=1e-3)
    assert rate == pytest.approx(8 * 8 / (0.08 + 0.03 + 0.003 * b))
    # A saturated worker: every batch full, 16 rows per L(16).
    rate, b = Workload(64, 1, 16).crossing()
    assert (b, rate) == (16.0, pytest.approx(16 * 8 / 0.078))
    # One actor: nothing to batch.
    assert Workload(1, 4, 16).crossing() == (pytest.approx(8 / 0.113), 1.0)


def test_one_worker_bound_is_what_the_best_schedule_reaches():
    # 16 actors, 1 worker: the crossing (1000 steps/s at batches of 6) needs a batch every 48 ms with
    # each actor back after 128 ms, 2.67 batches later; whole batches allow 2 groups of 8 (955).
    load = Workload(16, 1, 16)
    assert load.crossing()[0] == pytest.approx(1000)
    assert load.bound() == pytest.approx(best_schedule(load), rel=1e-5) == pytest.approx(955.2, abs=0.1)
    assert Workload(32, 1, 16).bound() == pytest.approx(best_schedule(Workload(32, 1, 16)), rel=1e-5)
    # Where the window argument is looser (8 actors: 561 steps/s), the crossing stands; so it does
    # with more workers (batches overlap), and where a schedule reaches the crossing (64 actors).
    for load in (Workload(8, 1, 16), Workload(16, 2, 16), Workload(64, 1, 16)):
        assert load.bound() == load.crossing()[0]


@pytest.mark.parametrize("actors", [4, 8, 16, 32])
def test_no_schedule_beats_the_one_worker_bound(actors):
    """The rule with zero overhead and exact think times, and the best fixed schedule (the fastest of
    every k groups, wam_gym.broker.batching.schedule), stay under it."""
    load = Workload(actors, 1, 16)
    edge = 16 * 8 / (30 - 5)  # the simulation counts steps when batches end: one batch more or less in its window
    assert simulate(load, wait_ms=5, jitter=0.0, seconds=30)[0] <= load.bound() + edge
    assert best_schedule(load) <= load.bound() * (1 + 1e-9)


def test_issue_formula_and_lockstep():
    load = Workload(32, 2, 16)
    assert load.issue_bound() == pytest.approx(32 * 8 / (0.08 + 0.078))
    assert load.lockstep() == pytest.approx(32 * 8 / (0.08 + 0.078))
    assert Workload(64, 1, 16).lockstep() == pytest.approx(64 * 8 / (0.08 + 4 * 0.078))
    # The issue's formula ignores the workers' capacity: 2x above what any scheduler reaches here.
    assert Workload(64, 1, 16).issue_bound() > 1.9 * Workload(64, 1, 16).bound()


def test_best_schedule_reaches_most_of_the_bound():
    for n in (1, 4, 8, 16, 32, 64):
        for w in (1, 2, 4):
            load = Workload(n, w, 16)
            assert 0.95 < best_schedule(load) / load.bound() <= 1 + 1e-9


def best_group_size(actors: int, workers: int, a: float, c: float, think: float = 0.080, batch_size: int = 16) -> int:
    return schedule(actors, workers, batch_size, a, c, think)[1]


def test_best_group_size():
    # One worker, 8 actors thinking 80 ms, L(b) = 30 + 3b ms: three groups (3, 3, 2) beat one of 8.
    assert best_group_size(8, 1, 0.030, 0.003) == 3
    # A fixed cost that dwarfs the think time: one full batch.
    assert best_group_size(8, 1, 1.0, 0.001) == 8
    # More actors than a batch holds: at least ceil(n/B) groups.
    assert best_group_size(40, 1, 0.030, 0.003) <= 16
    # The worker the bottleneck, n no multiple of B (the tiny preset on an H200: L(b) = 90.6 ms +
    # 0.06 ms * b): full batches back to back, 148/64 = 2.31 a cycle, not 3 equal groups of 50.
    assert best_group_size(148, 1, 0.0906, 0.00006, batch_size=64) == 64
    assert schedule(148, 1, 64, 0.0906, 0.00006, 0.080)[0] == pytest.approx(148 / 64 * (0.0906 + 64 * 0.00006))
    assert schedule(296, 2, 64, 0.0906, 0.00006, 0.080)[0] == pytest.approx(148 / 64 * (0.0906 + 64 * 0.00006))
    # Not the bottleneck: the actors would wait for full batches; two groups of 50 (no rolling).
    assert best_group_size(100, 1, 0.0906, 0.00006, batch_size=64) == 50
    # Groups take turns on any worker: 64 actors, 4 workers run 11 groups of 6 (a cycle of 130.5 ms,
    # 0.98 of the bound), not each worker's 16 actors in 2 groups of 8 (134 ms).
    assert best_group_size(64, 4, 0.030, 0.003) == 6
    assert schedule(64, 4, 16, 0.030, 0.003, 0.080)[0] == pytest.approx((11 * 0.030 + 64 * 0.003) / 4)
    assert 64 * 8 / schedule(64, 4, 16, 0.030, 0.003, 0.080)[0] > 0.975 * Workload(64, 4, 16).bound()


def test_pacer_fits_batch_times_and_counts_active_actors():
    pacer = Pacer(batch_size=16)
    assert pacer.target(workers=1, now=0.0) == 16  # nothing known: as without pacing
    for size in (2, 8):
        for _ in range(3):
            pacer.batch_done(size, 0.030 + 0.003 * size)
    assert pacer.batch_time() == (pytest.approx(0.030), pytest.approx(0.003))
    for actor in range(8):
        pacer.answered(actor, 1.0, batch=0)
        pacer.arrived(actor, 1.08)
    assert pacer.target(workers=1, now=1.1) == 3
    assert pacer.target(workers=4, now=1.5) == 1  # two actors a worker: each alone (L(1) + L(1) < think)
    for actor in range(1, 8):  # 7 actors thinking far longer than they do: gone quiet
        pacer.answered(actor, 1.5, batch=1)
    assert pacer.target(workers=1, now=10.0) == 1  # one active actor (queued since 1.08): never wait for company
    for actor in range(1, 8):
        pacer.arrived(actor, 10.0)  # back, and queued however long: active
    assert pacer.target(workers=1, now=20.0) == 3
    for actor in range(1, 8):
        pacer.forget(actor)
    assert pacer.target(workers=1, now=30.0) == 1


def test_batcher_releases_at_the_pacers_limit():
    batcher = Batcher(batch_size=16, wait_ms=5)
    batcher.limit = 3
    for rid in range(7):
        batcher.add(Request(rid, rid, {}, None, arrived=0.0))
    assert [len(batcher.pop_ready(now=0.0)) for _ in range(2)] == [3, 3]
    assert batcher.pop_ready(now=0.001) is None and len(batcher) == 1
    assert len(batcher.pop_ready(now=0.006)) == 1


def test_paced_batching_keeps_a_saturated_worker_busy():
    """148 actors, batches of 64, a fixed cost that dwarfs the per-row cost (the tiny preset on an
    H200, eager): equal groups of 50 reached 0.79 of the bound; full batches back to back reach it."""
    load = Workload(148, 1, 64, latency_s=0.0906, per_row_s=0.00006)
    paced, mean_batch = simulate(load, wait_ms=5, seconds=30)
    assert paced / load.bound() >= 0.99
    assert mean_batch > 63


@pytest.mark.parametrize("actors,workers", [(4, 1), (8, 1), (16, 2), (16, 4), (32, 2), (32, 4), (64, 4)])
def test_paced_batching_reaches_the_best_schedule_in_simulation(actors, workers):
    """The broker's rule with zero overhead, on the stand-in workload: >= 0.97 of the best fixed
    schedule, where always-full batches fall to 0.7-0.86 (actors fall into step)."""
    load = Workload(actors, workers, 16)
    best = best_schedule(load)
    paced, _ = simulate(load, wait_ms=5, seconds=30)
    unpaced, _ = simulate(load, wait_ms=5, pacing=False, seconds=30)
    assert paced / best >= 0.97
    assert paced > unpaced


@pytest.mark.parametrize("actors", [1, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_with_exact_think_times_the_rule_is_the_best_schedule(actors, workers):
    """No jitter, zero overhead: every point of the sweep runs the best schedule. 8 actors on one worker
    reached 0.983 of it while the plan's group of 2 (beside two of 3) waited the batch wait each cycle."""
    load = Workload(actors, workers, 16)
    paced, _ = simulate(load, wait_ms=5, seconds=30, jitter=0.0)
    assert paced / best_schedule(load) >= 0.995


def test_a_partial_group_waits_for_its_stragglers_only():
    """Members of a group's last batch still out: the group waits up to one call's fixed cost for them
    (released without them, a straggler costs a batch of its own and the groups fragment for good);
    a group whose last batch is all back goes at once if the plan has groups of its size, else after the
    usual wait."""
    pacer = Pacer(batch_size=4)
    for size in (2, 4):
        pacer.batch_done(size, 0.030 + 0.003 * size)
    batcher = Batcher(batch_size=4, wait_ms=5)
    batcher.verdict, batcher.hold_s = pacer.verdict, pacer.hold_s()
    assert batcher.hold_s == pytest.approx(0.030)
    for actor in range(4):
        pacer.answered(actor, 0.0, batch=7)  # actors 0-3 answered together
    pacer.answered(4, 0.0, batch=8)  # actor 4 alone
    for actor in (0, 1, 2):
        pacer.arrived(actor, 0.080)
        batcher.add(Request(actor, actor, {}, None, arrived=0.080))
    assert batcher.pop_ready(now=0.090) is None  # actor 3 is out: held past the 5 ms wait
    assert batcher.next_deadline() == pytest.approx(0.110)
    assert len(batcher.pop_ready(now=0.111)) == 3  # ... for one fixed cost at most
    pacer.arrived(4, 0.200)
    batcher.add(Request(4, 4, {}, None, arrived=0.200))
    assert batcher.pop_ready(now=0.204) is None and len(batcher.pop_ready(now=0.206)) == 1  # no plan yet: the wait
    batcher.free_since = 0.300  # a held group waited for a worker: its hold counts from the worker's freeing
    pacer.answered(5, 0.25, batch=9)
    pacer.answered(6, 0.25, batch=9)
    pacer.arrived(5, 0.26)
    batcher.add(Request(5, 5, {}, None, arrived=0.26))
    assert batcher.pop_ready(now=0.32) is None and len(batcher.pop_ready(now=0.331)) == 1
    # With a plan (the 5 actors seen, on one worker: groups of 2, 2 and 1), a group that is its whole last
    # batch goes at once.
    assert pacer.target(workers=1, now=0.4) == 2
    for actor in (7, 8):
        pacer.answered(actor, 0.4, batch=10)
    for actor in (7, 8):
        pacer.arrived(actor, 0.48)
        batcher.add(Request(actor, actor, {}, None, arrived=0.48))
    assert len(batcher.pop_ready(now=0.48)) == 2
    pacer.arrived(4, 0.49)  # its whole last batch, alone
    batcher.add(Request(4, 10, {}, None, arrived=0.49))
    assert len(batcher.pop_ready(now=0.49)) == 1


def test_fragmented_groups_join_again(monkeypatch):
    """8 actors forced into pairs for 5 s (what a busy host does to the broker now and then) stay in
    pairs once the plan is 3, 3 and 2 again, unless partial groups wait for whoever is due next while
    batches run well under the plan (0.82 of the best schedule without, >= 0.97 with)."""
    real = Pacer.target
    monkeypatch.setattr(Pacer, "target", lambda self, workers, now: 2 if now < 5.0 else real(self, workers, now))
    load = Workload(8, 1, 16)
    paced, mean_batch = simulate(load, wait_ms=5, seconds=40, warmup_s=10)
    assert paced / best_schedule(load) >= 0.97 and mean_batch > 2.5
