"""wam_gym.utils.stats: published values, scipy cross-checks, and seeded Monte-Carlo checks of the sequential rules."""

from __future__ import annotations

import functools
import math
import random

import numpy as np
import pytest
from scipy import special
from scipy.stats import binomtest

from wam_gym.utils.stats import (
    Z95,
    PairedTable,
    _half_tail_exact,
    _half_tail_series,
    confidence_sequence,
    mcnemar_exact,
    mean_difference_interval,
    mean_rate_interval,
    mover,
    paired_difference_interval,
    paired_e_value,
    percentile,
    sequential_paired_decision,
    wilson,
    z_value,
)


def rounded(interval: tuple[float, float], digits: int = 4) -> tuple[float, float]:
    return round(interval[0], digits), round(interval[1], digits)


# --------------------------------------------------------------------------- z and Wilson


def test_z_value():
    assert Z95 == pytest.approx(1.959963985, abs=1e-9)
    assert z_value() == Z95
    assert z_value(0.90) == pytest.approx(1.644853627, abs=1e-9)
    assert z_value(0.99) == pytest.approx(2.575829304, abs=1e-9)
    for bad in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError):
            z_value(bad)


def test_wilson_known_values():
    assert rounded(wilson(8, 10)) == (0.4902, 0.9433)
    assert wilson(0, 10)[0] == 0.0 and round(wilson(0, 10)[1], 4) == 0.2775
    assert wilson(10, 10)[1] == 1.0 and round(wilson(10, 10)[0], 4) == 0.7225
    assert wilson(0, 0) == (0.0, 1.0)


def test_wilson_matches_scipy():
    for successes, n in [(0, 1), (1, 1), (3, 7), (8, 10), (50, 100), (999, 1000)]:
        for level in (0.8, 0.95, 0.99):
            ci = binomtest(successes, n).proportion_ci(confidence_level=level, method="wilson")
            assert wilson(successes, n, level) == pytest.approx((ci.low, ci.high), abs=1e-12)


@pytest.mark.parametrize("args", [(11, 10), (-1, 10), (1, -1), (1.5, 10), (1, 10, 1.0), (1, 10, 0.0)])
def test_wilson_rejects_bad_input(args):
    with pytest.raises(ValueError):
        wilson(*args)


# --------------------------------------------------------------------------- MOVER and the mean of rates


def direct_mover(estimates, intervals, weights):
    """The MOVER limits written out term by term, as in Zou & Donner (2008)."""
    est = sum(w * t for w, t in zip(weights, estimates))
    below = sum((w * (t - lo)) ** 2 if w > 0 else (w * (hi - t)) ** 2 for w, t, (lo, hi) in zip(weights, estimates, intervals))
    above = sum((w * (hi - t)) ** 2 if w > 0 else (w * (t - lo)) ** 2 for w, t, (lo, hi) in zip(weights, estimates, intervals))
    return est - math.sqrt(below), est + math.sqrt(above)


def test_mover_difference_of_independent_proportions_is_newcombe_method_10():
    # Weights (1, -1) over two Wilson intervals are Newcombe's (1998, Stat Med 17:873-890) square-and-add interval
    # for p1 - p2 of independent samples; his worked examples: 56/70 - 48/80 and 9/10 - 3/10.
    for (x1, n1, x2, n2), expected in [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090))]:
        interval = mover([x1 / n1, x2 / n2], [wilson(x1, n1), wilson(x2, n2)], [1.0, -1.0])
        assert rounded(interval) == expected
        flipped = mover([x2 / n2, x1 / n1], [wilson(x2, n2), wilson(x1, n1)], [1.0, -1.0])
        assert flipped == pytest.approx((-interval[1], -interval[0]), abs=1e-12)


def test_mover_weights():
    estimates, intervals = [0.3, 0.8, 0.55], [(0.1, 0.6), (0.5, 0.95), (0.2, 0.7)]
    assert mover(estimates, intervals) == pytest.approx(direct_mover(estimates, intervals, [1 / 3] * 3), abs=1e-12)
    weights = [2.0, -0.5, 0.0]
    assert mover(estimates, intervals, weights) == pytest.approx(direct_mover(estimates, intervals, weights), abs=1e-12)
    assert mover([0.3], [(0.1, 0.6)], [2.0]) == pytest.approx((0.2, 1.2))  # one term: the interval, scaled
    assert mover([0.3], [(0.1, 0.6)], [-1.0]) == pytest.approx((-0.6, -0.1))  # negative weight: ends swap
    with pytest.raises(ValueError):
        mover([], [])
    with pytest.raises(ValueError):
        mover([0.3], [(0.1, 0.6), (0.1, 0.6)])
    with pytest.raises(ValueError):
        mover([0.3], [(0.1, 0.6)], [1.0, 1.0])
    with pytest.raises(ValueError):
        mover([0.9], [(0.1, 0.6)])  # the estimate must lie in its interval


def test_mean_rate_interval():
    assert mean_rate_interval([8], [10]) == wilson(8, 10)
    equal = mean_rate_interval([8, 8, 8], [10, 10, 10])
    low, high = wilson(8, 10)
    assert 0.0 <= equal[0] < 0.8 < equal[1] <= 1.0
    assert equal[0] > low and equal[1] < high  # narrower than any single task's interval
    # Equal tasks: every term is the same, so the half-widths shrink by exactly sqrt(3).
    assert equal == pytest.approx((0.8 - (0.8 - low) / math.sqrt(3), 0.8 + (high - 0.8) / math.sqrt(3)), abs=1e-12)
    successes, trials = [3, 7, 10, 0], [10, 12, 10, 5]
    intervals = [wilson(s, n) for s, n in zip(successes, trials)]
    expected = direct_mover([s / n for s, n in zip(successes, trials)], intervals, [0.25] * 4)
    assert mean_rate_interval(successes, trials) == pytest.approx(expected, abs=1e-12)
    assert 0.0 <= mean_rate_interval([0, 0], [5, 5])[0] and mean_rate_interval([5, 5], [5, 5])[1] <= 1.0


@pytest.mark.parametrize("successes,trials", [([1, 0], [10, 0]), ([], []), ([1], [2, 3]), ([3], [2])])
def test_mean_rate_interval_rejects_bad_input(successes, trials):
    with pytest.raises(ValueError):
        mean_rate_interval(successes, trials)


# --------------------------------------------------------------------------- paired tables


def test_paired_table():
    a = [True, True, False, False, True, False]
    b = [True, False, True, False, True, True]
    table = PairedTable.from_outcomes(a, b)
    assert table == PairedTable(both=2, only_a=1, only_b=2, neither=1)
    assert table.n == 6 and table.difference == pytest.approx(1 / 6)
    assert PairedTable(0, 0, 0, 0).difference == 0.0
    assert table + PairedTable(1, 2, 3, 4) == PairedTable(3, 3, 5, 5)
    with pytest.raises(ValueError):
        PairedTable.from_outcomes([True], [True, False])
    with pytest.raises(ValueError):
        PairedTable(-1, 0, 0, 0)


# Newcombe (1998), Stat Med 17:2635-2650, Table II, method 10: (both, only_a, only_b, neither) -> interval for
# p_A - p_B, as published (and as reproduced by e.g. the R package propint's tests).
NEWCOMBE_TABLE_II = [
    ((36, 12, 2, 0), (0.0569, 0.3404)),
    ((18, 12, 2, 18), (0.0562, 0.3290)),
    ((53, 0, 0, 1), (-0.0729, 0.0729)),
    ((0, 30, 0, 0), (0.8395, 1.0)),
]


@pytest.mark.parametrize("counts,published", NEWCOMBE_TABLE_II)
def test_newcombe_method_10_published_examples(counts, published):
    table = PairedTable(*counts)
    low, high = paired_difference_interval(table)  # for p_B - p_A: the published interval negated and swapped
    assert (round(-high, 4), round(-low, 4)) == published
    assert low <= table.difference <= high


def test_paired_difference_interval_properties():
    table = PairedTable(20, 3, 9, 8)
    low, high = paired_difference_interval(table)
    swapped = paired_difference_interval(PairedTable(20, 9, 3, 8))
    assert swapped == pytest.approx((-high, -low), abs=1e-12)  # B - A becomes A - B
    wide = paired_difference_interval(table, level=0.99)
    assert wide[0] < low and wide[1] > high
    assert paired_difference_interval(PairedTable(0, 0, 0, 0)) == (-1.0, 1.0)
    assert paired_difference_interval(PairedTable(0, 0, 30, 0))[1] == 1.0  # clipped to [-1, 1]
    no_discord = paired_difference_interval(PairedTable(7, 0, 0, 3))
    assert no_discord[0] < 0.0 < no_discord[1]  # not zero-width, unlike the Wald interval


def test_mean_difference_interval():
    tables = [PairedTable(20, 3, 9, 8), PairedTable(5, 0, 4, 1), PairedTable(0, 2, 1, 7)]
    assert mean_difference_interval(tables[:1]) == paired_difference_interval(tables[0])
    intervals = [paired_difference_interval(t) for t in tables]
    expected = direct_mover([t.difference for t in tables], intervals, [1 / 3] * 3)
    assert mean_difference_interval(tables) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError):
        mean_difference_interval([])
    with pytest.raises(ValueError):
        mean_difference_interval([PairedTable(1, 0, 0, 0), PairedTable(0, 0, 0, 0)])


def test_mcnemar_exact():
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024, rel=1e-15)
    assert round(mcnemar_exact(9, 1), 5) == 0.02148
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    # The two ways of summing the binomial tail agree where both are cheap.
    for m, k in [(11, 5), (300, 120), (3_001, 1_400), (8_000, 3_700)]:
        assert _half_tail_series(m, k) == pytest.approx(_half_tail_exact(m, k), rel=1e-10)
    for b, c in [(0, 1), (0, 6), (3, 4), (12, 2), (30, 55), (2000, 2150)]:
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(min(b, c), b + c, 0.5).pvalue, rel=1e-9)
    # Past 10_000 discordant pairs the float series takes over (2**m itself overflows a float beyond 1023).
    for b, c in [(4_990, 5_010), (20_000, 20_700), (100_000, 101_500), (400_000, 390_000)]:
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(min(b, c), b + c, 0.5).pvalue, rel=1e-8)
    assert mcnemar_exact(100_000, 102_000) < 1e-5 and mcnemar_exact(10**6, 10**6 + 1) == pytest.approx(1.0, abs=1e-8)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


# --------------------------------------------------------------------------- anytime-valid confidence sequence


def log_m(p: float, successes: int, n: int, prior=(0.5, 0.5)) -> float:
    a, b = prior
    return (
        special.betaln(a + successes, b + n - successes)
        - special.betaln(a, b)
        - successes * math.log(p)
        - (n - successes) * math.log1p(-p)
    )


def test_confidence_sequence_ends_solve_the_martingale_equation():
    for successes, n in [(3, 10), (30, 100), (1, 50), (49, 50)]:
        low, high = confidence_sequence(successes, n)
        for end in (low, high):
            assert log_m(end, successes, n) == pytest.approx(math.log(20), abs=1e-6)
        inward = 1e-9
        assert log_m(low + inward, successes, n) < math.log(20) <= log_m(low - inward, successes, n)
        assert log_m(high - inward, successes, n) < math.log(20) <= log_m(high + inward, successes, n)


def test_confidence_sequence_against_wilson():
    assert confidence_sequence(0, 0) == (0.0, 1.0)
    assert confidence_sequence(0, 20)[0] == 0.0 and confidence_sequence(20, 20)[1] == 1.0
    for successes, n in [(0, 10), (3, 10), (8, 10), (10, 10), (30, 100), (150, 200)]:
        low, high = confidence_sequence(successes, n)
        w_low, w_high = wilson(successes, n)
        assert low <= (w_low + w_high) / 2 <= high
        assert low <= w_low and w_high <= high and high - low > w_high - w_low
    widths = [confidence_sequence(3 * k, 10 * k) for k in (1, 4, 16, 64)]
    assert all(b[1] - b[0] < a[1] - a[0] for a, b in zip(widths, widths[1:]))
    assert widths[-1][0] < 0.3 < widths[-1][1]
    for args in [(11, 10), (1, 10, 0.0), (1, 10, 1.0), (1, 10, 0.05, (0.0, 1.0))]:
        with pytest.raises(ValueError):
            confidence_sequence(*args)


def test_confidence_sequence_survives_optional_stopping_wilson_does_not():
    """Re-check after every episode: the CS misses 0.3 ever in <= alpha of runs, Wilson in far more."""
    rng = random.Random(20240611)
    cs = functools.lru_cache(maxsize=None)(confidence_sequence)
    p, runs, steps = 0.3, 300, 200
    cs_missed = wilson_missed = 0
    for _ in range(runs):
        successes = 0
        cs_miss = wilson_miss = False
        for n in range(1, steps + 1):
            successes += rng.random() < p
            low, high = cs(successes, n)
            cs_miss = cs_miss or not low < p < high
            w_low, w_high = wilson(successes, n)
            wilson_miss = wilson_miss or not w_low < p < w_high
        cs_missed += cs_miss
        wilson_missed += wilson_miss
    assert cs_missed / runs <= 0.05 + 0.02
    assert wilson_missed / runs >= 0.2 and wilson_missed > 3 * cs_missed


# --------------------------------------------------------------------------- e-values and the sequential rule


def test_paired_e_value_values():
    assert paired_e_value(0, 0) == 1.0
    assert paired_e_value(0, 1) == pytest.approx(1.0)  # B(1.5, .5) / B(.5, .5) * 2 = (pi/2) / pi * 2
    assert paired_e_value(0, 2) == pytest.approx(1.5)  # B(2.5, .5) / B(.5, .5) * 4 = (3 pi/8) / pi * 4
    assert paired_e_value(1, 1) == pytest.approx(0.5)  # balanced discordance is evidence for H0
    ladder = [paired_e_value(0, k) for k in range(12)]
    assert all(b > a for a, b in zip(ladder[1:], ladder[2:]))
    assert paired_e_value(3, 10) == pytest.approx(paired_e_value(10, 3))
    for a, b, prior in [(3, 10, 0.5), (7, 2, 1.0), (40, 60, 2.0)]:
        expected = math.exp(special.betaln(prior + b, prior + a) - special.betaln(prior, prior) + (a + b) * math.log(2))
        assert paired_e_value(a, b, prior) == pytest.approx(expected, rel=1e-10)
    assert paired_e_value(0, 5000) == math.inf
    with pytest.raises(ValueError):
        paired_e_value(1, 1, prior=0.0)


def test_paired_e_value_type_one_error_under_optional_stopping():
    """Under H0 (fair coin per discordant pair) stopping the first time E >= 1/alpha rejects in <= alpha of runs."""
    rng = random.Random(7)
    alpha, runs, steps = 0.05, 400, 300
    rejected = naive_rejected = 0
    for _ in range(runs):
        a = b = 0
        e_crossed = naive = False
        for _ in range(steps):
            if rng.random() < 0.5:
                b += 1
            else:
                a += 1
            e_crossed = e_crossed or paired_e_value(a, b) >= 1 / alpha
            # For contrast: a fixed-n two-sided z test of the sign, re-checked after every pair.
            naive = naive or abs(b - a) / math.sqrt(a + b) >= Z95
        rejected += e_crossed
        naive_rejected += naive
    assert rejected / runs <= alpha + 0.02
    assert naive_rejected / runs >= 0.2


def brute_force_best(a: int, b: int, remaining: int) -> float:
    """Largest E over every table reachable with up to `remaining` more discordant pairs, split any way."""
    return max(paired_e_value(a + i, b + j) for i in range(remaining + 1) for j in range(remaining + 1 - i))


def test_futility_extremes_dominate_every_split():
    for a in range(7):
        for b in range(7):
            for remaining in range(9):
                extremes = max(paired_e_value(a, b), paired_e_value(a, b + remaining), paired_e_value(a + remaining, b))
                assert brute_force_best(a, b, remaining) == pytest.approx(extremes, rel=1e-12)
                could_reject = brute_force_best(a, b, remaining) >= 20
                decision = sequential_paired_decision(a, b, remaining)
                assert (decision == "no difference") == (not could_reject)


def test_sequential_paired_decision():
    # E(0, k) = B(k + 1/2, 1/2) / pi * 2^k crosses 20 at k = 7 (14.4 at k = 6, 26.8 at k = 7).
    assert paired_e_value(0, 6) < 20 <= paired_e_value(0, 7)
    assert sequential_paired_decision(0, 7, remaining_pairs=100) == "B better"
    assert sequential_paired_decision(7, 0, remaining_pairs=100) == "A better"
    assert sequential_paired_decision(2, 15, remaining_pairs=0) == "B better"
    assert sequential_paired_decision(0, 6, remaining_pairs=100) is None
    assert sequential_paired_decision(0, 6, remaining_pairs=1) is None  # one more B win would do it
    assert sequential_paired_decision(0, 6, remaining_pairs=0) == "no difference"
    assert sequential_paired_decision(6, 0, remaining_pairs=1) is None  # either direction counts
    assert sequential_paired_decision(10, 10, remaining_pairs=3) == "no difference"
    assert sequential_paired_decision(10, 10, remaining_pairs=40) is None
    assert sequential_paired_decision(0, 0, remaining_pairs=0) == "no difference"
    assert sequential_paired_decision(0, 7, remaining_pairs=0, alpha=0.001) == "no difference"
    with pytest.raises(ValueError):
        sequential_paired_decision(0, 0, remaining_pairs=-1)
    with pytest.raises(ValueError):
        sequential_paired_decision(0, 0, remaining_pairs=1, alpha=1.0)


def test_percentiles_are_numpys_without_numpy():
    values = list(np.random.default_rng(0).exponential(size=101))
    for q in (1, 50, 95, 99):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)
    assert (percentile([], 95), percentile([0.25], 95)) == (0.0, 0.25)
