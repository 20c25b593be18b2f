"""Round trip through the policy server (openpi and vla-eval protocols) vs the in-process broker.

    python bench/serve.py                                   # 1, 8, 32 clients; 20 ms stand-in; 224x224
    python bench/serve.py --clients 1 8 --calls 50 --delay-ms 50 --json serve.json

One run, one stand-in model, the same broker settings on every path:
  in-process       an InferenceBroker in this process; each client a thread with its own
                   ``broker.client(i)`` calling ``predict(stack_rows([row]))``
  server openpi    ``python -m wam_gym.serve`` (a subprocess, loopback); each client a thread with
                   its own WebSocket, ``pack_openpi(observation)`` out, ``unpack`` of the answer in
  server vla-eval  the same server; each client vla-eval's own ``Connection.act`` (anyio tasks).
                   The server runs with EVALUATION.replan_steps=1, so every step is one model call.
                   Images go as vla-eval sends them by default (PNG), and raw (--vla-eval-images)

The stand-in's predict sleeps for "device time" (--delay-ms) and uses no CPU, so what is measured
is the transport: pipes, msgpack, WebSocket, the server's threads. Each client makes --warmup
calls, then all start together and make --calls timed calls; wall time spans all clients.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT, BENCH = Path(__file__).resolve().parents[1], Path(__file__).resolve().parent
POLICY = "serve:make_policy"  # this file, imported by the model workers with bench/ on PYTHONPATH
DELAY_ENV = "WAM_BENCH_SERVE_DELAY_S"
CAMERAS = ["agentview", "wrist"]
HORIZON, ACTION_DIM, STATE_DIM, PROMPT = 16, 7, 8, "pick up the block"


class StandInPolicy:
    """(B, 16, 7) zeros after ``delay_s`` of "device time": a sleep, no CPU."""

    action_horizon = HORIZON

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    def predict(self, obs, noise_seeds=None):
        time.sleep(self.delay_s)
        return np.zeros((len(obs["state"]), HORIZON, ACTION_DIM), np.float32)


def make_policy(device: str) -> StandInPolicy:
    return StandInPolicy(float(os.environ[DELAY_ENV]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrent clients, one run each")
    p.add_argument("--calls", type=int, default=30, help="timed calls per client")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per client first")
    p.add_argument("--delay-ms", type=float, default=20.0, help="the stand-in's device time per model call")
    p.add_argument("--image-size", type=int, default=224, help="both cameras are SIZE x SIZE x 3 uint8")
    p.add_argument("--batch-size", type=int, default=32, help="MULTIRUN.inference_batch_size")
    p.add_argument("--wait-ms", type=float, default=2.0, help="MULTIRUN.inference_batch_wait_ms")
    p.add_argument("--vla-eval-images", nargs="*", default=["png", "raw"], choices=["png", "jpeg", "raw"],
                   help="vla-eval paths, one per image format its client sends (png: its default; none: skip)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    return p.parse_args(argv)


# ----------------------------------------------------------------- clients
def timed_threads(n: int, warmup: int, calls: int, connect, call) -> tuple[float, list[float]]:
    """n threads, each ``with connect(i) as s``: ``warmup`` calls, then (all together) ``calls``
    timed calls of ``call(s)``. (wall seconds over all clients, every call's seconds)."""
    barrier, latencies, errors = threading.Barrier(n + 1), [[] for _ in range(n)], []

    def client(i: int) -> None:
        try:
            with connect(i) as session:
                for _ in range(warmup):
                    call(session)
                barrier.wait()
                for _ in range(calls):
                    start = time.perf_counter()
                    call(session)
                    latencies[i].append(time.perf_counter() - start)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return wall, [x for per_client in latencies for x in per_client]


def in_process(broker, row: dict, n: int, args, ids) -> tuple[float, list[float]]:
    from envs.protocol import stack_rows

    @contextlib.contextmanager
    def connect(_):
        client = broker.client(next(ids))
        try:
            yield client
        finally:
            client.close()
            broker.forget_actor(client.actor_id)

    def call(client) -> None:
        assert client.predict(stack_rows([row])).actions.shape == (1, HORIZON, ACTION_DIM)

    return timed_threads(n, args.warmup, args.calls, connect, call)


def openpi(port: int, obs: dict, n: int, args) -> tuple[float, list[float]]:
    from websockets.sync.client import connect as ws_connect

    from wam_gym.remote.wire import pack_openpi, unpack

    @contextlib.contextmanager
    def connect(_):
        with ws_connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as ws:
            ws.recv()  # the greeting (openpi's metadata)
            yield ws

    def call(ws) -> None:
        ws.send(pack_openpi(obs))
        answer = unpack(ws.recv())
        assert answer["actions"].shape == (HORIZON, ACTION_DIM), answer

    return timed_threads(n, args.warmup, args.calls, connect, call)


def vla_eval(port: int, image_format: str, obs: dict, n: int, args) -> tuple[float, list[float]]:
    import anyio
    from vla_eval.connection import Connection
    from vla_eval.protocol.numpy_codec import set_image_format

    set_image_format(image_format)  # how vla-eval's client encodes HWC uint8 arrays (module-wide)

    latencies, warmed, timing = [], [], {}

    async def session(i: int, go: anyio.Event) -> None:
        async with Connection(f"ws://127.0.0.1:{port}", timeout=120) as conn:
            await conn.start_episode({"seed": i})
            for _ in range(args.warmup):
                await conn.act(obs)
            warmed.append(i)
            if len(warmed) == n:
                go.set()
            await go.wait()
            for _ in range(args.calls):
                start = time.perf_counter()
                action = await conn.act(obs)
                latencies.append(time.perf_counter() - start)
                assert np.asarray(action["actions"]).shape == (ACTION_DIM,), action

    async def main() -> None:
        go = anyio.Event()
        async with anyio.create_task_group() as group:
            for i in range(n):
                group.start_soon(session, i, go)
            await go.wait()
            timing["start"] = time.perf_counter()
        timing["wall"] = time.perf_counter() - timing["start"]

    anyio.run(main)
    return timing["wall"], latencies


# ----------------------------------------------------------------- the server
def server(args, env: dict, tmp: Path):
    """``python -m wam_gym.serve`` of the stand-in on a free loopback port; always SIGTERMed and waited for."""
    from wam_gym.serve.launch import launched

    return launched(["EVALUATION.agent=python", f"EVALUATION.policy={POLICY}", f"SERVE.cameras=[{','.join(CAMERAS)}]",
                     "EVALUATION.replan_steps=1", f"MULTIRUN.inference_batch_size={args.batch_size}",
                     f"MULTIRUN.inference_batch_wait_ms={args.wait_ms}"], env=env, cwd=ROOT, log=tmp / "serve.log")


def server_batches(port: int) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as response:
        broker = json.loads(response.read())["broker"]
    return broker["requests"], broker["batches"]


# ----------------------------------------------------------------- main
def summarize(path: str, n: int, wall: float, latencies: list[float], batches: tuple[int, int]) -> dict:
    ms = np.asarray(latencies) * 1000
    return {"path": path, "clients": n, "requests": len(latencies), "wall_s": wall,
            "requests_per_s": len(latencies) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p95_ms": float(np.percentile(ms, 95)), "mean_batch": batches[0] / max(batches[1], 1)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    from agents.policy import build_policy
    from wam_gym.broker import InferenceBroker
    from wam_gym.eval.config import MultirunConfig

    # The model workers (here and in the server) import this file as `serve` and read the delay.
    os.environ[DELAY_ENV] = str(args.delay_ms / 1000)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), str(ROOT), os.environ.get("PYTHONPATH")]))
    rng = np.random.default_rng(0)
    images = {cam: rng.integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8) for cam in CAMERAS}
    state = rng.standard_normal(STATE_DIM).astype(np.float32)
    row = {"pixels": images, "state": state, "instruction": PROMPT}
    openpi_obs = {"observation/image": images[CAMERAS[0]], "observation/wrist_image": images[CAMERAS[1]],
                  "observation/state": state, "prompt": PROMPT}
    vla_obs = {"images": images, "state": state, "task_description": PROMPT}

    machine = {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
               "python": platform.python_version(), "date": datetime.now().isoformat(timespec="seconds")}
    settings = {k: v for k, v in vars(args).items() if k != "json"} | {"json": str(args.json) if args.json else None}
    print(f"Machine: {machine['platform']}, {machine['cpus']} CPUs, Python {machine['python']}. Date: {machine['date']}")
    print(f"Stand-in model: {args.delay_ms:g} ms sleep per call; 2 cameras {args.image_size}x{args.image_size} uint8 + "
          f"state {STATE_DIM} + instruction -> chunk ({HORIZON}, {ACTION_DIM}); batch <= {args.batch_size}, wait "
          f"{args.wait_ms:g} ms, one model worker; {args.warmup} warm-up + {args.calls} timed calls per client")

    results, ids = [], iter(range(10**9))
    broker = InferenceBroker(functools.partial(build_policy, POLICY), MultirunConfig(
        inference_batch_size=args.batch_size, inference_batch_wait_ms=args.wait_ms))
    with tempfile.TemporaryDirectory() as tmp, broker, server(args, dict(os.environ), Path(tmp)) as served:
        port = served.port
        for n in args.clients:  # the paths interleaved per client count: drift hits them alike
            before = (broker.stats.requests, broker.stats.batches)
            wall, lat = in_process(broker, row, n, args, ids)
            delta = (broker.stats.requests - before[0], broker.stats.batches - before[1])
            results.append(summarize("in-process", n, wall, lat, delta))
            paths = [("server openpi", functools.partial(openpi, port, openpi_obs))]
            paths += [(f"server vla-eval {fmt}", functools.partial(vla_eval, port, fmt, vla_obs))
                      for fmt in args.vla_eval_images]
            for name, run in paths:
                before = server_batches(port)
                wall, lat = run(n, args)
                after = server_batches(port)
                results.append(summarize(name, n, wall, lat, (after[0] - before[0], after[1] - before[1])))
            for r in results[-1 - len(paths):]:
                print(f"  N={r['clients']:>3}  {r['path']:<20} {r['requests_per_s']:8.1f} req/s  p50 {r['p50_ms']:7.1f} ms"
                      f"  p95 {r['p95_ms']:7.1f} ms  mean batch {r['mean_batch']:5.2f}", flush=True)

    ratios = []
    for n in args.clients:
        base = next(r for r in results if r["clients"] == n and r["path"] == "in-process")
        for r in results:
            if r["clients"] == n and r["path"] != "in-process":
                ratios.append({"path": r["path"], "clients": n,
                               "throughput_ratio": r["requests_per_s"] / base["requests_per_s"],
                               "p50_overhead_ms": r["p50_ms"] - base["p50_ms"],
                               "p95_overhead_ms": r["p95_ms"] - base["p95_ms"]})
    print(f"\n{'N':>3}  {'path':<20}{'req/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'batch':>7}")
    for r in results:
        print(f"{r['clients']:>3}  {r['path']:<20}{r['requests_per_s']:9.1f}{r['p50_ms']:9.1f}{r['p95_ms']:9.1f}"
              f"{r['mean_batch']:7.2f}")
    print("\nserver / in-process:")
    for q in ratios:
        print(f"{q['clients']:>3}  {q['path']:<20} throughput {q['throughput_ratio']:5.2f}x   p50 "
              f"{q['p50_overhead_ms']:+6.1f} ms   p95 {q['p95_overhead_ms']:+6.1f} ms")
    report = {"machine": machine, "settings": settings, "results": results, "ratios": ratios}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
