"""python -m wam_gym.serve serving a LingBot-VA release, a model that remembers each episode, to the real clients:
openpi-client (from .venv-openpi) as openpi's LIBERO example drives it with ``--args.replan-steps 1`` and an
``episode_id``, and vla-eval's own ``Connection`` as its LIBERO benchmark sends. One server, one tiny random
release (scripts/tiny_lingbot_va_release.py), two episodes over one connection each; every action equals what an
evaluation's agent (MemoryChunkAgent) gets from the release in this process for the same frames and seeds.

An episode runs STEPS observations: the first chunk's 12 actions, a whole chunk of 16, and 2 of a third, so the
model is called 3 times and writes the frames of 12, then 16 actions back into its cache.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import numpy as np
import pytest
from vla_eval.connection import Connection

from tests.conftest import load_script
from wam_gym.serve.launch import launched

ROOT = Path(__file__).resolve().parents[1]
STEPS = 30  # observations per episode: 12 + 16 + 2 actions, 3 model calls
SEEDS = (0, 7)  # episode 1: the server's first seed (EVALUATION.seed 0, its first session); episode 2: sent
PROMPTS = ("pick up the black bowl", "open the top drawer")
LIBERO_BENCHMARK = "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark"  # what vla-eval's runner names in HELLO


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return load_script("tiny_lingbot_va_release").make(tmp_path_factory.mktemp("lingbot") / "release")


@pytest.fixture(scope="module")
def episodes() -> dict[str, np.ndarray]:
    """Two episodes of robosuite-like raw frames (bottom row first: upright is ``[::-1]``) at their 128 px."""
    rng = np.random.default_rng(0)
    return {camera: rng.integers(0, 256, (len(SEEDS), STEPS, 128, 128, 3), dtype=np.uint8)
            for camera in ("agentview", "wrist")} | {"state": rng.standard_normal((len(SEEDS), STEPS, 8)).astype(np.float32)}


@pytest.fixture(scope="module")
def expected(release, episodes) -> np.ndarray:
    """(episodes, STEPS, 7): the release in this process, driven by an evaluation's agent with the upright frames."""
    from agents.episode_memory import MemoryChunkAgent
    from agents.predictor import PolicyPredictor
    from agents.wam.lingbot_va.policy import LingBotVAPolicy

    predictor = PolicyPredictor(LingBotVAPolicy.from_release(release, "lingbot_va_libero"))
    actions = []
    for e, seed in enumerate(SEEDS):
        agent = MemoryChunkAgent(predictor)
        predictor.begin_episode(seed)
        actions.append([agent.act({"pixels": {"agentview": episodes["agentview"][e, t][::-1],
                                              "robot0_eye_in_hand": episodes["wrist"][e, t][::-1]},
                                   "state": episodes["state"][e, t], "instruction": PROMPTS[e]}) for t in range(STEPS)])
    return np.asarray(actions)


@pytest.fixture(scope="module")
def server(release, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with launched([f"ckpt={release}", "protocol=lingbot_va_libero"], cwd=ROOT, log=log,
                  env={**os.environ, "PYTHONPATH": str(ROOT)}) as served:
        yield served.port, log


def _stats(port: int) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as response:
        return json.loads(response.read())


def test_openpis_libero_example_drives_episodes_by_their_episode_id(server, episodes, expected, openpi_python, tmp_path):
    """The greeting says the model remembers episodes and answers one action; two episodes over one connection
    (the first seeded by the server, the second by its noise_seed) get the in-process agent's actions; an
    observation without its episode_id is refused in one line naming the change to openpi's example."""
    port, log = server
    sent, out = tmp_path / "episodes.npz", tmp_path / "answers.npz"
    np.savez(sent, **episodes, prompt=np.array(PROMPTS), noise_seed=np.array([-1, SEEDS[1]]))
    before = _stats(port)
    subprocess.run([openpi_python, ROOT / "tests" / "clients" / "openpi_episodes_driver.py", str(port), sent, out],
                   check=True, timeout=300)
    after = _stats(port)
    with np.load(out, allow_pickle=False) as answers:
        actions, metadata, refused = answers["actions"], json.loads(str(answers["metadata"])), str(answers["refused"])
    assert (metadata["action_horizon"], metadata["replan_steps"], metadata["protocol"]) == (1, 1, "lingbot_va_libero")
    assert metadata["episodes"]["remembered"] and metadata["episodes"]["model_chunk"] == 16
    assert metadata["frames"]["expected"] == "mirrored"  # the convention's suite is LIBERO, whose drivers turn them
    np.testing.assert_allclose(actions, expected, atol=1e-5)  # measured: at most 4.8e-7 (actions up to 3.1)
    assert after["openpi_episodes"] - before["openpi_episodes"] == 2
    assert after["broker"]["requests"] - before["broker"]["requests"] == 2 * 3  # a model call per chunk, no more
    assert refused.splitlines()[-1] == (
        "wam_gym.serve: this model remembers each episode (its state stays on the server between calls), so every "
        "observation must name its episode: send 'episode_id' (any str or int, new for each episode); for openpi's "
        "LIBERO example, add \"episode_id\": f\"{task_id}-{episode_idx}\" to the element dict that "
        "examples/libero/main.py sends, and run it with --args.replan-steps 1")
    assert "Traceback" not in log.read_text()


def test_vla_evals_connection_gets_the_in_process_agents_actions(server, episodes, expected):
    """vla-eval's Connection, as its LIBERO benchmark sends (frames turned 180 degrees, its HELLO naming the
    benchmark): episode_start starts each episode; one action per observation."""
    port, _ = server
    got = [[] for _ in SEEDS]

    async def run() -> None:
        conn = Connection(f"ws://127.0.0.1:{port}", timeout=120)
        await conn.connect(benchmark=LIBERO_BENCHMARK)
        try:
            for e, seed in enumerate(SEEDS):
                await conn.start_episode({"task": {"name": PROMPTS[e]}, "seed": seed})
                for t in range(STEPS):
                    obs = {"images": {"agentview": np.ascontiguousarray(episodes["agentview"][e, t][::-1, ::-1]),
                                      "wrist": np.ascontiguousarray(episodes["wrist"][e, t][::-1, ::-1])},
                           "states": episodes["state"][e, t], "task_description": PROMPTS[e]}
                    got[e].append((await conn.act(obs))["actions"])
                await conn.end_episode({"success": False})
        finally:
            await conn.close()

    anyio.run(run)
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)
