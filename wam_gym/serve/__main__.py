"""python -m wam_gym.serve [overrides...]

    python -m wam_gym.serve ckpt=outputs/demo/train/checkpoint SERVE.port=8000
    python -m wam_gym.serve EVALUATION.agent=python EVALUATION.policy=my_pkg.policy:make_policy 'SERVE.cameras=[agentview]'
    python -m wam_gym.serve --cfg job          # print the composed config
"""

from __future__ import annotations

import logging
import sys

from wam_gym.utils.stop_signals import Stopped, stop_on_signals

if __name__ == "__main__":  # first: Ctrl-C or SIGTERM while the rest imports ends in one line too (see run)
    stop_on_signals()

logger = logging.getLogger("wam_gym.serve")


def register_schema() -> None:
    """The structured config serve.yaml builds on (only when run as a command: the model workers,
    spawned processes that import this module again, skip it)."""
    from hydra.core.config_store import ConfigStore

    from wam_gym.eval.protocols import SERVED_KNOBS, register_group
    from wam_gym.serve.config import ServeConfig

    store = ConfigStore.instance()
    store.store(name="serve_schema", node=ServeConfig)
    register_group(store, SERVED_KNOBS, env_side=False)


def build_server(config):
    """The server for ``config``, every input checked before a model worker starts."""
    from importlib.metadata import PackageNotFoundError, version

    from wam_gym.broker import InferenceBroker
    from wam_gym.eval import preflight
    from wam_gym.policies import policy_factory
    from wam_gym.serve.hello import ServedModel
    from wam_gym.serve.server import PolicyServer

    ev, s = config.EVALUATION, config.SERVE
    ckpt = stats = None
    if ev.agent == "wam":
        ckpt, stats, served = served_checkpoint(config)
    else:
        preflight.check_python_policy(ev)
        if not s.cameras:
            raise ValueError("EVALUATION.agent=python needs SERVE.cameras=[...]: the cameras your policy takes, in order")
        if len(set(s.cameras)) != len(s.cameras) or not all(isinstance(c, str) and c.strip() for c in s.cameras):
            raise ValueError(f"SERVE.cameras={list(s.cameras)}: name each camera your policy takes once, none empty")
        protocol = serve_by_protocol(ev, config.protocol, None)
        served = ServedModel(tuple(s.cameras), name=ev.policy, suite=s.suite, protocol=protocol)  # sizes: once it answers
    factory = policy_factory(ev, config.MULTIRUN.prompt_cache_size, ckpt, stats, served.convention)
    broker = InferenceBroker(factory, config.MULTIRUN)
    try:
        server_version = version("wam_gym")
    except PackageNotFoundError:
        server_version = "unknown"
    return PolicyServer(config, broker, served, served_identity(config, ckpt, stats), server_version)


def served_checkpoint(config):
    """``(checkpoint dir, its statistics file, the ServedModel)`` for EVALUATION.agent=wam, all checked: one of our
    checkpoints, or a LingBot-VA (a release folder, or one python -m training wrote), which its protocol's input
    convention describes (protocol=NAME is required, as in evaluation)."""
    from agents.wam.lingbot_va.folder import is_lingbot_va
    from agents.wam.lingbot_va.inputs import convention
    from wam_gym.eval import preflight, protocols
    from wam_gym.serve.hello import ServedModel

    ev, s = config.EVALUATION, config.SERVE
    named = protocols.named(config.protocol)
    protocols.check_checkpoint_inputs(named, config.ckpt)  # as evaluation checks it
    ckpt, model, stats = preflight.wam_checkpoint(config.ckpt, ev, named)
    if s.cameras and sorted(s.cameras) != sorted(model.cameras):  # every request would lack one, or carry a stray
        raise ValueError(f"SERVE.cameras={list(s.cameras)} are not the checkpoint's cameras {list(model.cameras)}: "
                         "drop SERVE.cameras (the checkpoint's are served), or list exactly those")
    lingbot = is_lingbot_va(ckpt)  # its settings are its protocol's input convention (preflight checked it)
    inputs = named.model_inputs if lingbot else model.input_convention
    suite = convention(inputs).suite if lingbot else model.suite
    protocol = serve_by_protocol(ev, config.protocol, inputs, strict=lingbot)
    return ckpt, stats, ServedModel(tuple(s.cameras or model.cameras), model.state_dim, model.action_dim,
                                    name=ckpt.name, suite=s.suite or suite, convention=inputs, protocol=protocol)


def serve_by_protocol(ev, name: str | None, convention: str | None, strict: bool = False) -> str | None:
    """A model is served by an evaluation protocol's chunk rules: the ``protocol`` group's (``name``: its options
    set the knobs, and any the user then moved is theirs), else the protocol its input convention was made for
    (FastWAM's LIBERO release: fastwam_libero, its chunk of 32 replanned every 10, 10 denoising steps), which fills
    the knobs left at their defaults. A knob that departs from the protocol wins, with a warning; ``strict`` (a
    LingBot-VA, whose convention fixes its sampling and whose chunks run whole) refuses it.
    Returns the protocol's name (None: no protocol)."""
    from wam_gym.eval.protocols import SERVED_KNOBS, named, of_convention
    from wam_gym.model_call import ModelCallConfig

    protocol = named(name) or of_convention(convention)
    if protocol is None:
        return None
    defaults = ModelCallConfig()
    for knob in SERVED_KNOBS:
        value, fixed = getattr(ev, knob), getattr(protocol, knob)
        if name is None and value == getattr(defaults, knob):  # inferred from the convention: fills what is unset
            setattr(ev, knob, fixed)
        elif value != fixed and strict:
            raise ValueError(f"EVALUATION.{knob}={value} departs from {protocol.name}'s {fixed}, by which a LingBot-VA "
                             "is served (its convention fixes its sampling; its chunks run whole): drop it")
        elif value != fixed:
            logger.warning("EVALUATION.%s=%s departs from %s's %s: served as you set it", knob, value, protocol.name, fixed)
    logger.info("serving by the %s protocol: replan_steps=%s, action_horizon=%s (null: the model's), "
                "num_inference_steps=%s", protocol.name, ev.replan_steps, ev.action_horizon, ev.num_inference_steps)
    return protocol.name


def served_identity(config, ckpt, stats) -> dict:
    """What this server serves, as an evaluation records its agent (content hashes and the settings that
    change actions, no paths: a copied checkpoint is the same model): clients record it with their episodes.
    A LingBot-VA's settings are its protocol's input convention, so the protocol is part of it."""
    from agents.wam.lingbot_va.folder import is_lingbot_va
    from wam_gym.eval.run_protocol import agent_identity

    identity = agent_identity(config, ckpt, stats)
    if ckpt is not None and is_lingbot_va(ckpt):
        identity["protocol"] = config.protocol
    return {key: {k: v for k, v in value.items() if k != "path"} if isinstance(value, dict) else value
            for key, value in identity.items()}


def main(cfg) -> None:
    """The command's body, given the composed config (run() hands it to Hydra)."""
    import asyncio

    from omegaconf import OmegaConf

    from agents.wam.errors import MissingCheckpointError
    from wam_gym.broker import BrokerError
    from wam_gym.utils.cli import fail

    logging.getLogger("wam_gym").setLevel(logging.INFO)
    try:
        server = build_server(OmegaConf.to_object(cfg))
        asyncio.run(server.run())
    except (BrokerError, ValueError, FileNotFoundError, MissingCheckpointError, OSError) as exc:
        fail(exc)  # these messages name their fix (OSError: the port is taken, say)


def run() -> None:
    """The command. A stop signal before the server's own handlers take over (while it imports, checks its
    config, binds its port) ends it in one line; from then on it drains and exits 0 (PolicyServer.run)."""
    try:
        import hydra

        from wam_gym.serve.config import refuse_episode_knobs
        from wam_gym.utils.cli import fail, run_hydra

        try:
            refuse_episode_knobs(sys.argv[1:])
        except ValueError as exc:
            fail(exc)
        register_schema()
        run_hydra(hydra.main(version_base=None, config_path="../conf", config_name="serve")(main),
                  "python -m wam_gym.serve")
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM (wam_gym.utils.stop_signals): stopped as asked, exit 0
        print(f"wam_gym.serve: stopped by {Stopped.of(exc).name} before serving; no model worker was started",
              file=sys.stderr)


if __name__ == "__main__":
    run()
