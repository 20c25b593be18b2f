"""Episodes an hour on a Ray cluster of 1, 2 and 4 nodes, as a ratio to one node (issue 54).

    PYTHONPATH=. python bench/cluster.py                      # stand-in simulator (sleepbench), 1/2/4 nodes
    PYTHONPATH=. python bench/cluster.py --suite metaworld    # real Meta-World (the host's 2 cores share it)

Each node is a raylet of its own with ``--cpus`` CPUs (``ray.cluster_utils.Cluster`` on this host, started as
``ray start --head`` / ``ray start --address`` start them), the driver on a head node with no CPUs: every rollout
actor runs on a worker node, one per CPU (``MULTIRUN.actor_backend=ray``, ``num_actors`` null). The stand-in's
steps sleep (``--step-ms``), a simulator on a core of its own, so a 2-core host stands in for many nodes; the run
is ``python -m wam_gym.eval``'s, a random agent, results and records written on the driver. Each row prints
episodes/hour from the first episode's start to the last one's end (actor start-up excluded, printed apart), and what
the driver spent per episode: its CPU seconds (run loop, record writes, Ray calls) over the episodes run.
Then the costs that bound a big cluster (a record's write; the broker host's CPU per model call of 300 kB from
actors on other nodes) and, on paper, what they allow at 100 nodes of 16 actors (``--no-costs`` skips them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDIN = "sleepbench/Dot-v0"


def install_standin(folder: Path) -> Path:
    """Make the stand-in suite (bench/sleepbench) a plugin in ``folder`` (its package and an entry point, as pip
    would install it); put ``folder`` on PYTHONPATH for every process of the cluster. Returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    package = folder / "sleepbench"
    if not package.exists():
        shutil.copytree(ROOT / "bench" / "sleepbench", package, ignore=shutil.ignore_patterns("__pycache__"))
    info = folder / "wam_gym_sleepbench-0.1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wam-gym-sleepbench\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[wam_gym.suites]\nsleepbench = sleepbench\n")
    return folder


def add_to_pythonpath(*folders: Path) -> None:
    """``folders`` importable here and in every process started from here (raylets, Ray workers, actors); the
    stand-in suite registered here."""
    paths = [str(f) for f in folders]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path[:0] = [p for p in paths if p not in sys.path]
    from envs import register_suite

    register_suite("sleepbench")  # this process's registry may be built already: its entry point came too late


@contextlib.contextmanager
def local_cluster(nodes: int, cpus: int) -> Iterator[tuple[object, list]]:
    """A head node for the driver (no CPUs) and ``nodes`` worker nodes of ``cpus`` CPUs each, every server bound to
    127.0.0.1; yields (the Cluster, its worker nodes). The caller passes ``cluster.address`` as MULTIRUN.ray_address."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    os.environ.setdefault(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")  # loopback only
    ray_constants.ENABLE_RAY_CLUSTER = False
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    try:
        workers = [cluster.add_node(num_cpus=cpus, node_ip_address="127.0.0.1") for _ in range(nodes)]
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        cluster.shutdown()


def overrides(output_dir: Path, address: str, suite: str, trials: int, steps: int, step_ms: float) -> list[str]:
    task = STANDIN if suite == "sleepbench" else "wam_gym/MetaWorld-reach-v3"
    env = [f"+env_kwargs.step_ms={step_ms}"] if suite == "sleepbench" else ["+env_kwargs.image_size=32"]
    return ["EVALUATION.agent=random", f"MULTIRUN.task_sets=[{task}]", f"EVALUATION.num_trials={trials}",
            f"EVALUATION.max_episode_steps={steps}", "EVALUATION.seed=0", "EVALUATION.tensorboard=false",
            f"EVALUATION.output_dir={output_dir}", "MULTIRUN.actor_backend=ray", f"MULTIRUN.ray_address={address}",
            *env]


def measure(nodes: int, args, work: Path) -> dict:
    """One run on a fresh cluster of ``nodes`` nodes: episodes/hour from the first episode's start to the last's end."""
    from wam_gym.eval.config import compose
    from wam_gym.eval.manager import EvalManager

    with local_cluster(nodes, args.cpus) as (cluster, _):
        output = work / f"nodes{nodes}"
        cpu0, start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        summary = EvalManager(compose(overrides(output, cluster.address, args.suite, args.trials, args.steps,
                                                args.step_ms))).run()
        wall = time.monotonic() - start
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    files = list((output / "episodes").glob("*/*.json"))
    ends = [p.stat().st_mtime for p in files]  # each episode's start: its record's time less its wall time
    starts = [end - json.loads(p.read_text())["wall_time_s"] for p, end in zip(files, ends)]
    episodes, span = len(files), max(ends) - min(starts)
    driver_s = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return {"nodes": nodes, "actors": nodes * args.cpus, "episodes": episodes, "complete": summary["complete"],
            "per_hour": 3600 * episodes / span, "wall_s": wall, "startup_s": wall - span,
            "driver_cpu_ms_per_episode": 1000 * driver_s / episodes}


class MeteredHost:
    """BrokerHost with its process's and its dispatcher's CPU seconds (made a subclass where Ray is imported)."""

    def cpu_s(self) -> tuple[float, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime, self.broker.dispatcher_cpu_s()


class Caller:
    """A rollout actor's model calls, alone: ``n`` calls of two 224-pixel cameras through a GateClient."""

    def calls(self, host, actor_id: int, n: int) -> None:
        import numpy as np

        from wam_gym.eval.ray_broker import GateClient

        client, rng = GateClient(host, actor_id, 8), np.random.default_rng(actor_id)
        obs = {"pixels": {c: rng.integers(0, 255, (224, 224, 3), np.uint8) for c in ("a", "b")},
               "state": np.zeros(8, np.float32), "instruction": "x"}
        for _ in range(n):
            client.predict_row(obs)


def measure_costs(calls: int = 300) -> dict:
    """The per-episode and per-call costs that bound a big cluster: a record's write on the driver, and the broker
    host's CPU per model call from 4 actors on 2 other nodes (a model that answers at once)."""
    import functools

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from bench.standin import SleepPolicy
    from wam_gym.broker import BrokerConfig
    from wam_gym.eval.ray_broker import BrokerHost
    from wam_gym.eval.results import EpisodeRecord, ResultStore

    store, start = ResultStore(tempfile.mkdtemp(prefix="wam-records-")), time.perf_counter()
    for trial in range(calls):
        store.write(EpisodeRecord(task="wam_gym/MetaWorld-reach-v3", trial=trial, seed=trial, success=True, steps=100,
                                  reward=1.0, model_calls=13, model_s=1.2, env_s=3.4))
    write_ms = 1000 * (time.perf_counter() - start) / calls
    shutil.rmtree(store.output_dir, ignore_errors=True)
    with local_cluster(2, 2) as (cluster, _):
        ray.init(address=cluster.address, log_to_driver=False)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        host = ray.remote(type("Host", (MeteredHost, BrokerHost), {})).options(
            num_cpus=0, max_concurrency=16, scheduling_strategy=here).remote(
            functools.partial(SleepPolicy, 0.0, 0.0, 8), BrokerConfig(inference_batch_wait_ms=1.0,
                                                                    torch_threads_per_worker=0))
        callers = [ray.remote(num_cpus=1)(Caller).remote() for _ in range(4)]
        ray.get([c.calls.remote(host, i, 3) for i, c in enumerate(callers)])  # placed, imported, attached
        before, start = ray.get(host.cpu_s.remote()), time.perf_counter()
        ray.get([c.calls.remote(host, i, calls) for i, c in enumerate(callers)])
        wall, after = time.perf_counter() - start, ray.get(host.cpu_s.remote())
        ray.get(host.close.remote())
        ray.shutdown()
    n = 4 * calls
    return {"record_write_ms": write_ms, "calls_per_s": n / wall, "host_cpu_ms_per_call": 1000 * (after[0] - before[0]) / n,
            "dispatcher_cpu_ms_per_call": 1000 * (after[1] - before[1]) / n}


def paper_estimate(costs: dict, nodes: int = 100, actors: int = 16) -> list[str]:
    """What limits ``nodes`` nodes of ``actors`` actors, from the measured costs: calls/s asked vs one host's."""
    host_rate = 1000 / costs["host_cpu_ms_per_call"]
    lines = [f"record write {costs['record_write_ms']:.2f} ms (one driver core: {1000 / costs['record_write_ms']:.0f} "
             f"records/s); broker host {costs['host_cpu_ms_per_call']:.2f} ms CPU a call (dispatcher "
             f"{costs['dispatcher_cpu_ms_per_call']:.2f}): one host core serves {host_rate:.0f} calls/s"]
    for suite, step_s in (("LIBERO", 0.35), ("Meta-World", 0.025)):
        asked = nodes * actors / (8 * step_s)  # a call every 8 steps
        lines.append(f"{nodes} nodes x {actors} {suite} actors, replan 8: {asked:.0f} calls/s asked, "
                     f"{asked / host_rate:.1f}x one host; one host keeps up with {host_rate * 8 * step_s / actors:.0f} nodes")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=("sleepbench", "metaworld"), default="sleepbench")
    parser.add_argument("--nodes", default="1,2,4")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs (rollout actors) per node")
    parser.add_argument("--trials", type=int, default=64, help="episodes per run")
    parser.add_argument("--steps", type=int, default=40, help="steps per episode")
    parser.add_argument("--step-ms", type=float, default=50.0, help="the stand-in's sleep per step")
    parser.add_argument("--no-costs", action="store_true", help="skip the per-call costs and the 100-node estimate")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wam-cluster-bench-"))
    add_to_pythonpath(ROOT, install_standin(work / "site"))
    rows = [measure(int(n), args, work) for n in args.nodes.split(",")]
    base = rows[0]["per_hour"] / rows[0]["nodes"]
    print(f"suite={args.suite} cpus/node={args.cpus} trials={args.trials} steps={args.steps} step_ms={args.step_ms}")
    print("nodes  actors  episodes  ep/hour  ratio-to-1-node  start-up s  driver CPU ms/ep")
    for r in rows:
        print(f"{r['nodes']:5d}  {r['actors']:6d}  {r['episodes']:8d}  {r['per_hour']:7.0f}  "
              f"{r['per_hour'] / base:15.2f}  {r['startup_s']:10.1f}  {r['driver_cpu_ms_per_episode']:16.1f}")
    print(json.dumps(rows))
    if not args.no_costs:
        costs = measure_costs()
        print("\n".join(paper_estimate(costs)))
        print(json.dumps(costs))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
