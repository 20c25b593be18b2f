"""Closed-loop env-steps/s through the broker vs sequential batch-1 calls vs offline forward.

    python bench/broker.py                              # tiny random WAM, Meta-World, CPU
    python bench/broker.py --ckpt DIR --actors 8 --batch-size 8 --num-gpus 1
    python bench/broker.py --standin                    # the broker's own efficiency (see below)

One run, one model, one workload (the same tasks, seeds and episode length):
  broker      python -m wam_gym.eval's manager: --actors env processes, one model worker,
              dynamic batches of up to --batch-size (timed from the moment actors start)
  sequential  one env in this process, one model call at a time (batch 1)
  offline     the model alone, predict() on batches of --batch-size, converted to the
              env-steps/s it could feed (batch x replan_steps per call)

--standin replaces the model with one whose call on b requests sleeps a + c*b seconds and the
envs with steps that sleep e (bench/standin.py), sweeps actors x workers x batch size x image
size x cameras, and prints per point the broker's env-steps/s, the most any scheduler can reach
(the bound), the same bound for the envs and model as they ran (their sleeps end late on a busy
host: "as-run"), the synchronous lockstep loop's rate, and broker/bound; then the mean batch, the
median queue wait and of that the median wait for a batch's last request ("fill50": actors that
arrive staggered), and the dispatcher's CPU per request. The timing is the
issue's (a = 30 ms, c = 3 ms, e = 10 ms, R = 8) unless --latency-ms, --per-row-ms, --env-step-ms
and --replan-steps give your model's and envs' own:

    python bench/broker.py --standin --no-peer --latency-ms 120 --per-row-ms 12 --point 32,4,16
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

from envs.protocol import INSTRUCTION, PIXELS, STATE

TASKS = ["wam_gym/MetaWorld-reach-v3", "wam_gym/MetaWorld-push-v3"]


def make_checkpoint(directory: Path) -> str:
    """The tiny preset with random weights, and identity statistics (eval refuses a checkpoint without)."""
    from agents.wam import Normalizer, build_model, preset, save_pretrained
    from agents.wam.normalization import unit_stats

    model = build_model(preset("tiny"))
    save_pretrained(model, directory / "tiny")
    stats = unit_stats(model.config.state_dim, model.config.action_dim)
    Normalizer.from_stats(stats).save(directory / "tiny" / "dataset_stats.json")
    return str(directory / "tiny")


def broker_run(args, ckpt: str, output_dir: Path) -> tuple[float, int, dict]:
    from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
    from wam_gym.eval.manager import EvalManager

    config = EvalConfig(
        ckpt=ckpt,
        EVALUATION=EvaluationConfig(
            num_trials=args.trials, max_episode_steps=args.steps, num_inference_steps=args.inference_steps,
            replan_steps=args.replan_steps, output_dir=str(output_dir), tensorboard=False,
        ),
        MULTIRUN=MultirunConfig(
            num_gpus=args.num_gpus, env_num_per_worker=args.actors, inference_batch_size=args.batch_size,
            inference_batch_wait_ms=args.wait_ms, task_sets=TASKS,
        ),
    )
    manager = EvalManager(config)
    started = {}
    manager.on_started = lambda *_: started.setdefault("t", time.perf_counter())
    manager.run()
    seconds = time.perf_counter() - started["t"]
    steps = sum(r.steps for r in manager.store.records())
    return seconds, steps, manager.broker_stats


def local_policy(args, ckpt: str):
    from agents.wam import InferenceConfig, WAMPolicy

    inference = InferenceConfig.from_knobs(num_inference_steps=args.inference_steps)
    return WAMPolicy.from_checkpoint(ckpt, inference, device=args.device)


def sequential_run(args, ckpt: str) -> tuple[float, int]:
    import envs
    from agents import make_agent, run_episode

    policy = local_policy(args, ckpt)
    cameras, size = list(policy.model.config.cameras), list(policy.model.config.image_size)
    steps, start = 0, time.perf_counter()
    for task in TASKS:
        env = envs.make(task, cameras=cameras, image_size=size)
        agent = make_agent("wam", policy=policy, replan_steps=args.replan_steps, action_space=env.action_space)
        for trial in range(args.trials):
            steps += run_episode(env, agent, seed=trial, max_steps=args.steps).steps
        env.close()
    return time.perf_counter() - start, steps


def offline_run(args, ckpt: str) -> float:
    """Env-steps/s the model alone could feed at this batch size."""
    policy = local_policy(args, ckpt)
    cfg = policy.model.config
    rng = np.random.default_rng(0)
    h, w = cfg.image_size
    obs = {
        PIXELS: {c: rng.integers(0, 256, (args.batch_size, h, w, 3), dtype=np.uint8) for c in cfg.cameras},
        STATE: rng.normal(size=(args.batch_size, cfg.state_dim)).astype(np.float32),
        INSTRUCTION: tuple("reach the goal" for _ in range(args.batch_size)),
    }
    for _ in range(2):
        policy.predict(obs)
    calls, start = 20, time.perf_counter()
    for _ in range(calls):
        policy.predict(obs)
    seconds = (time.perf_counter() - start) / calls
    return args.batch_size * args.replan_steps / seconds


def standin_broker(workload, window, wait_ms: float, backend: str = "local", pacing: bool = True):
    """Env-steps/s of ``workload`` through the broker (N actor processes, W stand-in workers), the
    broker's stats, and the workload as it ran (standin.as_run)."""
    from standin import as_run, sleep_policy_factory, start_broker_actors

    from wam_gym.broker import BrokerConfig, InferenceBroker

    config = BrokerConfig(workers_per_gpu=workload.workers, inference_batch_size=workload.batch_size,
                          inference_batch_wait_ms=wait_ms, backend=backend, torch_threads_per_worker=0,
                          batch_pacing=pacing)
    with InferenceBroker(sleep_policy_factory(workload), config) as broker:
        actors, controls = start_broker_actors(broker, workload)
        for control in controls:
            control.recv()  # "ready": spawned and imported
        start, stop = window.times()
        for control in controls:
            control.send((start, stop))
        cpu = broker.dispatcher_cpu_s()
        runs = [control.recv() for control in controls]
        cpu = broker.dispatcher_cpu_s() - cpu
        for actor in actors:
            actor.join(timeout=10)
        stats = broker.stats.summary()
        stats["dispatcher_us_per_request"] = 1e6 * cpu / max(stats["requests"], 1)
        return window.rate(start, runs), stats, as_run(workload, runs, *window.counted(start))


SWEEP = {
    # name: (actors, workers, batch sizes, image sizes, cameras)
    "actors x workers": ([1, 4, 8, 16, 32, 64], [1, 2, 4], [16], [224], [2]),
    "batch size": ([16, 64], [1, 4], [4, 8, 32], [224], [2]),
    "image size x cameras": ([8, 64], [1, 4], [16], [64, 224], [1, 3]),
}


def standin_sweep(args) -> None:
    from standin import Window, Workload, best_schedule, simulate
    from vla_eval_peer import standin_vla_eval

    window = Window(args.warmup_s, args.measure_s)
    sweeps = {k: v for k, v in SWEEP.items() if not args.sweep or k.startswith(args.sweep)}
    sweeps = {name: list(itertools.product(*grid)) for name, grid in sweeps.items()}
    if args.point:  # N,W,B[,image size,cameras]: these points only
        points = [[int(x) for x in p.split(",")] for p in args.point]
        sweeps = {"points": [(n, w, b, *(rest or [224, 2])) for n, w, b, *rest in points]}
    print(f"\nbench/broker.py --standin  {date.today()}  {platform.node()}  {platform.machine()}  "
          f"{os.cpu_count()} cores")
    timing = {"latency_s": args.latency_ms / 1000, "per_row_s": args.per_row_ms / 1000,
              "env_step_s": args.env_step_ms / 1000, "replan_steps": args.replan_steps}
    example = Workload(1, 1, 1, **timing)
    print(f"model call L(b) = {example.latency_s * 1e3:g} + {example.per_row_s * 1e3:g}*b ms (sleep), env step "
          f"{example.env_step_s * 1e3:g} ms (sleep), replan every {example.replan_steps}; wait {args.wait_ms:g} ms, "
          f"backend {args.backend}; steps counted over {window.measure_s:g} s after {window.warmup_s:g} s")
    print(f"{'N':>3} {'W':>2} {'B':>3} {'img':>4} {'cam':>3} {'broker':>7} {'bound':>7} {'as-run':>7} {'best':>7} "
          f"{'rule':>7} {'lockstep':>8} {'issue':>7} {'vla-eval':>8} {'/bound':>6} {'/run':>6} {'/best':>6} {'/lock':>6} "
          f"{'/vla':>5} {'batch':>5} {'wait50':>6} {'fill50':>6} {'us/req':>6} {'stack50':>7}")
    ratios = []
    for name, points in sweeps.items():
        print(f"-- {name}")
        for n, w, b, size, cam in points:
            load = Workload(n, w, b, image_size=size, cameras=cam, **timing)
            rate, stats, ran = standin_broker(load, window, args.wait_ms, args.backend, not args.no_pacing)
            bound, run_bound, best = load.bound(), ran.bound(), best_schedule(load)
            rule = simulate(load, args.wait_ms, not args.no_pacing)[0]
            peer = float("nan") if args.no_peer else standin_vla_eval(load, window, args.wait_ms)[0]
            ratios.append((rate / bound, rate / run_bound, rate / best, rate / peer))
            print(f"{n:>3} {w:>2} {b:>3} {size:>4} {cam:>3} {rate:7.0f} {bound:7.0f} {run_bound:7.0f} {best:7.0f} "
                  f"{rule:7.0f} {load.lockstep():8.0f} {load.issue_bound():7.0f} {peer:8.0f} {rate / bound:6.3f} "
                  f"{rate / run_bound:6.3f} {rate / best:6.3f} {rate / load.lockstep():6.2f} {rate / peer:5.2f} "
                  f"{stats['mean_batch_size']:5.1f} {stats['queue_wait_ms_p50']:6.1f} {stats['batch_fill_ms_p50']:6.1f} "
                  f"{stats['dispatcher_us_per_request']:6.0f} {stats['stack_ms_p50']:7.2f}", flush=True)
    for name, column in zip(("bound", "as-run bound", "best", "vla-eval"), zip(*ratios)):
        print(f"broker/{name}: min {np.min(column):.3f}, median {np.median(column):.3f} ({len(column)} points)")


def main() -> None:
    from standin import Workload

    issue = Workload(1, 1, 1)  # the issue's timing: the stand-ins' defaults
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", help="checkpoint directory (default: the tiny preset, random weights)")
    parser.add_argument("--actors", type=int, default=4, help="MULTIRUN.env_num_per_worker")
    parser.add_argument("--batch-size", type=int, default=4, help="MULTIRUN.inference_batch_size")
    parser.add_argument("--wait-ms", type=float, help="MULTIRUN.inference_batch_wait_ms (default: 20; --standin: "
                        "the broker's default)")
    parser.add_argument("--num-gpus", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="device of the sequential and offline runs")
    parser.add_argument("--trials", type=int, default=4, help="episodes per task")
    parser.add_argument("--steps", type=int, default=48, help="steps per episode")
    parser.add_argument("--replan-steps", type=int, default=issue.replan_steps)
    parser.add_argument("--inference-steps", type=int, default=10)
    parser.add_argument("--standin", action="store_true", help="stand-in model and envs: the broker against the bound")
    parser.add_argument("--sweep", help="--standin: only the sweep whose name starts with this")
    parser.add_argument("--point", action="append", help="--standin: N,W,B[,IMAGE,CAMERAS] instead of the sweeps "
                        "(repeatable), e.g. --point 32,4,16 --point 8,1,16,64,1")
    parser.add_argument("--backend", default="local", help="--standin: MULTIRUN.backend (local or ray)")
    parser.add_argument("--no-peer", action="store_true", help="--standin: skip vla-eval's server")
    parser.add_argument("--no-pacing", action="store_true", help="--standin: MULTIRUN.batch_pacing=false")
    parser.add_argument("--latency-ms", type=float, default=issue.latency_s * 1000,
                        help="--standin: a, a call's fixed cost (default: the issue's %(default)g)")
    parser.add_argument("--per-row-ms", type=float, default=issue.per_row_s * 1000,
                        help="--standin: c, each request's extra cost in a call (default %(default)g)")
    parser.add_argument("--env-step-ms", type=float, default=issue.env_step_s * 1000,
                        help="--standin: e, an env step (default %(default)g)")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="--standin: seconds before steps are counted")
    parser.add_argument("--measure-s", type=float, default=4.0, help="--standin: seconds steps are counted")
    args = parser.parse_args()
    if args.standin:
        from wam_gym.broker import BrokerConfig

        args.wait_ms = BrokerConfig.inference_batch_wait_ms if args.wait_ms is None else args.wait_ms
        return standin_sweep(args)
    args.wait_ms = 20.0 if args.wait_ms is None else args.wait_ms

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.ckpt or make_checkpoint(Path(tmp))
        broker_s, broker_steps, stats = broker_run(args, ckpt, Path(tmp) / "eval")
        seq_s, seq_steps = sequential_run(args, ckpt)
        offline = offline_run(args, ckpt)
    broker_rate, seq_rate = broker_steps / broker_s, seq_steps / seq_s
    print(f"\nbench/broker.py  {date.today()}  {platform.node()}  {platform.machine()}")
    print(f"{len(TASKS)} tasks x {args.trials} episodes x {args.steps} steps, replan every {args.replan_steps}, "
          f"{args.inference_steps} denoising steps; {args.actors} actors, batch {args.batch_size}, wait {args.wait_ms} ms")
    print(f"  broker      {broker_rate:7.1f} env-steps/s  ({broker_steps} steps in {broker_s:.1f} s; mean batch "
          f"{stats['mean_batch_size']:.2f}, queue wait p50 {stats['queue_wait_ms_p50']:.0f} ms, "
          f"model p50 {stats['model_ms_p50']:.0f} ms, stacking a batch p50 {stats['stack_ms_p50']:.1f} ms)")
    print(f"  sequential  {seq_rate:7.1f} env-steps/s  (batch 1, one env)")
    print(f"  offline     {offline:7.1f} env-steps/s  (model alone, batch {args.batch_size})")
    print(f"  broker / sequential = {broker_rate / seq_rate:.2f}x")
    print(f"  broker / offline    = {broker_rate / offline:.2f}x  (goal >= 0.9 where envs do not share the model's cores)")


if __name__ == "__main__":
    main()
