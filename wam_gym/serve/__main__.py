"""python -m wam_gym.serve [overrides...]

    python -m wam_gym.serve ckpt=outputs/demo/train/checkpoint SERVE.port=8000
    python -m wam_gym.serve EVALUATION.agent=python EVALUATION.policy=my_pkg.policy:make_policy 'SERVE.cameras=[agentview]'
    python -m wam_gym.serve --cfg job          # print the composed config
"""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import PackageNotFoundError, version

import hydra
from omegaconf import DictConfig, OmegaConf

from wam_gym.utils.cli import fail, run_hydra


def register_schema() -> None:
    """The structured config serve.yaml builds on (only when run as a command: the model workers,
    spawned processes that import this module again, skip it)."""
    from hydra.core.config_store import ConfigStore

    from wam_gym.serve.config import ServeConfig

    ConfigStore.instance().store(name="serve_schema", node=ServeConfig)


def build_server(config):
    """The server for ``config``, every input checked before a model worker starts."""
    from wam_gym.broker import InferenceBroker
    from wam_gym.eval import preflight
    from wam_gym.policies import policy_factory
    from wam_gym.serve.hello import ServedModel
    from wam_gym.serve.server import PolicyServer

    ev, cameras = config.EVALUATION, config.SERVE.cameras
    ckpt = stats = None
    if ev.agent == "wam":
        ckpt, model, stats = preflight.wam_checkpoint(config.ckpt, ev)
        served = ServedModel(tuple(cameras or model.cameras), model.state_dim, model.action_dim)
    else:
        preflight.check_python_policy(ev)
        if not cameras:
            raise ValueError("EVALUATION.agent=python needs SERVE.cameras=[...]: the cameras your policy takes, in order")
        served = ServedModel(tuple(cameras))  # its sizes are known only once it answers
    broker = InferenceBroker(policy_factory(ev, config.MULTIRUN.prompt_cache_size, ckpt, stats), config.MULTIRUN)
    try:
        server_version = version("wam_gym")
    except PackageNotFoundError:
        server_version = "unknown"
    metadata = {"server": "wam_gym.serve", "server_version": server_version, "agent": ev.agent,
                "checkpoint": str(ckpt) if ckpt else ev.policy, "model": served_identity(config, ckpt, stats)}
    return PolicyServer(config, broker, served, metadata)


def served_identity(config, ckpt, stats) -> dict:
    """What this server serves, as an evaluation records its agent (content hashes and the settings that
    change actions, no paths: a copied checkpoint is the same model): clients record it with their episodes."""
    from wam_gym.eval.run_protocol import agent_identity

    identity = agent_identity(config, ckpt, stats)
    return {key: {k: v for k, v in value.items() if k != "path"} if isinstance(value, dict) else value
            for key, value in identity.items()}


@hydra.main(version_base=None, config_path="../conf", config_name="serve")
def main(cfg: DictConfig) -> None:
    from agents.wam.checkpoint import MissingCheckpointError
    from wam_gym.broker import BrokerError

    logging.getLogger("wam_gym").setLevel(logging.INFO)
    try:
        server = build_server(OmegaConf.to_object(cfg))
        asyncio.run(server.run())
    except (BrokerError, ValueError, FileNotFoundError, MissingCheckpointError, OSError) as exc:
        fail(exc)  # these messages name their fix (OSError: the port is taken, say)


if __name__ == "__main__":
    import sys

    from wam_gym.serve.config import refuse_episode_knobs

    try:
        refuse_episode_knobs(sys.argv[1:])
    except ValueError as exc:
        fail(exc)
    register_schema()
    run_hydra(main, "python -m wam_gym.serve")
