"""python -m wam_gym.eval [overrides...]

    python -m wam_gym.eval ckpt=outputs/demo/train/checkpoint 'MULTIRUN.task_sets=[metaworld_demo]' EVALUATION.num_trials=10
    python -m wam_gym.eval EVALUATION.agent=expert benchmark=metaworld
    python -m wam_gym.eval --cfg job          # print the composed config
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from wam_gym.utils.cli import fail, run_hydra


def register_schema() -> None:
    """The structured config eval.yaml builds on. Only when run as a command: the actors, spawned
    processes that import this module again (as ``__mp_main__``), then skip the model imports
    wam_gym.eval.config pulls in (about 10 s of CPU per actor here)."""
    from hydra.core.config_store import ConfigStore

    from wam_gym.eval.config import EvalConfig

    ConfigStore.instance().store(name="eval_schema", node=EvalConfig)


@hydra.main(version_base=None, config_path="../conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    from envs.errors import MissingSimulatorError
    from wam_gym.broker import BrokerError
    from wam_gym.eval.manager import EvalError, EvalManager
    from wam_gym.results import OutOfSpaceError

    logging.getLogger("wam_gym").setLevel(logging.INFO)
    try:
        config = OmegaConf.to_object(cfg)  # the dataclasses' own checks raise ValueError here
        summary = EvalManager(config, OmegaConf.to_container(cfg, resolve=True)).run()
    except (EvalError, BrokerError, ValueError, FileNotFoundError, MissingSimulatorError, OutOfSpaceError) as exc:
        fail(exc)  # these messages name their fix: one line, no traceback
    if not summary["complete"]:
        fail(summary["error"])  # never an exit 1 without saying why


if __name__ == "__main__":
    register_schema()
    run_hydra(main, "python -m wam_gym.eval")
