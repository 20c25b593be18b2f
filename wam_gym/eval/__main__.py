"""python -m wam_gym.eval [overrides...]

    python -m wam_gym.eval ckpt=outputs/demo/train/checkpoint 'MULTIRUN.task_sets=[metaworld_demo]' EVALUATION.num_trials=10
    python -m wam_gym.eval EVALUATION.agent=expert benchmark=metaworld
    python -m wam_gym.eval --cfg job          # print the composed config

Ctrl-C and SIGTERM (a batch scheduler's time limit) stop it alike: the episodes in flight get a moment to
finish, results.json says the run is incomplete and how to resume it, and one ``error:`` line says so
(exit status 130 or 143).
"""

from __future__ import annotations

import logging

from wam_gym.utils.stop_signals import Stopped, exit_stopped, stop_on_signals

if __name__ == "__main__":  # first: a signal while the rest imports also ends in one line (see run)
    stop_on_signals()


def register_schema() -> None:
    """The structured config eval.yaml builds on. Only when run as a command: the actors, spawned
    processes that import this module again (as ``__mp_main__``), then skip the model imports
    wam_gym.eval.config pulls in (about 10 s of CPU per actor here)."""
    from wam_gym.eval.config import register

    register()


def main(cfg) -> None:
    """The command's body, given the composed config (run() hands it to Hydra)."""
    from omegaconf import OmegaConf

    from envs.errors import MissingSimulatorError
    from wam_gym.broker import BrokerError
    from wam_gym.eval.manager import EvalError, EvalManager
    from wam_gym.eval.results import OutOfSpaceError
    from wam_gym.utils.cli import fail

    logging.getLogger("wam_gym").setLevel(logging.INFO)
    try:
        config = OmegaConf.to_object(cfg)  # the dataclasses' own checks raise ValueError here
        summary = EvalManager(config, OmegaConf.to_container(cfg, resolve=True)).run()
    except (EvalError, BrokerError, ValueError, FileNotFoundError, MissingSimulatorError, OutOfSpaceError) as exc:
        fail(exc)  # these messages name their fix: one line, no traceback
    if not summary["complete"]:
        fail(summary["error"])  # never an exit 1 without saying why


def run() -> None:
    """The command: a stop signal ends it in one line (the manager's, once results.json says how to resume)."""
    try:
        import hydra

        from wam_gym.eval.config import MOVED_KNOBS
        from wam_gym.utils.cli import run_hydra

        register_schema()
        run_hydra(hydra.main(version_base=None, config_path="../conf", config_name="eval")(main), "python -m wam_gym.eval",
                  MOVED_KNOBS)
    except KeyboardInterrupt as exc:
        stopped = Stopped.of(exc)
        exit_stopped(stopped, stopped.message or f"stopped by {stopped.name} before any episode ran; run the same "
                                                  "command again to start it")


if __name__ == "__main__":
    run()
