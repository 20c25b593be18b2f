"""Real-time strategies side by side: success and smoothness per strategy and delay (issue 55).

For each strategy (hold, naive, ensemble, rtc) and each delay d (control steps a model call takes, simulated:
``EVALUATION.latency_ms = d / control_hz``), the demo WAM runs ``--episodes`` episodes of each demo task in this
process (seeds 0..n-1, the same for every cell, so cells pair) and prints:

* success: the rate with its 95% Wilson interval;
* jerk: the mean norm of the executed actions' third difference (a_t - 3 a_{t-1} + 3 a_{t-2} - a_{t-3});
* jump: the mean norm of a_t - a_{t-1} at the steps where a new chunk took over (the boundary), beside the mean
  step change elsewhere (``step``): a jump well above ``step`` is a visible jerk at each switch.

    python bench/realtime_chunking.py --ckpt outputs/demo/train/checkpoint            # the demo WAM (make demo)
    python bench/realtime_chunking.py --ckpt ... --strategies rtc --delays 0 4 8 --episodes 2   # a part of it

Runnable in parts (``--strategies``, ``--delays``, ``--tasks``, ``--episodes``); ``--json`` appends each cell's
figures to a file, so parts add up. Every figure is a count of simulated steps: none depends on the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import envs
from agents import make_agent, run_episode
from agents.realtime import Latency
from agents.realtime_strategies import STRATEGIES
from agents.wam.inference_config import InferenceConfig, SamplerConfig
from agents.wam.policy import WAMPolicy
from wam_gym.eval.tasks import TASK_SETS
from wam_gym.utils.stats import wilson

DEMO_CAMERAS, DEMO_IMAGE_SIZE, DEMO_REPLAN, DEMO_STEPS = ("corner", "gripperPOV"), 48, 8, 150  # wam_gym/demo.py's


def episode(policy: WAMPolicy, task: str, seed: int, strategy: str, delay: int, args) -> dict:
    """One episode: success, and the executed actions' jerk and boundary jumps."""
    env = envs.make(task, image_size=DEMO_IMAGE_SIZE, cameras=DEMO_CAMERAS)
    hz = env.unwrapped.control_hz
    agent = make_agent("wam", policy=policy, replan_steps=args.replan_steps, action_space=env.action_space,
                       latency=Latency(1000.0 * delay / hz), realtime_strategy=strategy)
    agent.control_hz = hz
    agent.predictor.begin_episode(seed, task)
    actions, boundaries, newest = [], [], [None]

    def after_act(obs, action) -> None:
        chunk = agent._chunks[-1] if agent._chunks else None
        if newest[0] is not None and chunk is not newest[0]:
            boundaries.append(len(actions))
        newest[0] = chunk
        actions.append(np.asarray(action, np.float64))

    result = run_episode(env, agent, seed=seed, max_steps=args.max_steps, after_act=after_act)
    env.close()
    a = np.stack(actions)
    steps = np.linalg.norm(np.diff(a, axis=0), axis=1)  # steps[t - 1] = |a_t - a_{t-1}|
    jerk = np.linalg.norm(a[3:] - 3 * a[2:-1] + 3 * a[1:-2] - a[:-3], axis=1)
    at = [t - 1 for t in boundaries if t >= 1]
    other = np.delete(steps, at)
    return {"success": bool(result.success), "jerk": float(jerk.mean()) if len(jerk) else 0.0,
            "jump": float(steps[at].mean()) if at else float("nan"), "step": float(other.mean()) if len(other) else 0.0,
            "calls": agent.num_model_calls, "held": agent.held_steps}


def cell(policy, tasks, strategy: str, delay: int, args) -> dict:
    runs = [episode(policy, task, seed, strategy, delay, args) for task in tasks for seed in range(args.episodes)]
    wins = sum(r["success"] for r in runs)
    low, high = wilson(wins, len(runs))
    jumps = [r["jump"] for r in runs if r["jump"] == r["jump"]]
    return {"strategy": strategy, "delay": delay, "episodes": len(runs), "success": wins / len(runs), "ci95": [low, high],
            "jerk": float(np.mean([r["jerk"] for r in runs])), "jump": float(np.mean(jumps)) if jumps else float("nan"),
            "step": float(np.mean([r["step"] for r in runs])), "held": int(sum(r["held"] for r in runs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True, help="the demo WAM's checkpoint (make demo: outputs/demo/train/checkpoint)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--delays", nargs="+", type=int, default=list(range(9)), help="control steps per model call")
    parser.add_argument("--tasks", nargs="+", default=list(TASK_SETS["metaworld_demo"]))
    parser.add_argument("--episodes", type=int, default=2, help="per task (seeds 0..n-1)")
    parser.add_argument("--replan-steps", type=int, default=DEMO_REPLAN)
    parser.add_argument("--max-steps", type=int, default=DEMO_STEPS)
    parser.add_argument("--inference-steps", type=int, default=10)
    parser.add_argument("--json", type=Path, help="append each cell's figures here (one JSON object a line)")
    args = parser.parse_args()
    config = InferenceConfig(sampler=SamplerConfig(num_inference_steps=args.inference_steps))
    policy = WAMPolicy.from_checkpoint(args.ckpt, config)
    print(f"{'strategy':9} {'d':>2} {'n':>4} {'success':>8} {'95% CI':>13} {'jerk':>7} {'jump':>7} {'step':>7} {'held':>5}")
    for strategy in args.strategies:
        for delay in args.delays:
            start = time.perf_counter()
            row = cell(policy, args.tasks, strategy, delay, args)
            low, high = row["ci95"]
            print(f"{strategy:9} {delay:>2} {row['episodes']:>4} {row['success']:>8.2f} [{low:.2f}, {high:.2f}] "
                  f"{row['jerk']:>7.3f} {row['jump']:>7.3f} {row['step']:>7.3f} {row['held']:>5}  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            if args.json:
                with args.json.open("a") as out:
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
