"""Rank policies inside the world model, and check the ranking against the simulator.

    python -m wam_gym.world_model --world-model outputs/demo/train/checkpoint \\
        --detector outputs/demo/detector --output outputs/demo/world_model_eval \\
        --policy expert --policy expert+noise=1 --policy random --policy wam=outputs/demo/train/checkpoint

Each policy runs every task's trials twice, with the same seeds and step limits: in the simulator,
and closed loop inside the world model (``wam_gym/WorldModel-v0`` started from the simulator's
reset for that seed: the same first frames, state and instruction), where a success detector
(wam_gym/world_model/success_detector.py) judges the imagined frames. A ``--detector`` folder that holds none
yet gets one first (:func:`train_detector`): it learns from the simulator's labelled frames, as
the world model's VAE draws them, and from the frames the world model imagines when it replays
the same episodes' actions. Then, across policies,
success in the world model against success in the simulator: Pearson and Spearman correlations
with 95% bootstrap intervals (episodes resampled within each policy and task), and the share of
policy pairs the two rank in the same order. ``results.json``, ``scatter.png`` and ``summary.md``
(the table and the figures) go to ``--output``.

Policies (``--policy``, repeat): ``expert`` (Meta-World's scripted expert: it reads the simulator's
privileged state, which the world model takes from the simulator stepped alongside), ``random``,
``wam=CKPT`` (a WAM checkpoint, in this process), ``python=pkg.module:factory`` (your Policy);
``+noise=SIGMA`` adds Gaussian noise to every executed action, in both worlds alike.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wam_gym.utils.cli import fail

CONFIG_FILE = "detector.json"  # wam_gym.world_model.success_detector.CONFIG_FILE (that module imports torch)

os.environ.setdefault("MUJOCO_GL", "egl")

if TYPE_CHECKING:
    from wam_gym.world_model.success_detector import Frames

@dataclass(frozen=True)
class PolicySpec:
    """One ``--policy`` argument: ``kind[=target][+noise=sigma]``."""

    kind: str  # expert | random | wam | python
    target: str | None = None  # wam: a checkpoint; python: pkg.module:factory
    noise: float = 0.0

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        from training.collect import split_noise

        head, sigma = split_noise(text, "--policy")
        kind, _, target = head.partition("=")
        if kind not in ("expert", "random", "wam", "python") or (kind in ("wam", "python")) != bool(target):
            raise ValueError(f"--policy {text!r}: write expert, random, wam=CKPT or python=pkg.module:factory, "
                             "optionally followed by +noise=SIGMA")
        return cls(kind, target or None, sigma)

    @property
    def name(self) -> str:
        base = self.kind if self.target is None else f"{self.kind}={Path(self.target).name}"
        return base + (f"+noise={self.noise:g}" if self.noise else "")


class Agents:
    """Builds each policy's agent; WAM policies load once."""

    def __init__(self, inference_steps: int, shift: float):
        self.inference_steps, self.shift, self._policies = inference_steps, shift, {}

    def make(self, spec: PolicySpec, action_space, seed: int):
        from agents import make_agent

        if spec.kind in ("expert", "random"):
            return make_agent(spec.kind, action_space=action_space, seed=seed)
        return make_agent("wam", policy=self._policy(spec), action_space=action_space)

    def _policy(self, spec: PolicySpec):
        if spec.target not in self._policies:
            if spec.kind == "python":
                from agents.policy import build_policy

                self._policies[spec.target] = build_policy(spec.target, "cpu")
            else:
                from agents.wam import InferenceConfig, WAMPolicy

                self._policies[spec.target] = WAMPolicy.from_checkpoint(
                    spec.target, InferenceConfig.from_knobs(num_inference_steps=self.inference_steps, shift=self.shift))
        return self._policies[spec.target]


def train_detector(world_model: str, tasks: list[str], folder: Path, inference_steps: int, shift: float,
                   episodes: int, train_steps: int = 800, say=print) -> dict:
    """A success detector for ``world_model`` on ``tasks``, written to ``folder``; its held-out metrics."""
    from wam_gym.world_model.env import model_config
    from wam_gym.world_model.success_detector import (
        DetectorConfig,
        Frames,
        as_the_world_model_draws,
        collect,
        evaluate,
        split,
        train,
    )

    model = model_config(world_model)
    config = DetectorConfig(tasks=list(tasks), cameras=list(model.cameras), image_size=list(model.image_size),
                            episodes=episodes, train_steps=train_steps)
    real, replays = collect(config)
    say(f"success detector: {len(real.solved)} simulator frames ({int(real.solved.sum())} solved), {len(replays)} episodes")
    real.pixels = as_the_world_model_draws(real.pixels, world_model)
    imagined = imagine(replays, world_model, inference_steps, shift)
    detector, metrics = train(config, Frames.join([real, imagined]))
    held_out = split(imagined, config.held_out)[1]
    metrics |= {f"imagined_{key}": value for key, value in evaluate(detector, imagined, held_out).items()}
    detector.save(folder, metrics)
    return metrics


def imagine(replays: list, world_model: str, inference_steps: int, shift: float) -> Frames:
    """The frames the world model imagines for each collected episode's actions, labelled by the simulator."""
    from wam_gym.world_model.env import WorldModelEnv
    from wam_gym.world_model.success_detector import Frames

    worlds: dict[str, WorldModelEnv] = {}
    pixels, solved, episodes, groups = [], [], [], []
    for replay in replays:
        if replay.env_id not in worlds:
            worlds[replay.env_id] = WorldModelEnv(checkpoint=world_model, start_from=replay.env_id,
                                                  num_inference_steps=inference_steps, shift=shift)
        world = worlds[replay.env_id]
        world.reset(seed=replay.seed)
        for i, action in enumerate(replay.actions):
            frames = world.step(action)[4].get("imagined_frames")
            if frames is None:
                continue
            first = i + 1 - world.steps_per_call  # the step the imagination started from
            for k, frame in enumerate(frames, start=1):  # frame k: k * frame_stride steps later
                pixels.append(frame)
                solved.append(bool(replay.solved[first + k * world.frame_stride - 1]))
                episodes.append(replay.episode)
                groups.append(replay.group)
    for world in worlds.values():
        world.close()
    return Frames(np.stack(pixels), np.array(solved), np.array(episodes), np.array(groups))


def run_episode_in(env, spec: PolicySpec, agents: Agents, seed: int, steps: int, lazy: bool) -> bool:
    from agents import run_episode
    from training.collect import NoisyActions

    stepped = NoisyActions(env, spec.noise) if spec.noise else env
    agent = agents.make(spec, env.action_space, seed)
    return run_episode(stepped, agent, seed=seed, max_steps=steps, lazy_pixels=lazy).success


def evaluate(specs: list[PolicySpec], tasks: list[str], trials: int, steps: int, world_model: str, detector: str,
             inference_steps: int, shift: float, say=print) -> dict:
    """{policy name: {"simulator": {task: [bool per trial]}, "world_model": {...}}}."""
    import envs
    from wam_gym.world_model.env import WorldModelEnv, model_config

    model = model_config(world_model)
    agents = Agents(inference_steps, shift)
    outcomes: dict[str, dict[str, dict[str, list[bool]]]] = {}
    for spec in specs:
        runs = outcomes[spec.name] = {"simulator": {}, "world_model": {}}
        for task in tasks:
            real = envs.make(task, cameras=list(model.cameras), image_size=tuple(model.image_size), lazy_pixels=True)
            imagined = WorldModelEnv(checkpoint=world_model, start_from=task, success_detector=detector,
                                     privileged_from_simulator=spec.kind == "expert",
                                     num_inference_steps=inference_steps, shift=shift)
            seeds = range(trials)
            runs["simulator"][task] = [run_episode_in(real, spec, agents, s, steps, lazy=True) for s in seeds]
            runs["world_model"][task] = [run_episode_in(imagined, spec, agents, s, steps, lazy=False) for s in seeds]
            real.close()
            imagined.close()
            say(f"{spec.name:32s} {task.split('/')[-1]:36s} simulator {sum(runs['simulator'][task])}/{trials}  "
                f"world model {sum(runs['world_model'][task])}/{trials}")
    return outcomes


# ----------------------------------------------------------------- agreement
def rates(outcomes: dict, world: str) -> np.ndarray:
    """Each policy's success rate in ``world``, over all its episodes."""
    return np.array([np.mean([s for trials in runs[world].values() for s in trials]) for runs in outcomes.values()])


def pairwise_agreement(x: np.ndarray, y: np.ndarray) -> float:
    """The share of policy pairs ordered alike by ``x`` and ``y`` (a tie in either counts half)."""
    agree = []
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            a, b = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            agree.append(0.5 if a == 0 or b == 0 else float(a == b))
    return float(np.mean(agree))


def agreement(outcomes: dict, resamples: int = 2000, seed: int = 0) -> dict:
    """Correlations of world-model and simulator success across policies, with bootstrap intervals
    (None where one side has no spread: every policy equally good there)."""
    sim, wm = rates(outcomes, "simulator"), rates(outcomes, "world_model")
    point = _statistics(sim, wm)
    rng, draws = np.random.default_rng(seed), {k: [] for k in point}
    for _ in range(resamples):
        for key, value in _statistics(_resampled(outcomes, "simulator", rng), _resampled(outcomes, "world_model", rng)).items():
            if value is not None:
                draws[key].append(value)
    return {key: {"value": point[key], "interval_95": [float(np.percentile(draws[key], q)) for q in (2.5, 97.5)]
                  if draws[key] else None} for key in point} | {"policies": len(sim), "resamples": resamples}


def _statistics(sim: np.ndarray, wm: np.ndarray) -> dict[str, float | None]:
    from scipy import stats

    spread = np.ptp(sim) > 0 and np.ptp(wm) > 0  # a correlation needs spread on both sides
    return {"pearson": float(stats.pearsonr(sim, wm).statistic) if spread else None,
            "spearman": float(stats.spearmanr(sim, wm).statistic) if spread else None,
            "pairwise_agreement": pairwise_agreement(sim, wm)}


def _resampled(outcomes: dict, world: str, rng: np.random.Generator) -> np.ndarray:
    out = []
    for runs in outcomes.values():
        episodes = [np.asarray(trials, float) for trials in runs[world].values()]
        out.append(np.mean(np.concatenate([rng.choice(e, len(e)) for e in episodes])))
    return np.array(out)


def scatter(outcomes: dict, summary: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim, wm = rates(outcomes, "simulator"), rates(outcomes, "world_model")
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="0.8", lw=1)
    ax.errorbar(sim, wm, xerr=_wilson_bars(outcomes, "simulator", sim), yerr=_wilson_bars(outcomes, "world_model", wm),
                fmt="o", ms=6, elinewidth=0.8, ecolor="0.6", capsize=2)
    for i, (name, x, y) in enumerate(zip(outcomes, sim, wm)):  # labels alternate above and below: neighbours stay legible
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4 if i % 2 == 0 else -11), fontsize=7)
    ax.set(xlabel="success in the simulator", ylabel="success in the world model", xlim=(-0.05, 1.05), ylim=(-0.05, 1.05),
           title=f"Spearman {_shown(summary['spearman']['value'])}, Pearson {_shown(summary['pearson']['value'])}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _wilson_bars(outcomes: dict, world: str, centre: np.ndarray) -> np.ndarray:
    """(2, policies): each rate's distance to its 95% Wilson interval, all tasks' episodes pooled."""
    from wam_gym.utils.stats import wilson

    bounds = []
    for runs in outcomes.values():
        episodes = [ok for trials in runs[world].values() for ok in trials]
        bounds.append(wilson(sum(episodes), len(episodes)))
    low, high = np.array(bounds).T
    return np.stack([centre - low, high - centre]).clip(0)


def _shown(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.2f}"


def table(outcomes: dict) -> str:
    rows = ["| policy | simulator | world model |", "|---|---:|---:|"]
    for name, sim, wm in zip(outcomes, rates(outcomes, "simulator"), rates(outcomes, "world_model")):
        rows.append(f"| {name} | {sim:.2f} | {wm:.2f} |")
    return "\n".join(rows)


# Upper bounds: beyond them a value is a typo (a million trials of 150 steps is weeks of simulation).
COUNTS = {"trials": (1, 10_000), "steps": (1, 100_000), "inference_steps": (1, 1000), "detector_episodes": (2, 10_000)}
RESULT_FILES = ("results.json", "scatter.png", "summary.md")


def check_args(args: argparse.Namespace) -> tuple[list[PolicySpec], list[str]]:
    """Every argument checked before any episode runs or model loads: (the policies, the tasks)."""
    for name, (low, high) in COUNTS.items():
        value = getattr(args, name)
        if not low <= value <= high:
            why = " (whole episodes are held out to measure the detector)" if name == "detector_episodes" else ""
            raise ValueError(f"--{name.replace('_', '-')} {value}: give an integer in [{low}, {high}]{why}")
    if not (math.isfinite(args.shift) and args.shift > 0):
        raise ValueError(f"--shift {args.shift}: give a finite number > 0 (the demo's is 3.0)")
    for flag in ("world_model", "detector", "output"):
        if not getattr(args, flag).strip():  # '' is the working directory: results and a detector written there
            raise ValueError(f"--{flag.replace('_', '-')} '': give a path")
    specs = [PolicySpec.parse(p) for p in args.policy]
    if len({s.name for s in specs}) < 2:
        raise ValueError("--policy: give two or more different policies (a correlation ranks them)")
    check_checkpoint(args.world_model, "--world-model")
    for spec in specs:
        if spec.kind == "wam":
            check_checkpoint(spec.target, f"--policy wam={spec.target}")
        elif spec.kind == "python":
            _check_factory(spec.target)
    _check_folders(Path(args.detector), Path(args.output), args.overwrite)
    return specs, check_tasks(args.tasks)


def check_checkpoint(path: str, flag: str) -> None:
    from wam_gym.eval.preflight import CONFIG_FILE

    if not (Path(path).expanduser() / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{flag}: {path} is not a WAM checkpoint directory (no {CONFIG_FILE}); pass the "
                                "directory python -m training saved (e.g. outputs/demo/train/checkpoint)")


def _check_factory(target: str) -> None:
    """``python=pkg.module:factory`` names an importable callable (else it fails after the detector is trained)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--policy python={target}: write it as python=pkg.module:factory")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as exc:
        raise ValueError(f"--policy python={target}: cannot import {module_name} ({exc}); install it or put its "
                         "folder on PYTHONPATH") from None
    if not callable(getattr(module, attr, None)):
        raise ValueError(f"--policy python={target}: {module_name} has no callable {attr!r}; name a "
                         "factory(device) that returns a Policy (agents/policy.py)")


def _check_folders(detector: Path, output: Path, overwrite: bool) -> None:
    from wam_gym.utils.run_dir import read_record

    if detector.exists() and not detector.is_dir():
        raise ValueError(f"--detector {detector} is a file: pass a folder (a trained detector's, or a new one to "
                         "train it in)")
    if (detector / CONFIG_FILE).exists():
        read_record(detector / CONFIG_FILE, "train a new detector: pass a new --detector folder")
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file: pass a folder for {', '.join(RESULT_FILES)}")
    written = [name for name in RESULT_FILES if (output / name).exists()]
    if written and not overwrite:
        raise ValueError(f"--output {output} already holds {', '.join(written)}: pass a new --output, or --overwrite "
                         "to replace them")


def check_tasks(tasks: list[str] | None) -> list[str]:
    """The env ids (default: the demo's four), each registered and its simulator installed."""
    from envs.errors import MissingSimulatorError
    from envs.registry import suite_of
    from wam_gym.eval.tasks import TASK_SETS

    tasks = tasks or list(TASK_SETS["metaworld_demo"])
    for task in tasks:
        suite = suite_of(task)  # an unknown id: its error names the near ones
        if not suite.installed():
            raise MissingSimulatorError(f"--task {task}: {suite.title} is not installed; {suite.install}")
    return tasks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wam_gym.world_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-model", required=True, help="a WAM checkpoint (its video prediction is the world)")
    parser.add_argument("--detector", required=True, help="a success detector folder; trained there first if it holds none")
    parser.add_argument("--detector-episodes", type=int, default=8, help="a new detector's episodes per task and behaviour")
    parser.add_argument("--policy", action="append", required=True, help="expert | random | wam=CKPT | "
                        "python=pkg.module:factory, optionally +noise=SIGMA (repeat; two or more)")
    parser.add_argument("--task", action="append", dest="tasks", help="env id (repeat); default: the demo's four")
    parser.add_argument("--trials", type=int, default=5, help="episodes per task and policy, seeds 0..n-1")
    parser.add_argument("--steps", type=int, default=150, help="step limit of every episode, in both worlds")
    parser.add_argument("--inference-steps", type=int, default=10, help="denoising steps of every model call")
    parser.add_argument("--shift", type=float, default=3.0, help="flow shift of every model call (the demo's)")
    parser.add_argument("--output", required=True, help=f"a folder for {', '.join(RESULT_FILES)}")
    parser.add_argument("--overwrite", action="store_true", help="replace the results an earlier run left in --output")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        specs, tasks = check_args(args)
        run(args, specs, tasks)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        fail(exc)


def run(args: argparse.Namespace, specs: list[PolicySpec], tasks: list[str]) -> None:
    """Train the detector where there is none, run every policy in both worlds, write the results."""
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if not (Path(args.detector) / CONFIG_FILE).is_file():
        train_detector(args.world_model, tasks, Path(args.detector), args.inference_steps, args.shift,
                       args.detector_episodes)
    outcomes = evaluate(specs, tasks, args.trials, args.steps, args.world_model, args.detector,
                        args.inference_steps, args.shift)
    summary = agreement(outcomes)
    detector = json.loads((Path(args.detector) / CONFIG_FILE).read_text())["metrics"]
    result = {"agreement": summary, "detector": detector, "outcomes": outcomes,
              "settings": {"trials": args.trials, "steps": args.steps, "inference_steps": args.inference_steps,
                           "shift": args.shift, "world_model": args.world_model, "tasks": tasks}}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    scatter(outcomes, summary, out / "scatter.png")
    lines = [table(outcomes), ""]
    for key in ("spearman", "pearson", "pairwise_agreement"):
        interval = summary[key]["interval_95"]
        shown = "" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]"
        lines.append(f"- {key}: {_shown(summary[key]['value'])}{shown}")
    lines.append(f"- success detector, held-out episodes: balanced accuracy {detector['held_out_balanced_accuracy']:.3f} "
                 f"(on imagined frames {detector.get('imagined_held_out_balanced_accuracy', float('nan')):.3f})")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written to {out}: {', '.join(RESULT_FILES)}")

