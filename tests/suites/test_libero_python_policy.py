"""docs/evaluate/your-model-on-libero.md, run in .venv-libero: the page's policy file is tests/example_libero_policy.py
as it stands, what it gets from LIBERO is what the page says, and the page's ``python -m wam_gym.eval
EVALUATION.agent=python`` command evaluates it and writes what the page reads back (one episode, cut short).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "evaluate" / "your-model-on-libero.md"
POLICY_FILE = ROOT / "tests" / "example_libero_policy.py"
STEPS = 24  # three calls of the policy's 8 actions

needs_libero = pytest.mark.skipif(importlib.util.find_spec("libero") is None,
                                  reason="needs the 'libero' package: run in .venv-libero (make test-suites)")


def _block(test: str, lang: str) -> str:
    """The page's ``lang`` block that this file's ``test`` is marked as running."""
    marker = f"<!-- doc-test: tests/suites/{Path(__file__).name}::{test} -->"
    found = re.findall(rf"{re.escape(marker)}\s*```{lang}\n(.*?)\n```", PAGE.read_text(), re.S)
    assert len(found) == 1, f"{PAGE.name} has {len(found)} {lang} blocks marked {marker}"
    return found[0]


def _override(words: list[str], key: str, value: object) -> list[str]:
    """``words`` with Hydra's ``key=value`` set (Hydra refuses a key given twice)."""
    kept = [w for w in words if not w.startswith(f"{key}=")]
    return [*kept, f"{key}={value}"]


def test_the_page_shows_the_example_policy_as_it_is():
    assert _block("test_the_page_shows_the_example_policy_as_it_is", "python") + "\n" == POLICY_FILE.read_text(), \
        f"the page's policy differs from {POLICY_FILE.relative_to(ROOT)}: show that file as it stands"


@needs_libero
def test_what_the_policy_gets_is_what_the_page_says():
    """A LIBERO-Spatial observation has the keys, shapes, units and instruction the policy's comments give, and its
    actions, stepped, lift the open gripper."""
    import gymnasium

    from envs.protocol import stack_rows
    from tests.example_libero_policy import TARGET_Z, make_policy

    policy = make_policy("cpu")
    env = gymnasium.make("wam_gym/LIBERO-Spatial-v0", task_id=0)
    try:
        obs, _ = env.reset(seed=0)
        batch = stack_rows([obs])
        assert sorted(batch["pixels"]) == ["agentview", "robot0_eye_in_hand"]
        for frames in batch["pixels"].values():
            assert (frames.shape, frames.dtype) == ((1, 128, 128, 3), np.uint8)
        state = batch["state"]
        assert (state.shape, state.dtype) == ((1, 8), np.float32)
        assert 0.9 < state[0, 2] < TARGET_Z - 0.05, state  # above the table, below the target
        assert np.allclose(np.abs(state[0, 6:]), 0.04, atol=0.005), state  # fingers open, about +-0.04 m
        assert list(batch["instruction"]) == [
            "pick up the black bowl between the plate and the ramekin and place it on the plate"]

        actions = np.asarray(policy.predict(batch)["actions"])
        assert (actions.shape, actions.dtype) == ((1, policy.action_horizon, 7), np.float32)
        assert env.action_space.contains(actions[0, 0])
        z = [state[0, 2]]
        for _ in range(3):  # three chunks, each asked for with the observation it follows
            for action in actions[0]:
                obs, *_ = env.step(action)
            z.append(obs["state"][2])
            actions = np.asarray(policy.predict(stack_rows([obs]))["actions"])
    finally:
        env.close()
    assert z[0] < z[1] and abs(z[-1] - TARGET_Z) < 0.01, z  # up, and there (1.174, 1.266, 1.248, 1.248 m)
    assert np.allclose(np.abs(obs["state"][6:]), 0.04, atol=0.005), obs["state"]  # still open


@needs_libero
def test_the_pages_command_evaluates_the_example_policy(tmp_path):
    """The page's command, cut to one episode of STEPS steps, from the repository root; then the page's snippet
    reads the run back."""
    words = shlex.split(_block("test_the_pages_command_evaluates_the_example_policy", "bash").replace("\\\n", " "))
    assert words[:3] == [".venv-libero/bin/python", "-m", "wam_gym.eval"], words
    out = tmp_path / "evaluate_results" / "libero" / "20260101-000000"
    command = [sys.executable, *words[1:]]
    for key, value in (("EVALUATION.num_trials", 1), ("EVALUATION.max_episode_steps", STEPS),
                       ("EVALUATION.output_dir", out)):
        command = _override(command, key, value)
    ran = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-5000:]

    task = "wam_gym/LIBERO-Spatial-v0:0"
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["error"] is None, results["error"]
    assert list(results["tasks"]) == [task] and results["overall"]["episodes"] == 1
    assert results["config"]["EVALUATION"]["policy"] == "tests.example_libero_policy:make_policy"
    records = [json.loads(p.read_text()) for p in (out / "episodes").glob("*/*.json")]
    assert len(records) == 1
    record = records[0]
    assert (record["task"], record["trial"], record["init_state_id"], record["success"]) == (task, 0, 0, False)
    assert (record["steps"], record["model_calls"]) == (STEPS, STEPS // 8), record  # whole chunks of 8
    assert (out / "protocol.json").is_file() and (out / "results.csv").is_file()
    table = rf"^task .*95% CI.*\n-+\n{re.escape(task)} +1 +0 +0\.0 .*\n-+\noverall +1 +0 "
    assert re.search(table, ran.stdout, re.M) or re.search(table, ran.stderr, re.M), ran.stdout[-3000:]  # the page's

    snippet = _block("test_the_pages_command_evaluates_the_example_policy", "python")
    read = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert read.returncode == 0, read.stderr[-3000:]
    assert f"{task} 0 False {STEPS} {STEPS // 8}" in read.stdout, read.stdout
