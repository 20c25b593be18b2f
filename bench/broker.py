"""Closed-loop env-steps/s through the broker vs sequential batch-1 calls vs offline forward.

    python bench/broker.py                              # tiny random WAM, Meta-World, CPU
    python bench/broker.py --ckpt DIR --actors 8 --batch-size 8 --num-gpus 1

One run, one model, one workload (the same tasks, seeds and episode length):
  broker      python -m wam_gym.eval's manager: --actors env processes, one model worker,
              dynamic batches of up to --batch-size (timed from the moment actors start)
  sequential  one env in this process, one model call at a time (batch 1)
  offline     the model alone, predict() on batches of --batch-size, converted to the
              env-steps/s it could feed (batch x replan_steps per call)
"""

from __future__ import annotations

import argparse
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

    model = build_model(preset("tiny"))
    save_pretrained(model, directory / "tiny")
    state, action = np.ones(model.config.state_dim), np.ones(model.config.action_dim)
    Normalizer(0 * state, state, -action, action).save(directory / "tiny" / "dataset_stats.json")
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
        agent = make_agent("wam", predictor=policy, replan_steps=args.replan_steps, action_space=env.action_space)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", help="checkpoint directory (default: the tiny preset, random weights)")
    parser.add_argument("--actors", type=int, default=4, help="MULTIRUN.env_num_per_worker")
    parser.add_argument("--batch-size", type=int, default=4, help="MULTIRUN.inference_batch_size")
    parser.add_argument("--wait-ms", type=float, default=20.0, help="MULTIRUN.inference_batch_wait_ms")
    parser.add_argument("--num-gpus", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="device of the sequential and offline runs")
    parser.add_argument("--trials", type=int, default=4, help="episodes per task")
    parser.add_argument("--steps", type=int, default=48, help="steps per episode")
    parser.add_argument("--replan-steps", type=int, default=8)
    parser.add_argument("--inference-steps", type=int, default=10)
    args = parser.parse_args()

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
          f"model p50 {stats['model_ms_p50']:.0f} ms)")
    print(f"  sequential  {seq_rate:7.1f} env-steps/s  (batch 1, one env)")
    print(f"  offline     {offline:7.1f} env-steps/s  (model alone, batch {args.batch_size})")
    print(f"  broker / sequential = {broker_rate / seq_rate:.2f}x")
    print(f"  broker / offline    = {broker_rate / offline:.2f}x  (goal >= 0.9 where envs do not share the model's cores)")


if __name__ == "__main__":
    main()
