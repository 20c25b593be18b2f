"""Episodes per hour, rendering every step against rendering only what is read (issue 41).

    python bench/eval_throughput.py --suite metaworld --ckpt outputs/demo/train/checkpoint   # main venv
    .venv-libero/bin/python bench/eval_throughput.py --suite libero                    # stand-in policy
    .venv-robosuite/bin/python bench/eval_throughput.py --suite robosuite              # stand-in policy

For each replan interval, the same episodes (same seeds, same tasks) run twice, side by side in
one process: with envs that render every step (``EVALUATION.render=every_step``) and with lazy
envs whose runner renders only the observations the agent reads (``render=needed``, the default
of ``python -m wam_gym.eval``). Both runs must give the same actions: the bench checks it. Each
row prints episodes per hour of both, their ratio, and two bounds: the **render-free** bound
(the same episodes' model time plus their physics alone, timed by replaying their actions on an
env that renders nothing) and the env side's own ratio (env seconds only).

Meta-World runs the ``make demo`` checkpoint (its four tasks; frames resized to the checkpoint's
size). LIBERO-Spatial and robosuite Lift run a stand-in model that reads every pixel it is sent
and sleeps ``--model-ms`` per call (a GPU's time, using no CPU): their venvs have no torch model.
One process, one env: a 2-core machine's figures, not a many-actor evaluation's.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

import envs  # noqa: E402
from agents import run_episode  # noqa: E402
from agents.chunk_queue import ChunkQueueAgent  # noqa: E402
from agents.policy import ModelCost, Prediction  # noqa: E402
from agents.predictor import PolicyPredictor, Predictor  # noqa: E402
from envs.protocol import PIXELS, STATE  # noqa: E402

SUITES = {  # env ids (with kwargs), per episode step limit
    "metaworld": ([("wam_gym/MetaWorld-door-close-v3", {}), ("wam_gym/MetaWorld-window-close-v3", {}),
                   ("wam_gym/MetaWorld-button-press-topdown-v3", {}), ("wam_gym/MetaWorld-drawer-close-v3", {})], 150),
    "libero": ([("wam_gym/LIBERO-Spatial-v0", {"task_id": 0}), ("wam_gym/LIBERO-Spatial-v0", {"task_id": 1})], 96),
    "robosuite": ([("wam_gym/Robosuite-Lift-v0", {})], 96),
}


class StandIn(Predictor):
    """Sleeps ``seconds`` per call (device time) and answers small moves that depend on every pixel."""

    def __init__(self, action_space, seconds: float, horizon: int = 32):
        self.low, self.high, self.seconds = action_space.low, action_space.high, seconds
        self.action_horizon, self.on_wait = horizon, None
        self.cost = ModelCost()

    def predict(self, obs, noise_seeds=None) -> Prediction:
        start = time.perf_counter()
        time.sleep(self.seconds)
        self.cost.add(time.perf_counter() - start, None)
        means = np.stack([np.asarray(obs[PIXELS][c], np.float64).mean(axis=(1, 2, 3)) for c in sorted(obs[PIXELS])], 1)
        phase = means.sum(1) / 255.0 + np.asarray(obs[STATE], np.float64).sum(1)
        wave = np.sin(phase[:, None, None] * (1 + np.arange(self.action_horizon))[None, :, None]
                      + np.arange(len(self.low))[None, None, :])
        return Prediction(((self.low + self.high) / 2 + 0.3 * (self.high - self.low) / 2 * wave).astype(np.float32))


@dataclass
class Timing:
    seconds: float = 0.0  # the episodes' wall time
    env_s: float = 0.0  # of which in env resets and steps
    model_s: float = 0.0  # of which in model calls
    episodes: int = 0

    def per_hour(self, seconds: float | None = None) -> float:
        return 3600.0 * self.episodes / (self.seconds if seconds is None else seconds)


def episode(env_id: str, kwargs: dict, lazy: bool, predictor: Predictor, seed: int, steps: int, replan: int,
            image_size: int, timing: Timing) -> np.ndarray:
    """One episode; its actions (to check that both modes act alike, and to replay)."""
    env = envs.make(env_id, image_size=image_size, lazy_pixels=lazy, **kwargs)
    agent = ChunkQueueAgent(predictor, replan_steps=replan, action_space=env.action_space)
    actions = []
    env.reset(seed=seed)  # the first reset builds the renderer: not an evaluation's steady state
    predictor.begin_episode(seed)  # the same noise in both modes
    start = time.perf_counter()
    result = run_episode(env, agent, seed=seed, max_steps=steps, lazy_pixels=lazy,
                         after_act=lambda obs, action: actions.append(np.array(action)))
    timing.seconds += time.perf_counter() - start
    timing.env_s += result.env_s
    timing.model_s += predictor.cost.model_s or 0.0
    timing.episodes += 1
    env.close()
    return np.stack(actions)


def physics_s(env_id: str, kwargs: dict, seed: int, actions: np.ndarray, image_size: int) -> float:
    """The same episode's env time with nothing rendered after the reset (its actions replayed)."""
    env = envs.make(env_id, image_size=image_size, lazy_pixels=True, **kwargs)
    env.reset(seed=seed)
    start = time.perf_counter()
    env.reset(seed=seed)
    for action in actions:
        env.step(action)
    seconds = time.perf_counter() - start
    env.close()
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), required=True)
    parser.add_argument("--ckpt", help="metaworld: the make demo checkpoint (outputs/demo/train/checkpoint)")
    parser.add_argument("--replan", type=int, nargs="+", default=[8, 16, 32], help="env steps per model call")
    parser.add_argument("--episodes", type=int, default=1, help="episodes per task, replan interval and mode")
    parser.add_argument("--image-size", type=int, default=224, help="pixels per side of each of the two cameras")
    parser.add_argument("--inference-steps", type=int, default=10, help="metaworld: denoising steps per model call")
    parser.add_argument("--model-ms", type=float, default=50.0, help="libero, robosuite: the stand-in's time per call")
    parser.add_argument("--steps", type=int, help="step limit of every episode (default: the suite's row above)")
    parser.add_argument("--tasks", type=int, help="only the first N tasks of the suite")
    args = parser.parse_args(argv)
    tasks, steps = SUITES[args.suite]
    tasks, steps = tasks[: args.tasks], args.steps or steps

    def predictor_for(env_id: str, kwargs: dict) -> Predictor:
        if args.suite != "metaworld":
            space = envs.make(env_id, image_size=32, **kwargs).action_space
            return StandIn(space, args.model_ms / 1000.0)
        from agents.wam import InferenceConfig, WAMPolicy

        if not args.ckpt:
            parser.error("--suite metaworld needs --ckpt (make demo writes outputs/demo/train/checkpoint)")
        return PolicyPredictor(WAMPolicy.from_checkpoint(
            args.ckpt, InferenceConfig.from_knobs(num_inference_steps=args.inference_steps)))

    predictors = {env_id + str(kwargs): predictor_for(env_id, kwargs) for env_id, kwargs in tasks}
    model = (f"the demo WAM, {args.inference_steps} denoising steps" if args.suite == "metaworld"
             else f"a stand-in model of {args.model_ms:g} ms")
    print(f"{args.suite}: {len(tasks)} task(s) x {args.episodes} episode(s) of {steps} steps, two {args.image_size} px "
          f"cameras, {model}")
    print("| replan | every step (ep/h) | needed (ep/h) | ratio | render-free bound (ep/h) | bound ratio | env-side ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for replan in args.replan:
        every, needed, physics = Timing(), Timing(), 0.0
        for env_id, kwargs in tasks:
            predictor = predictors[env_id + str(kwargs)]
            for seed in range(args.episodes):
                a = episode(env_id, kwargs, False, predictor, seed, steps, replan, args.image_size, every)
                b = episode(env_id, kwargs, True, predictor, seed, steps, replan, args.image_size, needed)
                if not np.array_equal(a, b):
                    raise SystemExit(f"{env_id} seed {seed}: render-needed acted differently from render-every-step")
                physics += physics_s(env_id, kwargs, seed, a, args.image_size)
        bound = needed.model_s + physics
        print(f"| {replan} | {every.per_hour():.0f} | {needed.per_hour():.0f} | {needed.per_hour() / every.per_hour():.2f}x "
              f"| {needed.per_hour(bound):.0f} | {every.seconds / bound:.2f}x | {every.env_s / needed.env_s:.2f}x |")


if __name__ == "__main__":
    main()
