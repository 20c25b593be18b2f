"""python -m wam_gym.compare: two runs paired episode by episode, on synthetic runs with a known
answer and on two real short runs; runs under different protocols are refused, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wam_gym.compare import compare, format_report
from wam_gym.eval.results import EpisodeRecord, ResultStore
from wam_gym.eval.run_protocol import PROTOCOL_FILE

A_TASK, B_TASK = "wam_gym/MetaWorld-reach-v3", "wam_gym/MetaWorld-push-v3"
PROTOCOL = {
    "protocol": {"EVALUATION.seed": 0, "EVALUATION.max_episode_steps": None, "env_kwargs": {},
                 "tasks": {t: {"env_id": t, "kwargs": {}, "max_episode_steps": 150} for t in (A_TASK, B_TASK)}},
    "observed": {A_TASK: {"action_space": {"shape": [4]}}},
    "agent": {"EVALUATION.agent": "wam", "ckpt": {"path": "/ckpt/a", "fingerprint": "aaaa"}},
}


def make_run(path, outcomes: dict[str, list[bool]], protocol=None, fingerprint="aaaa"):
    record = json.loads(json.dumps(protocol or PROTOCOL))
    record["agent"]["ckpt"]["fingerprint"] = fingerprint
    path.mkdir(parents=True)
    (path / PROTOCOL_FILE).write_text(json.dumps(record))
    store = ResultStore(path)
    for task, successes in outcomes.items():
        for trial, success in enumerate(successes):
            store.write(EpisodeRecord(task, trial, trial, success, steps=10, reward=0.0))
    return path


def test_known_answer(tmp_path):
    # Task A: B solves trials 2-8 that A fails, A solves 0-1 as B does; task B: both solve the same 5 of 10.
    a = make_run(tmp_path / "a", {A_TASK: [True, True] + [False] * 8, B_TASK: [True] * 5 + [False] * 5})
    b = make_run(tmp_path / "b", {A_TASK: [True] * 9 + [False], B_TASK: [True] * 5 + [False] * 5}, fingerprint="bbbb")
    result = compare(a, b)
    first = result["tasks"][A_TASK]
    assert (first["pairs"], first["a_success_rate"], first["b_success_rate"]) == (10, 0.2, 0.9)
    assert first["difference"] == pytest.approx(0.7) and first["only_a"] == [] and first["only_b"] == [2, 3, 4, 5, 6, 7, 8]
    assert first["mcnemar_p"] == pytest.approx(2 / 2**7)  # 7 discordant pairs, all one way: 2 * 0.5^7
    assert first["ci"][0] > 0 and first["ci"][1] <= 1
    second = result["tasks"][B_TASK]
    assert second["difference"] == 0 and second["mcnemar_p"] == 1.0 and second["ci"][0] < 0 < second["ci"][1]
    overall = result["overall"]
    assert overall["difference"] == pytest.approx(0.35) and overall["pairs"] == 20
    assert overall["mcnemar_p"] == pytest.approx(2 / 2**7) and (overall["only_a"], overall["only_b"]) == (0, 7)
    assert overall["ci"][0] > 0  # the mean over tasks: MOVER over the two tasks' intervals
    assert result["verdict"].startswith("B is better than A (+35.0 points")
    assert result["agent_differences"] == [{"field": "ckpt", "recorded": {"path": "/ckpt/a", "fingerprint": "aaaa"},
                                            "now": {"path": "/ckpt/a", "fingerprint": "bbbb"}}]
    report = format_report(result)
    assert "2,3,4,5,6,7,8" in report and "verdict: B is better than A" in report
    assert "agents differ: ckpt A /ckpt/a (content aaaa), B /ckpt/a (content bbbb)" in report


def test_no_difference_and_unpaired_episodes(tmp_path):
    a = make_run(tmp_path / "a", {A_TASK: [True, False, True, False, True]})
    b = make_run(tmp_path / "b", {A_TASK: [False, True, True, False]})  # one trial fewer: 4 pairs
    result = compare(a, b)
    assert result["unpaired"] == {"only_in_a": 1, "only_in_b": 0}
    assert result["overall"]["pairs"] == 4 and result["overall"]["mcnemar_p"] == 1.0
    assert result["verdict"].startswith("no significant difference between A and B at the 95% level (+0.0 points")
    assert "unpaired episodes left out: 1 only in A, 0 only in B" in format_report(result)


@pytest.mark.parametrize(("change", "field"), [
    (lambda p: p["protocol"]["tasks"][A_TASK].update(max_episode_steps=300), r"tasks\[wam_gym/MetaWorld-reach-v3\]"
                                                                             r"\.max_episode_steps is in A"),
    (lambda p: p["protocol"].update({"EVALUATION.seed": 1}), "EVALUATION.seed is in A"),
    (lambda p: p["observed"][A_TASK].update(action_space={"shape": [7]}), r"observed\[wam_gym/MetaWorld-reach-v3\]"),
])
def test_runs_under_another_protocol_are_refused(tmp_path, change, field):
    other = json.loads(json.dumps(PROTOCOL))
    change(other)
    a = make_run(tmp_path / "a", {A_TASK: [True]})
    b = make_run(tmp_path / "b", {A_TASK: [True]}, protocol=other)
    with pytest.raises(ValueError, match=f"ran under different protocols.*{field}"):
        compare(a, b)


def test_a_task_only_one_run_has_is_no_mismatch(tmp_path):
    wider = json.loads(json.dumps(PROTOCOL))
    wider["protocol"]["tasks"]["wam_gym/MetaWorld-door-open-v3"] = {"env_id": "x", "kwargs": {}, "max_episode_steps": 9}
    a = make_run(tmp_path / "a", {A_TASK: [True]})
    b = make_run(tmp_path / "b", {A_TASK: [True], "wam_gym/MetaWorld-door-open-v3": [True]}, protocol=wider)
    assert compare(a, b)["unpaired"] == {"only_in_a": 0, "only_in_b": 1}


def test_not_a_run_is_one_line(tmp_path, capsys):
    from wam_gym.compare import main

    (tmp_path / "empty").mkdir()
    a = make_run(tmp_path / "a", {A_TASK: [True]})
    assert main([str(a), str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty'} has no protocol.json" in capsys.readouterr().err


def test_two_real_runs_and_the_cli(tmp_path):
    """The expert and the random agent on the same episodes, then the CLI's --json; a run with another
    episode limit is refused."""
    pytest.importorskip("metaworld")
    from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
    from wam_gym.eval.manager import EvalManager

    def run(agent, out, steps=60):
        return EvalManager(EvalConfig(
            env_kwargs={"image_size": 32, "cameras": ["corner"]},
            EVALUATION=EvaluationConfig(agent=agent, num_trials=3, seed=3, max_episode_steps=steps, tensorboard=False,
                                        output_dir=str(out)),
            MULTIRUN=MultirunConfig(task_sets=[A_TASK]))).run()

    expert, random = run("expert", tmp_path / "expert"), run("random", tmp_path / "random")
    proc = subprocess.run([sys.executable, "-m", "wam_gym.compare", str(tmp_path / "random"), str(tmp_path / "expert"),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    task = result["tasks"][A_TASK]
    assert task["pairs"] == 3
    assert (task["a_success_rate"], task["b_success_rate"]) == (random["tasks"][A_TASK]["success_rate"],
                                                               expert["tasks"][A_TASK]["success_rate"])
    assert result["agent_differences"][0]["field"] == "EVALUATION.agent"
    text = subprocess.run([sys.executable, "-m", "wam_gym.compare", str(tmp_path / "random"), str(tmp_path / "expert")],
                          capture_output=True, text=True, timeout=120).stdout
    assert "verdict:" in text and 'agents differ: EVALUATION.agent A "random", B "expert"' in text

    run("random", tmp_path / "longer", steps=80)
    refused = subprocess.run([sys.executable, "-m", "wam_gym.compare", str(tmp_path / "random"), str(tmp_path / "longer")],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "EVALUATION.max_episode_steps is in A" in refused.stderr and "60, in B" in refused.stderr


def test_a_run_that_mixes_settings_or_holds_foreign_records_says_so(tmp_path):
    """A resume allowed to ignore a difference leaves a run of two settings (protocol.json records it for good);
    a record whose seed is not its trial's is another run's: the comparison says both, in its report and JSON."""
    a = make_run(tmp_path / "a", {A_TASK: [True, False, True]})
    mixed = {**PROTOCOL, "resumed_despite": [{"field": "ckpt", "recorded": {"fingerprint": "aaaa"},
                                              "now": {"fingerprint": "cccc"}}]}
    b = make_run(tmp_path / "b", {A_TASK: [True, True, True]}, protocol=mixed, fingerprint="bbbb")
    foreign = next((a / "episodes").glob("*/00002.json"))
    foreign.write_text(json.dumps({**json.loads(foreign.read_text()), "seed": 99}))
    result = compare(a, b)
    assert result["mixed"] == {"B": mixed["resumed_despite"]}
    assert len(result["records_skipped"]["A"]) == 1 and "ran with seed 99, not EVALUATION.seed + trial = 2" in \
        result["records_skipped"]["A"][0]
    assert result["overall"]["pairs"] == 2 and foreign.is_file()  # left out, not moved: it is another run's dir
    report = format_report(result)
    assert "B mixes episodes of other settings (resumed with EVALUATION.allow_resume_mismatch=true: ckpt was" in report
    assert "A: 1 record(s) left out: " in report


def test_records_of_the_wrong_types_are_named_and_never_counted(tmp_path):
    """A run against a copy of itself in which six failures read "success": "false" (a string, truthy): counted,
    they made B 'better'; they are left out, by name, and the two runs agree."""
    import shutil

    a = make_run(tmp_path / "a", {A_TASK: [True] * 4 + [False] * 16})
    b = shutil.copytree(a, tmp_path / "b")
    edited = sorted((b / "episodes").glob("*/*.json"))[4:10]
    for path in edited:
        path.write_text(json.dumps({**json.loads(path.read_text()), "success": "false"}))
    result = compare(a, b)
    assert (result["overall"]["pairs"], result["overall"]["difference"]) == (14, 0)
    assert result["overall"]["mcnemar_p"] == 1.0 and result["verdict"].startswith("no significant difference")
    skipped = result["records_skipped"]["B"]
    assert sorted(skipped) == [f"corrupt episode record {path} (field 'success' is \"false\" (str), not bool)"
                               for path in edited]
    assert all(path.is_file() for path in edited)  # another run's dir: left as it is
    assert "B: 6 record(s) left out: corrupt episode record" in format_report(result)
