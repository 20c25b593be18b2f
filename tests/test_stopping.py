"""Stopping when the answer is known (EVALUATION.target_ci_halfwidth, EVALUATION.compare_to), on real
runs: only episodes not yet started are skipped, every one that ran is kept exactly once, a killed run
resumes to a decision made from its records, and the statistics stay anytime-valid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("metaworld")

from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig  # noqa: E402
from wam_gym.eval.manager import EvalManager  # noqa: E402
from wam_gym.eval.results import EpisodeRecord, ResultStore  # noqa: E402
from wam_gym.utils.stats import confidence_sequence  # noqa: E402

REACH, PUSH = "wam_gym/MetaWorld-reach-v3", "wam_gym/MetaWorld-push-v3"
TRIALS, STEPS, SEED = 12, 10, 5
TARGET = 0.3  # a task of only failures is that tight after 5 episodes (its confidence sequence: [0, 0.59])


def config(out, tasks=(REACH, PUSH), trials=TRIALS, **evaluation) -> EvalConfig:
    return EvalConfig(
        env_kwargs={"image_size": 32, "cameras": ["corner"]},
        EVALUATION=EvaluationConfig(agent="random", num_trials=trials, tensorboard=False, output_dir=str(out),
                                    **{"seed": SEED, "max_episode_steps": STEPS, **evaluation}),
        MULTIRUN=MultirunConfig(task_sets=list(tasks), env_num_per_worker=2),
    )


def records(out) -> dict[tuple[str, int], dict]:
    """Every record file, parsed; fails on a duplicate episode."""
    found = {}
    for path in sorted(Path(out, "episodes").glob("*/*.json")):
        data = json.loads(path.read_text())
        assert (data["task"], data["trial"]) not in found, f"{path}: recorded twice"
        found[data["task"], data["trial"]] = data
    return found


def assert_rule_held(out, summary, target=TARGET, actors=2) -> None:
    """Each task ran every trial or stopped once its confidence sequence was tight; episodes started after
    the stop are at most the ones in flight; the summary counts exactly the records."""
    recs = records(out)
    stopping = summary["stopping"]
    assert summary["complete"] and summary["error"] is None
    for task in (REACH, PUSH):
        ran = sorted(trial for t, trial in recs if t == task)
        if len(ran) == TRIALS:
            continue
        stop = stopping["stopped_tasks"][task]
        low, high = confidence_sequence(sum(recs[task, k]["success"] for k in ran), len(ran))
        assert (high - low) / 2 <= target  # still tight with every episode counted
        assert stop["episodes"] <= len(ran) <= stop["episodes"] + actors
        assert summary["tasks"][task]["episodes"] == len(ran)
    assert summary["overall"]["episodes"] == len(recs)


def test_target_halfwidth_stops_each_task_when_its_interval_is_tight(tmp_path):
    out = tmp_path / "out"
    summary = EvalManager(config(out, target_ci_halfwidth=TARGET)).run()
    assert_rule_held(out, summary)
    assert summary["overall"]["episodes"] < 2 * TRIALS  # the random agent fails: both tasks stop early
    assert set(summary["stopping"]["stopped_tasks"]) == {REACH, PUSH}
    assert "confidence sequence" in summary["stopping"]["methods"]["task_interval"]
    assert json.loads((out / "results.json").read_text())["stopping"] == summary["stopping"]
    # Every episode that ran is the same episode an unstopped run has (trial k: seed SEED + k).
    assert all(r["seed"] == SEED + r["trial"] for r in records(out).values())
    # A rerun decides the same from the records on disk and starts nothing.
    again = EvalManager(config(out, target_ci_halfwidth=TARGET))
    again.on_started = lambda *_: pytest.fail("decided already: nothing should start")
    assert again.run()["overall"]["episodes"] == summary["overall"]["episodes"]


KILL_AT_RECORD = r"""
import os, runpy, signal, sys
die_at, count, real_replace = int(os.environ["DIE_AT_RECORD"]), [0], os.replace
def replace(src, dst):
    real_replace(src, dst)
    count[0] += os.fspath(dst).endswith(".json") and f"{os.sep}episodes{os.sep}" in os.fspath(dst)
    if count[0] == die_at:
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
sys.argv = ["wam_gym.eval", *sys.argv[1:]]
runpy.run_module("wam_gym.eval", run_name="__main__", alter_sys=True)
"""


def test_killed_early_stopping_run_resumes_without_losing_or_repeating_an_episode(tmp_path):
    out = tmp_path / "out"
    args = ["EVALUATION.agent=random", "+env_kwargs.image_size=32", "+env_kwargs.cameras=[corner]",
            f"MULTIRUN.task_sets=[{REACH},{PUSH}]", f"EVALUATION.num_trials={TRIALS}", f"EVALUATION.seed={SEED}",
            f"EVALUATION.max_episode_steps={STEPS}", "EVALUATION.tensorboard=false", f"EVALUATION.output_dir={out}",
            f"EVALUATION.target_ci_halfwidth={TARGET}", "MULTIRUN.env_num_per_worker=2"]
    killed = subprocess.run([sys.executable, "-c", KILL_AT_RECORD, *args], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "DIE_AT_RECORD": "4", "OMP_NUM_THREADS": "1"}, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = {p: p.read_bytes() for p in Path(out, "episodes").glob("*/*.json")}
    assert len(before) == 4 and not (out / "results.json").exists()

    summary = EvalManager(config(out, target_ci_halfwidth=TARGET)).run()
    assert {p: p.read_bytes() for p in before} == before  # kept as they were, not rerun
    assert_rule_held(out, summary)
    assert set(summary["stopping"]["stopped_tasks"]) == {REACH, PUSH}


def test_compare_to_stops_once_the_paired_test_decides(tmp_path):
    reference = tmp_path / "reference"
    EvalManager(config(reference, tasks=(REACH,), trials=1)).run()  # its protocol.json, as a real run writes it
    for trial in range(TRIALS):  # a reference that solved every episode: the random agent is clearly worse
        ResultStore(reference).write(EpisodeRecord(REACH, trial, SEED + trial, success=True, steps=3, reward=1.0))

    out = tmp_path / "out"
    summary = EvalManager(config(out, tasks=(REACH,), compare_to=str(reference))).run()
    comparison = summary["stopping"]["comparison"]
    assert comparison["decision"] == "EVALUATION.compare_to is better"
    assert comparison["e_value"] >= 20  # 1 / (1 - stop_level)
    ran = records(out)
    assert comparison["pairs"] <= len(ran) < TRIALS and summary["complete"]
    theirs = records(reference)  # trial 0 is the real run's (a record is never replaced), the rest all succeeded
    assert len(theirs) == TRIALS and sum(r["success"] for r in theirs.values()) >= TRIALS - 1
    # The decision was taken on the episodes recorded then (the state is kept from that moment); they agree
    # with the records: every discordant pair so far has the reference succeeding.
    assert comparison["only_this_run_succeeded"] == 0 and comparison["only_reference_succeeded"] >= 7
    assert sum(theirs[k]["success"] and not r["success"] for k, r in ran.items()) >= comparison["only_reference_succeeded"]


def test_compare_to_refuses_a_run_under_another_protocol(tmp_path):
    reference = tmp_path / "reference"
    EvalManager(config(reference, tasks=(REACH,), trials=1)).run()
    with pytest.raises(ValueError, match=r"EVALUATION.max_episode_steps is in EVALUATION.compare_to=\S+ 10, in this "
                                         r"run 20 \(and 1 more: tasks\[wam_gym/MetaWorld-reach-v3\]\.max_episode_steps\)"):
        EvalManager(config(tmp_path / "out", tasks=(REACH,), compare_to=str(reference), max_episode_steps=20))
    with pytest.raises(ValueError, match="this run's own output_dir"):
        EvalManager(config(reference, tasks=(REACH,), compare_to=str(reference)))


def test_compare_to_that_cannot_decide_within_the_plan_starts_nothing(tmp_path):
    """Three pairs can never make the test reject at 95%: decided ("no difference") before any episode."""
    reference = tmp_path / "reference"
    EvalManager(config(reference, tasks=(REACH,), trials=3)).run()
    manager = EvalManager(config(tmp_path / "out", tasks=(REACH,), trials=3, compare_to=str(reference)))
    manager.on_started = lambda *_: pytest.fail("decided before anything ran")
    summary = manager.run()
    assert summary["stopping"]["comparison"]["decision"] == "no difference found within the planned pairs"
    assert summary["overall"]["episodes"] == 0 and summary["complete"]


@pytest.mark.parametrize(("changes", "match"), [
    ({"target_ci_halfwidth": 0.0}, r"target_ci_halfwidth must be in \(0, 0.5\]"),
    ({"target_ci_halfwidth": 0.7}, r"target_ci_halfwidth must be in \(0, 0.5\]"),
    ({"stop_level": 1.0}, r"stop_level must be in \[0.5, 1\)"),
])
def test_bad_stopping_knobs_name_the_fix(changes, match):
    with pytest.raises(ValueError, match=match):
        EvaluationConfig(agent="random", **changes)
