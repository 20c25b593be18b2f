"""LingBot-VA under its own LIBERO protocol, end to end in .venv-libero (which has the model stack): a release folder
as published (scripts/tiny_lingbot_va_release.py: random weights, their layout) evaluated by
``python -m wam_gym.eval EVALUATION.agent=wam protocol=lingbot_va_libero`` through the broker.

Two episodes of one task run at once (two actors, one model worker): each episode's state stays on the worker
between its calls while the other's calls interleave. Random weights never succeed, so every episode runs the
protocol's 796 policy steps: a first chunk of 12 actions, then 49 of 16 (the last one cut at the step limit).
About 5 minutes on 2 CPU cores (the simulator renders every frame: the model reads them all).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPATIAL = "wam_gym/LIBERO-Spatial-v0"
TRIALS = 2

pytestmark = [pytest.mark.sim("libero"), pytest.mark.skipif(
    importlib.util.find_spec("libero") is None or importlib.util.find_spec("diffusers") is None,
    reason="needs LIBERO and the model stack (.venv-libero: make suite-venvs)")]


@pytest.mark.slow
def test_a_release_evaluates_under_its_protocol_through_the_broker(tmp_path):
    release = tmp_path / "release"
    made = subprocess.run([sys.executable, "scripts/tiny_lingbot_va_release.py", str(release)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "wam_gym.eval", "benchmark=libero", "EVALUATION.agent=wam", f"ckpt={release}",
               "protocol=lingbot_va_libero", f"MULTIRUN.task_sets=[{SPATIAL}:0]",
               f"EVALUATION.num_trials={TRIALS}", "MULTIRUN.env_num_per_worker=2", f"EVALUATION.output_dir={out}"]
    ran = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-5000:]
    records = [json.loads(p.read_text()) for p in (out / "episodes").glob("*/*.json")]
    assert sorted(r["trial"] for r in records) == list(range(TRIALS))
    for record in records:  # 12 + 49 x 16 = 796: the protocol's steps in 50 calls of 70 denoising steps each
        assert (record["steps"], record["model_calls"], record["denoise_steps"]) == (796, 50, 50 * 70)
        assert (record["init_state_id"], record["seed"]) == (record["trial"], record["trial"])
    protocol = json.loads((out / "protocol.json").read_text())["protocol"]
    assert protocol["protocol"] == "lingbot_va_libero"
    settings = protocol["protocol_settings"]["model_inputs_settings"]
    assert (settings["sampling"]["action_shift"], settings["channels"]) == (0.05, list(range(7)))
    assert protocol["suites"]["libero"]["settle_steps"] == 5
    summary = json.loads((out / "results.json").read_text())
    assert summary["broker"]["requests"] == TRIALS * 50, summary["broker"]


def test_the_settle_action_is_theirs_and_checked():
    """Their client settles with [0] * 7 (a gripper command of 0): the protocol's settle_action. Its gripper closes
    part way during the 5 steps, where wam_gym's default (gripper open) keeps it open."""
    import gymnasium
    import numpy as np

    from envs.libero.env import LiberoEnv

    for bad in ([0.0] * 6, [2.0] * 7, [float("nan")] * 7):
        with pytest.raises(ValueError, match=r"^LIBERO settle_action=.* must be 7 finite numbers in \[-1, 1\]"):
            LiberoEnv(settle_action=bad)
    fingers = {}
    for action in (None, [0.0] * 7):
        env = gymnasium.make(SPATIAL, task_id=0, image_size=32, settle_steps=5, settle_action=action).unwrapped
        env.reset(seed=0)
        fingers[action is None] = float(np.abs(env._sim_obs["robot0_gripper_qpos"]).mean())
        env.close()
    assert fingers[False] < fingers[True] - 0.005, fingers  # theirs part-closed, ours open
