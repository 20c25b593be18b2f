"""Evaluation over a real multi-node Ray cluster on this machine (MULTIRUN.actor_backend=ray, docs/cluster.md).

The cluster is Ray's own (``ray.cluster_utils.Cluster``): a head node for the driver, with no CPUs, and worker
nodes, each a raylet with its own CPUs, started as ``ray start --head`` / ``ray start --address`` start them.
Episodes run the stand-in simulator bench/sleepbench (installed as a suite plugin on every node's path) under a
random agent: given the episode seed, its record is the same wherever it runs. The claims: rollout actors run on
every worker node, each episode is recorded once on the driver, a node killed mid-run has its episodes rerun on
the others with the same outcomes, and a run whose driver and whole cluster died resumes on a new cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from bench.cluster import add_to_pythonpath, install_standin, local_cluster  # noqa: E402
from wam_gym.eval.config import compose  # noqa: E402
from wam_gym.eval.manager import EvalManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK, TRIALS, STEPS, SEED = "sleepbench/Dot-v0", 12, 25, 5
WAIT_S = 120


def overrides(output_dir, address: str | None = None, backend: str = "ray") -> list[str]:
    ray = [f"MULTIRUN.actor_backend={backend}"] + ([f"MULTIRUN.ray_address={address}"] if address else [])
    return ["EVALUATION.agent=random", f"MULTIRUN.task_sets=[{TASK}]", f"EVALUATION.num_trials={TRIALS}",
            f"EVALUATION.max_episode_steps={STEPS}", f"EVALUATION.seed={SEED}", "EVALUATION.tensorboard=false",
            "+env_kwargs.step_ms=20", f"EVALUATION.output_dir={output_dir}", *ray]


def records(output_dir) -> dict[int, dict]:
    """trial -> (seed, success, steps, reward), from every record file; fails on a duplicate or a stray file."""
    out = {}
    for path in sorted(Path(output_dir, "episodes").glob("*/*")):
        assert path.suffix == ".json" and not path.name.startswith("."), f"unexpected file {path}"
        data = json.loads(path.read_text())
        assert data["trial"] not in out, f"trial {data['trial']} recorded twice"
        out[data["trial"]] = (data["seed"], data["success"], data["steps"], data["reward"])
    return out


def wait_for_records(output_dir, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(list(Path(output_dir, "episodes").glob("*/*.json"))) < count and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """The stand-in plugin on this process's path for this module only (later tests' subprocesses never see it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", list(sys.path))
        patch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        add_to_pythonpath(ROOT, install_standin(tmp_path_factory.mktemp("plugins")))
        yield


@pytest.fixture(scope="module")
def reference(standin, tmp_path_factory) -> dict[int, tuple]:
    """The episodes run by local actor processes, no Ray, no fault."""
    out = tmp_path_factory.mktemp("local")
    summary = EvalManager(compose(overrides(out, backend="local"))).run()
    assert summary["complete"]
    recs = records(out)
    assert sorted(recs) == list(range(TRIALS)) and 0 < sum(r[1] for r in recs.values()) < TRIALS
    return recs


@pytest.fixture(scope="module")
def cluster(standin):
    with local_cluster(nodes=3, cpus=1) as running:
        yield running


def test_a_model_serves_actors_on_every_node(cluster, tmp_path):
    """agent=python: the broker in its Ray actor on the driver's node, its model worker a process there; actors on
    the worker nodes call it through the cluster. Same episodes as local actors calling a local broker; the videos
    made on the worker nodes are in the driver's output dir."""
    running, _ = cluster
    python = ["EVALUATION.agent=python", "EVALUATION.policy=tests.example_policy:make_policy"]
    local = EvalManager(compose([*overrides(tmp_path / "local", backend="local"), *python])).run()
    on_ray = EvalManager(compose([*overrides(tmp_path / "ray", running.address), *python,
                                  "EVALUATION.eval_save_video=true"])).run()
    assert local["complete"] and on_ray["complete"]
    assert records(tmp_path / "ray") == records(tmp_path / "local")
    videos = [json.loads(p.read_text())["video"] for p in (tmp_path / "ray" / "episodes").glob("*/*.json")]
    assert len(videos) == TRIALS and all((tmp_path / "ray" / v).stat().st_size > 0 for v in videos)  # made on the
    # actors' nodes, written on the driver
    assert on_ray["overall"]["cost"]["model_calls"] == local["overall"]["cost"]["model_calls"] > 0
    assert on_ray["broker"]["requests"] == local["overall"]["cost"]["model_calls"]


def test_a_hung_simulator_is_killed_and_its_episode_rerun(cluster, reference, tmp_path):
    """A simulator that hangs in one episode (once): its actor, silent past EVALUATION.actor_stall_s, is killed and
    the episode runs again on another actor; the records are the local run's."""
    running, _ = cluster
    hang = tmp_path / "hang"
    hang.touch()
    summary = EvalManager(compose([*overrides(tmp_path / "run", running.address), f"+env_kwargs.hang_file={hang}",
                                   "EVALUATION.actor_stall_s=2"])).run()
    assert not hang.exists() and summary["complete"]
    assert summary["reruns"]["actors_stalled"] == 1 and summary["reruns"]["actor_lost"] == 1
    assert records(tmp_path / "run") == reference


def test_every_node_runs_episodes_and_a_lost_node_costs_none(cluster, reference, tmp_path):
    """One run, 3 nodes of 1 CPU: an actor placed on each; the third node killed once a record is written: its
    episode is rerun elsewhere, every episode recorded once, outcomes as the local run's."""
    running, nodes = cluster
    placed: list[set] = []

    def kill_a_node(manager, actors, broker):
        def watch():
            deadline = time.monotonic() + WAIT_S
            while len(set(actors.pids().values()) - {None}) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            placed.append(set(actors.pids().values()))
            wait_for_records(tmp_path, 1)
            running.remove_node(nodes[2], allow_graceful=False)

        threading.Thread(target=watch, daemon=True).start()

    manager = EvalManager(compose(overrides(tmp_path, running.address)))
    manager.on_started = kill_a_node
    summary = manager.run()
    assert placed == [{n.node_id for n in nodes}]  # one actor on each worker node, none on the driver's
    assert summary["complete"] and summary["error"] is None
    assert summary["reruns"]["actor_lost"] >= 1  # the killed node's episode ran again elsewhere
    assert records(tmp_path) == reference
    assert summary["overall"]["episodes"] == TRIALS


def test_a_run_resumes_after_the_driver_and_the_whole_cluster_died(standin, reference, tmp_path):
    """python -m wam_gym.eval on a cluster, SIGKILLed after 3 records with its cluster shut down; the same command
    on a new cluster runs exactly the missing episodes, under the same protocol identity."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with local_cluster(nodes=2, cpus=1) as (running, _):
        command = [sys.executable, "-m", "wam_gym.eval", *overrides(tmp_path, running.address)]
        driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_records(tmp_path, 3)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    first = records(tmp_path)
    assert 3 <= len(first) < TRIALS
    protocol = json.loads(Path(tmp_path, "protocol.json").read_text())
    with local_cluster(nodes=2, cpus=1) as (running, _):
        done = subprocess.run([sys.executable, "-m", "wam_gym.eval", *overrides(tmp_path, running.address)],
                              env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert records(tmp_path) == reference
    assert {k: first[k] for k in first} == {k: reference[k] for k in first}  # kept, never rerun
    summary = json.loads(Path(tmp_path, "results.json").read_text())
    assert summary["complete"] and summary["protocol_hash"] and summary["resume_mismatch"] == []
    assert json.loads(Path(tmp_path, "protocol.json").read_text())["protocol"] == protocol["protocol"]


def test_actor_knobs_are_checked():
    with pytest.raises(ValueError, match=r"MULTIRUN.actor_backend='slurm': choose one of \('local', 'ray'\)"):
        compose(["MULTIRUN.actor_backend=slurm"])
    with pytest.raises(ValueError, match="MULTIRUN.num_actors and MULTIRUN.actor_resources place Ray actors"):
        compose(["MULTIRUN.num_actors=4"])
    with pytest.raises(ValueError, match="MULTIRUN.actor_cpus"):
        compose(["MULTIRUN.actor_backend=ray", "MULTIRUN.actor_cpus=0"])
