"""Collect demonstrations into a LeRobot v3.0 dataset.

    python -m training.collect --env wam_gym/MetaWorld-reach-v3 [--env ...] --episodes 20 \\
        --agent expert|random[+noise=SIGMA] [--agent ...] --output DIR [--image-size 64] \\
        [--cameras corner gripperPOV] [--seed 0] [--only-success] [--max-steps N] [--action-noise 0.3] [--overwrite]
    python -m training.collect --stats-only DIR      # recompute DIR/meta/stats.json

Every step is recorded: the observation before the action, the action taken, the
instruction as the task. Each env runs episodes with seeds ``seed, seed + 1, ...``, once per
``--agent`` (the same seeds for each, so the same scenes meet every behaviour);
``--only-success`` keeps successful episodes only, trying new seeds up to 3x the count. Frames
are recorded upright, as the envs render them, and the dataset names the benchmark suites it was
collected in (a model trained on one records it).

Two kinds of noise, for two uses:

- ``--action-noise SIGMA`` executes the agent's action plus Gaussian noise but records the
  clean action (DART, Laskey et al. 2017): the demos visit the states a slightly-off policy
  reaches and show the way back, and the frames show the world answering varied actions.
- ``--agent expert+noise=SIGMA`` is a noisier behaviour: the noise is part of its actions and
  recorded with them. A world model learns what actions lead to, failures included, from a
  dataset of several such behaviours (``--agent expert --agent expert+noise=3 --agent random``).
  It draws the noise ``wam_gym.world_model.evaluate``'s ``--policy expert+noise=SIGMA`` draws.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from agents import Agent, check_agent_fits_env, make_agent, run_episode
from envs.contract import parse_image_size
from envs.errors import MissingAssetsError, MissingSimulatorError, UnknownEnvError
from envs.protocol import INSTRUCTION, PIXELS, STATE
from training.data.lerobot import DatasetWriter, compute_stats
from training.datasets import add_layout_arguments, layout_of
from wam_gym.utils.publish import check_destination

AGENTS = ("expert", "random")  # the agents that need no checkpoint
DEFAULT_FPS = 20
RETRY_FACTOR = 3
# Feature names for suites whose state/action layout is known.
_NAMES = {
    "metaworld": (["hand_x", "hand_y", "hand_z", "gripper"], ["dx", "dy", "dz", "gripper"]),
}


def _env_kwargs(image_size: tuple[int, int], cameras: Sequence[str] | None, max_steps: int | None) -> dict[str, Any]:
    """gymnasium.make kwargs: only what was asked for, so the env's defaults hold for the rest."""
    kwargs: dict[str, Any] = {"image_size": image_size}
    if cameras:
        kwargs["cameras"] = tuple(cameras)
    if max_steps is not None:
        kwargs["max_episode_steps"] = int(max_steps)
    return kwargs


def split_noise(text: str, flag: str = "--agent") -> tuple[str, float]:
    """``"name+noise=SIGMA"`` -> ``("name", SIGMA)``; ``"name"`` -> ``("name", 0.0)``. Errors name ``flag``."""
    head, _, noise = text.partition("+noise=")
    try:
        sigma = float(noise) if noise else 0.0
    except ValueError:
        raise ValueError(f"{flag} {text!r}: +noise= takes a number (a standard deviation in action units)") from None
    if not sigma >= 0:
        raise ValueError(f"{flag} {text!r}: +noise= must be >= 0 (a standard deviation in action units)")
    return head, sigma


def perturbed(action: np.ndarray, rng: np.random.Generator, sigma: float, space: gymnasium.spaces.Box) -> np.ndarray:
    """``action + N(0, sigma^2)``, clipped to ``space``: the one noise rule of noisy behaviours."""
    noisy = action + rng.normal(0.0, sigma, size=np.shape(action))
    return np.clip(noisy, space.low, space.high).astype(space.dtype)


def collect(
    envs: Sequence[str],
    episodes: int,
    output: str | Path,
    agent: str | Sequence[str] = "expert",
    image_size: int | Sequence[int] = 64,
    cameras: Sequence[str] | None = None,
    seed: int = 0,
    only_success: bool = False,
    max_steps: int | None = None,
    action_noise: float = 0.0,
    overwrite: bool = False,
    layout: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Run each ``agent`` (``expert``/``random``, optionally ``+noise=SIGMA``) in each env and
    write every kept episode to a dataset at ``output``.

    Returns ``{"output", "fps", "cameras", "episodes", "frames", "dropped", "runs": [{"env", "agent",
    "episodes", "attempts", "successes", "success_rate", "dropped", "frames", "seeds"}]}``, a run
    per env and agent; ``success_rate`` is over all attempted episodes.
    """
    say = log or (lambda _msg: None)
    env_ids, behaviours, size, output = _plan(envs, episodes, agent, action_noise, image_size, output, overwrite)
    opener = _WriterOpener(output, env_ids, overwrite, layout)
    counter = _Counter(len(env_ids) * len(behaviours) * episodes, say)
    episode_args = (episodes, seed, only_success, counter)
    try:
        runs = []
        for env_id in env_ids:
            runs += _run(env_id, behaviours, opener, _env_kwargs(size, cameras, max_steps), action_noise, *episode_args)
        summary = _write(opener.writer, output, runs)
    except BaseException:
        if opener.writer is not None:
            opener.writer.__exit__(*sys.exc_info())  # keeps complete files of saved episodes, drops the rest
        raise
    say(format_summary(summary, only_success))
    return summary


def _plan(envs, episodes: int, agent, action_noise: float, image_size, output, overwrite: bool):
    """Check everything asked for before any simulator starts: returns the env ids, the behaviours,
    the image size and the output path."""
    if isinstance(envs, str):
        envs = [envs]
    if not envs:
        raise ValueError("no envs to collect from")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not action_noise >= 0:
        raise ValueError(f"action_noise must be >= 0 (a standard deviation in action units), got {action_noise}")
    behaviours = [agent] if isinstance(agent, str) else list(agent)
    if not behaviours:
        raise ValueError("no agent to collect with")
    parsed = [split_noise(b) for b in behaviours]
    if action_noise and any(sigma for _, sigma in parsed):
        raise ValueError("--action-noise (recorded clean) and an agent's +noise= (recorded) together: choose one")
    for name, _ in parsed:
        if name not in AGENTS:
            raise ValueError(f"--agent: unknown agent {name!r}; choose one of {AGENTS}, optionally followed by +noise=SIGMA")
        for env_id in envs:  # fail before any simulation for a misspelt id or a wrong agent
            check_agent_fits_env(name, env_id)
    size = parse_image_size(image_size)
    output = Path(output).expanduser()
    check_destination(output, overwrite)  # before any simulator starts; the writer asks again when it opens
    return list(envs), behaviours, size, output


class _WriterOpener:
    """Opens the dataset's writer on the first env (its fps, cameras and feature names) and holds every
    later env to that fps and camera set; ``writer`` is None until then."""

    def __init__(self, output: Path, env_ids: Sequence[str], overwrite: bool, layout: dict[str, Any] | None):
        self.output, self.env_ids, self.overwrite, self.layout = output, env_ids, overwrite, layout or {}
        self.writer: DatasetWriter | None = None

    def for_env(self, env_id: str, env) -> DatasetWriter:
        import envs as envs_pkg

        fps = env.unwrapped.metadata.get("render_fps") or DEFAULT_FPS
        env_cameras = tuple(env.observation_space[PIXELS].spaces)
        if self.writer is None:
            names = _NAMES.get(envs_pkg.suite_of(env_id).name, (None, None))
            state_dim = env.observation_space[STATE].shape[0]
            action_dim = env.action_space.shape[0]
            self.writer = DatasetWriter(
                self.output,
                fps=fps,
                cameras=env_cameras,
                state_names=names[0] if names[0] and len(names[0]) == state_dim else None,
                action_names=names[1] if names[1] and len(names[1]) == action_dim else None,
                suites=[envs_pkg.suite_of(e).name for e in self.env_ids],  # a model trained on them records its suite
                overwrite=self.overwrite,
                **self.layout,
            )
        elif fps != self.writer.fps or env_cameras != self.writer.cameras:
            raise ValueError(
                f"{env_id} runs at {fps} fps with cameras {list(env_cameras)}, but the dataset records "
                f"{self.writer.fps} fps with {list(self.writer.cameras)}: one dataset needs one fps and camera set"
            )
        return self.writer


def _run(env_id: str, behaviours: Sequence[str], opener: _WriterOpener, env_kwargs: dict[str, Any], action_noise: float,
         episodes: int, seed: int, only_success: bool, counter) -> list[dict[str, Any]]:
    """Make the env and run every behaviour in it into the dataset: a run summary per behaviour."""
    import envs as envs_pkg

    env = envs_pkg.make(env_id, **env_kwargs)
    if action_noise:
        env = NoisyActions(env, action_noise)
    try:
        writer = opener.for_env(env_id, env)
        return [{"env": env_id, "agent": behaviour, **_run_env(env_id, env, behaviour, writer, episodes, seed, only_success,
                                                                counter)}
                for behaviour in behaviours]
    finally:
        env.close()


def _write(writer: DatasetWriter | None, output: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Finalize the dataset (its last file and metadata); returns collect's summary."""
    assert writer is not None
    if not writer.num_episodes:
        raise RuntimeError(f"no episode was kept (all failed with --only-success); nothing written to {output}")
    writer.finalize()
    return {
        "output": str(output),
        "fps": writer.fps,
        "cameras": list(writer.cameras),
        "episodes": writer.num_episodes,
        "frames": writer.num_frames,
        "dropped": sum(run["dropped"] for run in runs),
        "runs": runs,
    }


class NoisyActions(gymnasium.ActionWrapper):
    """Steps the env with ``action + N(0, scale^2)``, clipped to the action space.

    The noise is drawn from a generator seeded by each reset's seed, so an episode is the same
    every time its seed is run; the caller still sees (and records) the action it chose.
    """

    def __init__(self, env: gymnasium.Env, scale: float):
        super().__init__(env)
        self.scale = float(scale)
        self.rng = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.rng = np.random.default_rng(seed)
        return super().reset(seed=seed, options=options)

    def action(self, action: np.ndarray) -> np.ndarray:
        return perturbed(action, self.rng, self.scale, self.action_space)


class NoisyAgent(Agent):
    """An agent whose every action carries ``N(0, scale^2)``, clipped: the noise is its own, so what
    it acts is what the env executes and what a dataset records. Seeded like :class:`NoisyActions`
    (one generator per episode seed), it acts what an env wrapped in ``NoisyActions`` executes."""

    def __init__(self, agent: Agent, scale: float, space: gymnasium.spaces.Box, seed: int | None):
        self.agent, self.scale, self.space, self.rng = agent, float(scale), space, np.random.default_rng(seed)

    def reset(self, env_ids: list[int] | None = None) -> None:
        self.agent.reset(env_ids)

    def reads_pixels(self, env_index: int = 0) -> bool:
        return self.agent.reads_pixels(env_index)

    def act_one(self, obs, env_index: int) -> np.ndarray:
        return perturbed(self.agent.act_one(obs, env_index), self.rng, self.scale, self.space)


class _Counter:
    """Each episode's line, prefixed with the count so far, the rate and the time left."""

    def __init__(self, total: int, say: Callable[[str], None]):
        self.total, self.say, self.done, self.start = total, say, 0, time.perf_counter()

    def __call__(self, message: str, kept: bool = False) -> None:
        self.done += kept
        elapsed = time.perf_counter() - self.start
        per = elapsed / max(1, self.done)
        self.say(f"[{self.done}/{self.total} episodes, {per:.1f} s/episode, ETA {per * (self.total - self.done):.0f} s] "
                 f"{message}")


def _behaving(behaviour: str, space: gymnasium.spaces.Box, seed: int) -> Agent:
    """The agent ``behaviour`` names, for the episode with this seed."""
    name, sigma = split_noise(behaviour)
    agent = make_agent(name, action_space=space, seed=seed)
    return NoisyAgent(agent, sigma, space, seed) if sigma else agent


def _run_env(env_id, env, behaviour: str, writer: DatasetWriter, episodes: int, seed: int, only_success: bool,
             say) -> dict[str, Any]:
    budget = RETRY_FACTOR * episodes if only_success else episodes
    kept = attempts = successes = frames = 0
    seeds = []

    def record(obs, action) -> None:  # the observation before the action, the action, the task
        writer.add_frame(obs[PIXELS], obs[STATE], action, obs[INSTRUCTION])

    while kept < episodes and attempts < budget:
        episode_seed = seed + attempts
        episode = run_episode(env, _behaving(behaviour, env.action_space, episode_seed), seed=episode_seed, after_act=record)
        attempts += 1
        successes += episode.success
        if episode.success or not only_success:
            ep = writer.save_episode()
            kept += 1
            frames += episode.steps
            seeds.append(episode_seed)
            outcome = "success" if episode.success else "failure"
            say(f"{env_id} {behaviour} seed {episode_seed}: {outcome} in {episode.steps} steps -> episode {ep}", kept=True)
        else:
            writer.clear_episode()
            say(f"{env_id} {behaviour} seed {episode_seed}: failure in {episode.steps} steps, dropped (--only-success)")
    if kept < episodes:
        say(f"warning: {env_id} {behaviour}: only {kept} of {episodes} episodes succeeded in {attempts} attempts")
    return {
        "episodes": kept,
        "attempts": attempts,
        "successes": successes,
        "success_rate": successes / attempts if attempts else None,
        "dropped": attempts - kept,
        "frames": frames,
        "seeds": seeds,
    }


def format_summary(summary: dict[str, Any], only_success: bool = False) -> str:
    rows = [("env", "agent", "episodes", "frames", "success")]
    for s in summary["runs"]:
        rate = "-" if s["success_rate"] is None else f"{100 * s['success_rate']:.1f}% ({s['successes']}/{s['attempts']})"
        rows.append((s["env"], s["agent"], str(s["episodes"]), str(s["frames"]), rate))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(r[2:], widths[2:])])
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    head = (
        f"collected {summary['episodes']} episodes ({summary['frames']} frames at {summary['fps']} fps, "
        f"cameras {', '.join(summary['cameras'])}) into {summary['output']}"
    )
    tail = []
    if only_success:
        tail.append(f"dropped {summary['dropped']} unsuccessful episodes (--only-success)")
    return "\n".join([head, *lines, *tail])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.collect", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", dest="envs", action="append", metavar="ENV_ID", help="env id (repeat for several)")
    parser.add_argument("--episodes", type=int, default=20, help="episodes per env (default 20)")
    parser.add_argument("--agent", dest="agents", action="append", metavar="AGENT",
                        help="expert or random, optionally +noise=SIGMA recorded with the actions (repeat for several; "
                             "default expert)")
    parser.add_argument("--output", type=Path, help="dataset directory")
    parser.add_argument("--image-size", type=int, nargs="+", default=[64], metavar="PX", help="SIZE or H W (default 64)")
    parser.add_argument("--cameras", nargs="+", default=None, help="cameras to record (default: the env's)")
    parser.add_argument("--seed", type=int, default=0, help="first episode seed (default 0)")
    parser.add_argument("--only-success", action="store_true", help="keep successful episodes only (up to 3x tries)")
    parser.add_argument("--max-steps", type=int, default=None, help="episode step limit (default: the env's)")
    parser.add_argument("--action-noise", type=float, default=0.0, metavar="SIGMA",
                        help="execute action + N(0, SIGMA^2), record the clean action (DART; default 0)")
    add_layout_arguments(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --output that already holds something (a dataset there is replaced)")
    parser.add_argument("--stats-only", type=Path, metavar="DIR", help="recompute DIR/meta/stats.json and exit")
    args = parser.parse_args(argv)

    try:
        if args.stats_only is not None:
            if args.envs:
                parser.error("--stats-only takes no --env")
            compute_stats(args.stats_only)
            print(f"wrote {args.stats_only / 'meta' / 'stats.json'}")
            return 0
        if not args.envs or args.output is None:
            parser.error("--env and --output are required (or --stats-only DIR)")
        if len(args.image_size) not in (1, 2):
            parser.error("--image-size takes SIZE or H W")
        size = args.image_size[0] if len(args.image_size) == 1 else tuple(args.image_size)
        collect(
            args.envs,
            args.episodes,
            args.output,
            agent=args.agents or "expert",
            image_size=size,
            cameras=args.cameras,
            seed=args.seed,
            only_success=args.only_success,
            max_steps=args.max_steps,
            action_noise=args.action_noise,
            overwrite=args.overwrite,
            layout=layout_of(args),
        )
    except (ValueError, RuntimeError, OSError, UnknownEnvError, MissingSimulatorError, MissingAssetsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
