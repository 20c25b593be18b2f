"""Soak: the broker under 12 concurrent actor processes for 20 s, actors replaced every 5 s.

The machinery (stand-in model, actors, sampling) is bench/soak.py; ``python bench/soak.py`` runs
the same for longer and prints requests/s.
"""

import pytest

from bench.soak import MB, problems, run_soak, summary_lines

SECONDS, ACTORS, LIFETIME = 20.0, 12, 5.0


@pytest.fixture(scope="module")
def report():
    report = run_soak(SECONDS, actors=ACTORS, lifetime=LIFETIME)
    print("\n".join(summary_lines(report)))  # the series' first/last/max, shown with -s
    return report


@pytest.mark.slow
def test_every_request_is_answered_correctly_once(report):
    assert report.wrong == 0
    assert report.requests > 0 and report.answered == report.requests  # none lost, none answered twice
    assert report.actors_started > ACTORS  # replacements came in (each a new client and reply queue)
    assert report.actors_reported == report.actors_started


@pytest.mark.slow
def test_memory_and_fds_do_not_grow_after_warm_up(report):
    # Samples come about once a second; how many depends on the machine's load, so ask only for two
    # after warm-up, what a growth needs (a start and a later sample).
    assert len(report.warm()) >= 2
    growth, bound = report.rss_growth()
    assert growth < bound, f"the broker's tree grew {growth / MB:.1f} MB (bound {bound / MB:.0f} MB)"
    fds_main, fds_workers = report.fd_growth()
    # The main process holds ~3 FDs per live actor (reply queue, process sentinel); a leak per replaced
    # actor would add that for each of the ~40 replacements.
    assert fds_main <= 8 and fds_workers == 0
    assert problems(report) == []


@pytest.mark.slow
def test_nothing_is_left_after_close(report):
    assert report.leftover_processes == []
    assert report.leaked_fds == [], report.leaked_fds
    assert report.inet == []  # and no network socket in the tree while it ran
