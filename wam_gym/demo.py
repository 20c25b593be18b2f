"""The embedded default, end to end on a CPU: ``python -m wam_gym.demo`` (what ``make demo`` runs).

    1. collect   scripted-expert demos of the demo tasks        python -m training.collect --action-noise
    2. fit_vae   a small VAE fitted to the demos' clips          python -m training.fit_vae
    3. cache     VAE latents + text features of every clip      python scripts/video_cache.py
    4. train     the tiny MoT WAM from the cache                python -m training task=demo +infra=cache
    5. evaluate  WAM, scripted expert and random agent,         python -m wam_gym.eval
                 closed loop through the broker, vector of env actors, videos with predicted frames,
                 the imagination score (predicted vs rendered frames, and the copy-frame baseline)
    6. report    report.md / report.json: success per task, side by side

``--world-model`` (``make demo-world-model``) then asks whether the world model can rank policies
without the simulator (docs/world-model.md), under ``<output>/world_model/``:

    7. wm_collect   the demo tasks under several behaviours, failures included   python -m training.collect --agent ...
    8. wm_cache     their latents, with the demo's VAE                              python scripts/video_cache.py
    9. wm_train     a world model: actions given clean, video and state learnt      python -m training world_model_prob=1
   10. wm_eval      seven policies in the simulator and in the world model          python -m wam_gym.world_model

Each stage is the real command a user would type (printed, logged to <output>/logs/); a
stage whose outputs exist is skipped (an evaluation only when its results.json says complete),
so a rerun resumes. ``--quick`` shrinks everything to
a smoke test. For a GPU run at real scale see docs/train.md ("At real scale").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from wam_gym.eval.preflight import CONFIG_FILE
from wam_gym.eval.run_files import read_results
from wam_gym.eval.tasks import TASK_SETS

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class WorldModelDemoConfig:
    """The world model as a policy evaluator (``--world-model``): its data, its training, the policies it ranks."""

    # its data (training.collect --agent, each on every task): it learns what actions lead to, failures too.
    # The demo's own demos are all successes; a world model that saw only those imagines success whatever it is shown
    behaviours: list[str] = field(default_factory=lambda: ["expert", "expert+noise=1", "expert+noise=2", "random"])
    episodes: int = 12  # per task and behaviour
    seed: int = 100  # first seed of its data (the demos use 0.., world_model_eval's trials 0..trials-1)
    train_steps: int = 1500  # optimizer steps
    # world_model_eval --policy; "{wam}" is the demo's WAM checkpoint. Noise levels other than the data's
    policies: list[str] = field(default_factory=lambda: [
        "expert", "expert+noise=1.5", "expert+noise=3", "random", "wam={wam}", "wam={wam}+noise=0.5", "wam={wam}+noise=1"])
    trials: int = 5  # episodes per task and policy, in each world
    detector_episodes: int = 8  # the success detector's episodes per task and behaviour (2 or more: some are held out)


@dataclass
class DemoConfig:
    output: str = "outputs/demo"  # every stage writes under here; a rerun skips finished stages
    tasks: list[str] = field(default_factory=lambda: list(TASK_SETS["metaworld_demo"]))  # env ids
    episodes: int = 12  # expert demos per task
    demo_max_steps: int | None = None  # a demo's step limit; null: the env's (the expert's demos end on success)
    # executed-action noise of the demos, recorded clean (training.collect --action-noise, DART): the
    # policy sees the way back from where it drifts. In the experiment 0.5 took button-press-topdown from
    # 4 to 7 successes in 10; the fresh-clone demos reached 3 in 10 (BENCHMARKS.md's git history)
    action_noise: float = 0.5
    image_size: int = 48  # pixels, square, for demos, training and evaluation
    cameras: tuple[str, ...] = ("corner", "gripperPOV")  # for demos, training and evaluation (every agent: runs pair)
    vae_steps: int = 800  # optimizer steps of the VAE fit (python -m training.fit_vae, its default geometry)
    # optimizer steps of the tiny WAM: 2000 take the time 1500 took with gradient checkpointing (now off, see
    # _train_overrides). Over 3 training seeds x 120 episodes: 72.5% -> 75.6% at replan 32, 81.1% -> 85.0% at 8
    train_steps: int = 2000
    batch_size: int = 32  # clips per training step
    trials: int = 10  # evaluation episodes per task and agent
    eval_seed: int = 1000  # demos use seeds 0.., evaluation unseen ones
    max_episode_steps: int = 150  # evaluation (and the world model's behaviours) stop here
    # actions executed from each predicted chunk (null: the whole chunk, task=demo's model.action_horizon, 32).
    # Closing the loop every 8 steps took success from 72.5% to 81.1% (3 training seeds x 120 episodes, same
    # checkpoints; 16 gave 71.9%); the imagination is then scored on the first predicted frame, 8 steps ahead
    # (the frames' stride is the model's, action_horizon // frames)
    replan_steps: int | None = 8
    # env steps between the frames of the VAE's training clips. Its causal convolutions learn from
    # neighbouring frames, and closer ones fit faster: on the demo's clips 800 steps reach 25.2 dB at 4, 24.2 at 8
    vae_frame_stride: int = 4
    inference_steps: int = 10  # denoising steps per model call
    shift: float = 3.0  # flow-matching timestep shift of the sampler
    actors: int = 2  # rollout actors per model worker
    world_model: WorldModelDemoConfig = field(default_factory=WorldModelDemoConfig)  # --world-model's stages

    @classmethod
    def quick(cls, output: str) -> DemoConfig:
        world_model = WorldModelDemoConfig(behaviours=["expert", "random"], episodes=1, train_steps=4,
                                           policies=["expert", "random", "wam={wam}"], trials=1, detector_episodes=2)
        return cls(output=output, tasks=cls().tasks[:2], episodes=2, demo_max_steps=12, image_size=32, vae_steps=2, train_steps=4,
                   batch_size=4, trials=1, max_episode_steps=12, inference_steps=2, actors=1, world_model=world_model)


class Demo:
    def __init__(self, config: DemoConfig):
        self.config = config
        self.out = Path(config.output).resolve()
        self.checkpoint = self.out / "train" / "checkpoint"  # the trained WAM, which eval_wam evaluates
        self.logs = self.out / "logs"
        self.timings: dict[str, float] = {}

    # ----------------------------------------------------------------- stages
    def run(self) -> dict:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.collect()
        self.fit_vae()
        self.cache()
        self.train()
        for agent in ("wam", "expert", "random"):
            self.evaluate(agent)
        return self.report()

    def run_world_model(self) -> dict:
        """The demo, then stages 7-10: a world model that saw failures, and how it ranks policies."""
        self.run()
        w, wm = self.config.world_model, self.out / "world_model"
        cache = {"WAM_LATENT_CACHE": str(wm / "cache")}
        collect = self._collect_command(wm / "data", w.episodes, w.seed, w.behaviours)
        self._stage("wm_collect", collect + ["--max-steps", str(self.config.max_episode_steps)],
                    wm / "data" / "meta" / "info.json")
        overrides = self._world_model_overrides()
        self._stage("wm_cache", [sys.executable, "scripts/video_cache.py", *overrides, "video_latent_cache=generate"],
                    wm / "cache" / "cache_meta.json", env=cache)
        self._stage("wm_train", [sys.executable, "-m", "training", *overrides], wm / "train" / "checkpoint" / CONFIG_FILE,
                    env=cache)
        self._stage("wm_eval", self._world_model_eval_command(), wm / "eval" / "summary.md")
        print((wm / "eval" / "summary.md").read_text())
        return json.loads((wm / "eval" / "results.json").read_text())

    def _world_model_eval_command(self) -> list[str]:
        """world_model_eval on the demo's tasks, step limit and sampler, with the demo's WAM as ``{wam}``."""
        c, wm = self.config, self.out / "world_model"
        command = [sys.executable, "-m", "wam_gym.world_model", "--world-model", str(wm / "train" / "checkpoint"),
                   "--detector", str(wm / "detector"), "--output", str(wm / "eval"), "--trials", str(c.world_model.trials),
                   "--steps", str(c.max_episode_steps), "--detector-episodes", str(c.world_model.detector_episodes),
                   "--inference-steps", str(c.inference_steps), "--shift", str(c.shift),
                   "--overwrite"]  # a stage not finished yet: what it left is the demo's own, redone
        for task in c.tasks:
            command += ["--task", task]
        for policy in c.world_model.policies:
            command += ["--policy", policy.format(wam=self.checkpoint)]
        return command

    def _stage(self, name: str, command: list[str], done: Path, env: dict | None = None) -> None:
        if _finished(done):
            print(f"[demo] {name}: done already ({done})")
            return
        print(f"[demo] {name}: {shlex.join(command)}", flush=True)
        start = time.perf_counter()
        log = self.logs / f"{name}.log"
        with open(log, "wb") as handle:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                                       env={**os.environ, **(env or {})})
            returncode = _follow(process, handle, Progress(name))
        self.timings[name] = round(time.perf_counter() - start, 1)
        if returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").replace("\r", "\n").splitlines()[-15:])
            sys.exit(f"[demo] {name} failed (exit {returncode}); log: {log}\n{tail}")
        print(f"[demo] {name}: {self.timings[name]:.0f} s", flush=True)

    def collect(self) -> None:
        command = self._collect_command(self.out / "data", self.config.episodes, 0, ["expert"])
        command += ["--action-noise", str(self.config.action_noise)]
        if self.config.demo_max_steps is not None:
            command += ["--max-steps", str(self.config.demo_max_steps)]
        self._stage("collect", command, self.out / "data" / "meta" / "info.json")

    def _collect_command(self, output: Path, episodes: int, seed: int, behaviours: list[str]) -> list[str]:
        c = self.config
        command = [sys.executable, "-m", "training.collect", "--episodes", str(episodes), "--output", str(output),
                   "--image-size", str(c.image_size), "--overwrite", "--seed", str(seed), "--cameras", *c.cameras]
        for behaviour in behaviours:
            command += ["--agent", behaviour]
        for task in c.tasks:
            command += ["--env", task]
        return command

    def fit_vae(self) -> None:
        c = self.config
        command = [sys.executable, "-m", "training.fit_vae", f"dataset.root={self.out / 'data'}",
                   f"output_dir={self.out / 'vae'}", f"dataset.image_size=[{c.image_size},{c.image_size}]",
                   f"dataset.frame_stride={c.vae_frame_stride}",
                   f"steps={c.vae_steps}", f"log_every={max(1, c.vae_steps // 4)}"]
        self._stage("fit_vae", command, self.out / "vae" / "fit_vae.json")

    def _train_overrides(self) -> list[str]:
        c = self.config
        return [
            "task=demo", f"dataset.root={self.out / 'data'}", f"output_dir={self.out / 'train'}",
            f"model.vae_path={self.out / 'vae'}",
            f"model.image_size=[{c.image_size},{c.image_size}]", f"max_steps={c.train_steps}",
            f"batch_size={c.batch_size}", "+infra=cache", "infra.compile.enabled=false",
            # memory is not what limits a CPU run: recomputing each layer in backward cost 23% of a step, for
            # bit-identical weights
            "model.backbone.use_gradient_checkpointing=false",
            f"save_every={max(1, c.train_steps // 3)}", f"warmup_steps={min(100, c.train_steps // 10)}",
        ]

    def _world_model_overrides(self) -> list[str]:
        """The demo's training, on the world model's data, with every row's actions given clean and a state head."""
        wm, steps = self.out / "world_model", self.config.world_model.train_steps
        replaced = {"dataset.root": wm / "data", "output_dir": wm / "train", "max_steps": steps,
                    "save_every": max(1, steps // 3), "warmup_steps": min(100, steps // 10)}
        kept = [o for o in self._train_overrides() if o.split("=")[0] not in replaced]
        return kept + [f"{k}={v}" for k, v in replaced.items()] + [
            "world_model_prob=1.0", "model.action_expert.predict_state=true"]

    def cache(self) -> None:
        command = [sys.executable, "scripts/video_cache.py", *self._train_overrides(), "video_latent_cache=generate"]
        cache = self.out / "cache"
        self._stage("cache", command, cache / "cache_meta.json", env={"WAM_LATENT_CACHE": str(cache)})

    def train(self) -> None:
        command = [sys.executable, "-m", "training", *self._train_overrides()]
        self._stage("train", command, self.checkpoint / CONFIG_FILE,
                    env={"WAM_LATENT_CACHE": str(self.out / "cache")})

    def evaluate(self, agent: str) -> None:
        c = self.config
        out = self.out / "eval" / agent
        tasks = ",".join(c.tasks)
        command = [
            sys.executable, "-m", "wam_gym.eval", f"EVALUATION.agent={agent}", f"MULTIRUN.task_sets=[{tasks}]",
            f"EVALUATION.num_trials={c.trials}", f"EVALUATION.seed={c.eval_seed}",
            f"EVALUATION.max_episode_steps={c.max_episode_steps}", f"EVALUATION.output_dir={out}",
            f"MULTIRUN.env_num_per_worker={c.actors}", "MULTIRUN.inference_batch_wait_ms=20",
        ]
        if agent == "wam":
            command += [
                f"ckpt={self.checkpoint}", f"EVALUATION.replan_steps={c.replan_steps or 'null'}",
                f"EVALUATION.num_inference_steps={c.inference_steps}", f"EVALUATION.shift={c.shift}",
                "EVALUATION.eval_save_video=true", "EVALUATION.visualize_future_video=true",
                # the expected future, which PSNR and SSIM score fairly (a sample is one of many possible futures)
                "EVALUATION.future_video=expected",
                f"MULTIRUN.inference_batch_size={c.actors}",
            ]
        else:  # the envs the WAM is evaluated in (its checkpoint's cameras and size), so every run pairs with its
            command += [f"+env_kwargs.image_size=[{c.image_size},{c.image_size}]",
                        f"+env_kwargs.cameras=[{','.join(c.cameras)}]"]
        self._stage(f"eval_{agent}", command, out / "results.json")

    # ----------------------------------------------------------------- report
    def report(self) -> dict:
        """report.json and report.md from the stages' outputs (:class:`wam_gym.demo_report.DemoReport`)."""
        from wam_gym.demo_report import DemoReport

        return DemoReport(self.config, self.out, self.checkpoint, self.timings).write()

class Progress:
    """One live console line per stage: the newest progress text the stage's command printed (its
    tqdm bar with count, rate and ETA, or its last log line). On a terminal the line is redrawn in
    place; in a log (CI, a pipe) a line is printed at most every ``every_s`` seconds."""

    def __init__(self, stage: str, every_s: float = 30.0):
        self.stage, self.every_s = stage, every_s
        self.tty = sys.stdout.isatty()
        self.last_print = time.perf_counter()
        self.start = self.last_print
        self.latest = ""

    def update(self, text: str) -> None:
        text = " ".join(text.split())
        if not text or text.startswith("[W"):  # skip empty redraws and C++ warnings
            return
        self.latest = text
        now = time.perf_counter()
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            line = f"[demo] {self.stage} {now - self.start:4.0f}s | {text}"
            print("\r" + line[:width].ljust(width), end="", flush=True)
        elif now - self.last_print >= self.every_s:
            print(f"[demo] {self.stage} {now - self.start:.0f}s | {text}", flush=True)
            self.last_print = now

    def close(self) -> None:
        if self.tty and self.latest:
            print("\r" + " " * (shutil.get_terminal_size().columns - 1) + "\r", end="", flush=True)


def _follow(process: subprocess.Popen, log, progress: Progress) -> int:
    """Copy the process's output to ``log`` as it comes and feed its newest line (tqdm redraws
    end in a carriage return) to ``progress``; returns the exit status."""
    pending = b""
    try:
        while chunk := process.stdout.read1(65536):
            log.write(chunk)
            log.flush()
            pending += chunk
            *lines, pending = re.split(rb"[\r\n]", pending)
            for line in lines:
                progress.update(line.decode(errors="replace"))
        return process.wait()
    finally:
        progress.close()


def _finished(done: Path) -> bool:
    """A stage is done when its last output exists; an evaluation's results.json also says whether
    every episode ran (a run that stopped on an error writes one with complete: false)."""
    if not done.is_file():
        return False
    if done.name != "results.json":
        return True
    try:
        return read_results(done).get("complete") is True
    except ValueError:  # unreadable, or a field of another type: the stage runs again (its episodes are kept)
        return False


# What each number flag takes; beyond the upper bound a value is a typo (the full demo uses 800, 2000, 12, 10, 8, 0.5).
FLAG_RANGES = {"vae_steps": (1, 1_000_000), "train_steps": (1, 1_000_000), "episodes": (1, 10_000),
               "trials": (1, 10_000), "replan_steps": (0, 32), "action_noise": (0.0, 10.0)}


def check_args(args: argparse.Namespace) -> None:
    """Every flag checked before the first stage starts (a bad one used to surface stages, minutes, later)."""
    for name, (low, high) in FLAG_RANGES.items():
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            what = "a number" if isinstance(low, float) else "an integer"
            note = " (0: the whole chunk)" if name == "replan_steps" else ""
            raise ValueError(f"--{name.replace('_', '-')} {value}: give {what} in [{low}, {high}]{note}")
    output = Path(args.output)
    if not args.output.strip():
        raise ValueError("--output '': give a folder for the demo's outputs (default outputs/demo)")
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file: give a folder for the demo's outputs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wam_gym.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="outputs/demo")
    parser.add_argument("--quick", action="store_true", help="a seconds-to-minutes smoke run of every stage")
    parser.add_argument("--vae-steps", type=int)
    parser.add_argument("--train-steps", type=int)
    parser.add_argument("--episodes", type=int)
    parser.add_argument("--trials", type=int)
    parser.add_argument("--replan-steps", type=int, help="actions executed per chunk (default 8; 0: the whole chunk, 32)")
    parser.add_argument("--action-noise", type=float, help="executed-action noise of the demos (default 0.5)")
    parser.add_argument("--world-model", action="store_true",
                        help="then train a world model on several behaviours and rank policies in it (stages 7-10)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    config = DemoConfig.quick(args.output) if args.quick else DemoConfig(output=args.output)
    for name in ("vae_steps", "train_steps", "episodes", "trials", "replan_steps", "action_noise"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    os.environ.setdefault("MUJOCO_GL", "egl")
    demo = Demo(config)
    if args.world_model:
        demo.run_world_model()
    else:
        demo.run()


if __name__ == "__main__":
    main()
