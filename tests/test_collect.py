"""Demo collection into LeRobot v3.0 datasets (python -m training.collect), on Meta-World."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from training.collect import collect, main
from training.data import DatasetError, LeRobotDataset

REPO = Path(__file__).resolve().parents[1]
REACH = "wam_gym/MetaWorld-reach-v3"
needs_metaworld = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="needs wam_gym[metaworld]")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training.collect", *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


def test_cli_without_env_or_output_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--episodes", "1"])
    assert exit_info.value.code == 2
    assert "--env and --output are required" in capsys.readouterr().err


def test_expert_is_meta_world_only(tmp_path):
    with pytest.raises(ValueError, match="--agent random"):
        collect(["wam_gym/Robosuite-Lift-v0"], 1, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_stats_only_on_a_non_dataset_says_so(tmp_path, capsys):
    assert main(["--stats-only", str(tmp_path)]) == 1
    assert "not a LeRobot v3 dataset" in capsys.readouterr().err


@needs_metaworld
def test_cli_collects_expert_demos_that_the_reader_loads(tmp_path):
    out = tmp_path / "reach"
    args = ["--env", REACH, "--episodes", "2", "--agent", "expert", "--output", str(out), "--image-size", "32"]
    proc = _cli(*args, "--max-steps", "150")
    assert proc.returncode == 0, proc.stderr
    assert "100.0% (2/2)" in proc.stdout and str(out) in proc.stdout

    ds = LeRobotDataset(out)
    assert ds.num_episodes == 2 and ds.cameras == ("corner", "gripperPOV")
    assert ds.fps == 80  # Meta-World's render_fps (its control rate)
    assert ds.tasks == ["reach the goal position"]
    info = json.loads((out / "meta/info.json").read_text())
    assert info["total_frames"] == ds.num_frames == int(ds.episode_lengths.sum())
    assert info["features"]["observation.state"]["names"] == ["hand_x", "hand_y", "hand_z", "gripper"]
    assert info["features"]["observation.images.corner"]["info"]["orientation"] == "upright"  # as the env renders
    assert info["wam_gym"] == {"suites": ["metaworld"]}
    for ep in range(2):
        n = int(ds.episode_lengths[ep])
        assert 1 < n < 150  # the expert succeeds, which ends the episode
        assert ds.episode_frames(ep, "corner").shape == (n, 32, 32, 3)
        assert ds.episode_table(ep)["action"].shape == (n, 4)
        assert ds.task_of(ep) == "reach the goal position"
    assert set(ds.stats) >= {"observation.state", "action", "observation.images.corner"}

    # an existing dataset is kept unless --overwrite
    again = _cli("--env", REACH, "--episodes", "1", "--output", str(out), "--image-size", "32")
    assert again.returncode == 1 and "--overwrite" in again.stderr
    assert LeRobotDataset(out).num_episodes == 2

    # stats.json recomputed on request
    stats = json.loads((out / "meta/stats.json").read_text())
    (out / "meta/stats.json").unlink()
    with pytest.raises(DatasetError, match="--stats-only"):
        LeRobotDataset(out)
    proc = _cli("--stats-only", str(out))
    assert proc.returncode == 0, proc.stderr
    again = json.loads((out / "meta/stats.json").read_text())
    np.testing.assert_allclose(again["observation.state"]["mean"], stats["observation.state"]["mean"], rtol=1e-12)
    np.testing.assert_allclose(again["observation.images.corner"]["mean"], stats["observation.images.corner"]["mean"], atol=0.01)


@needs_metaworld
def test_records_the_observation_before_each_action(tmp_path):
    import gymnasium

    import envs
    from agents import MetaWorldExpertAgent

    summary = collect([REACH], 1, tmp_path / "ds", image_size=32, cameras=["corner"], seed=3, max_steps=150, log=None)
    [run] = summary["runs"]
    assert (run["env"], run["agent"], run["success_rate"], run["seeds"]) == (REACH, "expert", 1.0, [3])
    assert summary["episodes"] == 1 and summary["frames"] == run["frames"]

    envs.register_envs()
    env = gymnasium.make(REACH, image_size=32, cameras=("corner",))
    obs, _ = env.reset(seed=3)
    ds = LeRobotDataset(tmp_path / "ds")
    table = ds.episode_table(0)
    expert = MetaWorldExpertAgent()
    for t in range(3):  # same seed, same episode: the recorded step t is (obs_t, action_t)
        np.testing.assert_array_equal(table["state"][t], obs["state"])
        action = expert.act(obs)
        np.testing.assert_array_equal(table["action"][t], action)
        obs, *_ = env.step(action)
    env.close()
    frames = ds.episode_frames(0, "corner")
    assert ds.cameras == ("corner",) and frames.shape[1:] == (32, 32, 3)


@needs_metaworld
def test_only_success_drops_failures(tmp_path):
    # 45 steps is too short for some reach episodes: those are dropped and new seeds tried
    summary = collect([REACH], 2, tmp_path / "ds", image_size=32, cameras=["corner"], only_success=True, max_steps=45, log=None)
    [s] = summary["runs"]
    assert s["successes"] == s["episodes"] <= 2
    assert s["dropped"] >= 1  # seed 0 needs more than 45 steps (a seed fixes the episode exactly)
    assert s["dropped"] == s["attempts"] - s["episodes"] and s["attempts"] <= 6
    assert len(s["seeds"]) == s["episodes"]
    ds = LeRobotDataset(tmp_path / "ds")
    assert ds.num_episodes == s["episodes"]
    assert (ds.episode_lengths <= 45).all()


@needs_metaworld
def test_only_success_with_no_success_writes_nothing(tmp_path, capsys):
    rc = main(["--env", REACH, "--episodes", "1", "--agent", "random", "--output", str(tmp_path / "ds"),
               "--image-size", "32", "--cameras", "corner", "--max-steps", "3", "--only-success"])
    assert rc == 1
    captured = capsys.readouterr()
    assert "no episode was kept" in captured.err and "dropped (--only-success)" in captured.out
    assert not (tmp_path / "ds" / "meta").exists()


@needs_metaworld
def test_action_noise_steps_with_noise_and_records_the_clean_action(tmp_path):
    import gymnasium

    import envs
    from agents import MetaWorldExpertAgent
    from training.collect import NoisyActions

    collect([REACH], 1, tmp_path / "ds", image_size=32, cameras=["corner"], seed=5, max_steps=20, action_noise=0.5, log=None)
    table = LeRobotDataset(tmp_path / "ds").episode_table(0)

    envs.register_envs()
    expert = MetaWorldExpertAgent()
    clean = gymnasium.make(REACH, image_size=32, cameras=("corner",))
    noisy = NoisyActions(gymnasium.make(REACH, image_size=32, cameras=("corner",)), 0.5)
    obs, _ = noisy.reset(seed=5)
    clean_obs, _ = clean.reset(seed=5)
    for t in range(5):  # the same seed draws the same noise: the dataset is this episode, step by step
        np.testing.assert_array_equal(table["state"][t], obs["state"])
        action = expert.act(obs)
        np.testing.assert_array_equal(table["action"][t], action)  # the label is the expert's own action
        obs, *_ = noisy.step(action)
        clean_obs, *_ = clean.step(expert.act(clean_obs))
    assert not np.allclose(obs["state"], clean_obs["state"], atol=1e-4)  # ...but the env stepped off the expert's path
    noisy.close()
    clean.close()


@needs_metaworld
def test_several_behaviours_share_seeds_and_a_noisy_one_records_what_it_executed(tmp_path):
    """A world model's data: each behaviour meets the same scenes, and a noisy behaviour's recorded
    actions are the ones world_model_eval's --policy expert+noise=SIGMA executes at that seed."""
    import gymnasium

    import envs
    from agents import MetaWorldExpertAgent
    from training.collect import NoisyActions

    agents = ["expert", "expert+noise=1", "random"]
    summary = collect([REACH], 2, tmp_path / "ds", agent=agents, image_size=32, cameras=["corner"], seed=7, max_steps=20,
                      log=None)
    assert [(r["agent"], r["seeds"]) for r in summary["runs"]] == [(a, [7, 8]) for a in agents]
    ds = LeRobotDataset(tmp_path / "ds")
    assert ds.num_episodes == summary["episodes"] == 6 and (ds.episode_lengths == 20).all()

    envs.register_envs()
    expert, noisy = MetaWorldExpertAgent(), NoisyActions(gymnasium.make(REACH, image_size=32, cameras=("corner",)), 1.0)
    obs, _ = noisy.reset(seed=8)
    table = ds.episode_table(3)  # expert+noise=1, seed 8
    for t in range(5):
        np.testing.assert_array_equal(table["state"][t], obs["state"])
        executed = noisy.action(expert.act(obs))
        np.testing.assert_array_equal(table["action"][t], executed)  # recorded as executed
        obs, *_ = noisy.env.step(executed)
    assert not np.allclose(table["action"][:5], ds.episode_table(1)["action"][:5])  # the clean expert, seed 8
    noisy.close()


@pytest.mark.parametrize("agent, message", [
    ("expert+noise=x", "+noise= takes a number"),
    ("random+noise=-1", "+noise= must be >= 0"),
    ("expret", "unknown agent 'expret'"),
])
def test_a_bad_agent_is_refused_before_any_simulation(tmp_path, capsys, agent, message):
    rc = main(["--env", REACH, "--episodes", "1", "--output", str(tmp_path / "ds"), "--agent", agent])
    assert rc == 1 and message in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_both_kinds_of_noise_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="choose one"):
        collect([REACH], 1, tmp_path / "ds", agent=["expert+noise=1"], action_noise=0.5)


def test_negative_action_noise_is_refused(tmp_path, capsys):
    rc = main(["--env", REACH, "--episodes", "1", "--output", str(tmp_path / "ds"), "--action-noise", "-0.1"])
    assert rc == 1 and "action_noise must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()
