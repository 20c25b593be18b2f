"""python -m wam_gym.eval [overrides...]

    python -m wam_gym.eval ckpt=outputs/demo/checkpoint 'MULTIRUN.task_sets=[metaworld_demo]' EVALUATION.num_trials=10
    python -m wam_gym.eval EVALUATION.agent=expert benchmark=metaworld
    python -m wam_gym.eval --cfg job          # print the composed config
"""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from wam_gym.eval.config import EvalConfig

ConfigStore.instance().store(name="eval_schema", node=EvalConfig)


@hydra.main(version_base=None, config_path="../conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    from wam_gym.eval.manager import EvalError, EvalManager

    logging.getLogger("wam_gym").setLevel(logging.INFO)
    config: EvalConfig = OmegaConf.to_object(cfg)
    try:
        summary = EvalManager(config, OmegaConf.to_container(cfg, resolve=True)).run()
    except (EvalError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0 if summary["complete"] else 1)


if __name__ == "__main__":
    main()
