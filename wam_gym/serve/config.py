"""The policy server's config (``python -m wam_gym.serve``), as Hydra structured configs.

``EVALUATION.*`` (what to serve and how each model call runs) and ``MULTIRUN.*`` (model workers,
GPUs, batching) are the model-call groups that evaluation extends (wam_gym/model_call.py), so a
server runs a model exactly as an evaluation would, and an episode knob (``EVALUATION.num_trials``,
``MULTIRUN.env_num_per_worker``) is refused in one line: a server runs no episodes.
``SERVE.*`` holds what only a server has: where it listens, who may talk to it, and how clients'
keys map onto the model's inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from envs.orientation import check_orientation
from envs.registry import suite_named
from wam_gym.model_call import ModelCallConfig, ModelWorkersConfig
from wam_gym.policies import SERVED_AGENTS
from wam_gym.serve.frames import AUTO
from wam_gym.utils.ranges import Range, check_ranges

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeSettings:
    """SERVE.*: the WebSocket endpoint (openpi and vla-eval protocols on one port)."""

    host: str = "127.0.0.1"  # loopback; another interface (0.0.0.0) only when asked, with a warning
    port: int = 8000  # 0: any free port (the log and the port file name it)
    port_file: str | None = None  # write the bound port here once serving (scripts and tests read it)
    api_key: str | None = None  # required as "Authorization: Api-Key <key>" (openpi-client's api_key=); null: none
    max_message_mb: float = 64.0  # larger frames close the connection (code 1009)
    max_sessions: int = 256  # concurrent connections; more get HTTP 503
    drain_s: float = 30.0  # on SIGTERM/SIGINT: longest wait for the requests in flight before closing
    # a connection that sends no whole frame for this long (nothing, or half a frame) is closed and its place freed
    idle_timeout_s: float | None = 300.0
    ping_interval_s: float | None = 20.0  # keep-alive pings; a peer that stops answering them is dropped; null: none
    ping_timeout_s: float = 20.0  # how long a ping may go unanswered before the connection counts as dead
    cameras: list[str] | None = None  # the model's cameras, in order; null: the checkpoint's (needed for agent=python)
    # how clients' frames are turned (upright | mirrored | upside_down | rotated_180, envs/orientation.py) when their
    # observations do not say; auto: as the field's drivers send them (a vla-eval client's benchmark, else SERVE.suite's)
    client_frames: str = "auto"
    suite: str | None = None  # the benchmark suite the model was trained on (libero, ...); null: the checkpoint's
    openpi_keys: dict[str, str] = field(default_factory=dict)  # {contract key: openpi key} over the defaults (keymap.py)
    vla_eval_keys: dict[str, str] = field(default_factory=dict)  # {contract key: vla-eval key} over the defaults

    def __post_init__(self) -> None:
        check_ranges(self, "SERVE", SERVE_RANGES)
        if self.client_frames != AUTO:
            check_orientation(self.client_frames, "SERVE.client_frames")
        if self.suite is not None:
            suite_named(self.suite, "SERVE.suite")


SERVE_RANGES = {  # every numeric SERVE knob
    "port": Range(0, 65535, note="0: any free port"),
    "max_message_mb": Range(0, open_low=True, integer=False, note="megabytes"),
    "max_sessions": Range(1, note="concurrent connections"),
    "drain_s": Range(0, integer=False, note="seconds"),
    "idle_timeout_s": Range(0, open_low=True, integer=False, note="seconds", null="off"),
    "ping_interval_s": Range(0, open_low=True, integer=False, note="seconds", null="no pings"),
    "ping_timeout_s": Range(0, open_low=True, integer=False, note="seconds"),
}


@dataclass
class ServeConfig:
    """The whole ``python -m wam_gym.serve`` config."""

    ckpt: str | None = None  # a checkpoint directory (EVALUATION.agent=wam)
    EVALUATION: ModelCallConfig = field(default_factory=ModelCallConfig)  # what is served, one model call
    MULTIRUN: ModelWorkersConfig = field(default_factory=ModelWorkersConfig)  # model workers, GPUs and batching
    SERVE: ServeSettings = field(default_factory=ServeSettings)  # the endpoint

    def __post_init__(self) -> None:
        if self.EVALUATION.agent not in SERVED_AGENTS:
            raise ValueError(f"EVALUATION.agent={self.EVALUATION.agent!r} cannot be served; serve one of {SERVED_AGENTS} "
                             "(wam with ckpt=DIR, python with EVALUATION.policy=pkg.module:factory)")



def refuse_episode_knobs(overrides: list[str], prog: str = "python -m wam_gym.serve") -> None:
    """Raise ValueError, in one line, for an override of a knob that evaluation's group of that name
    has and the server's lacks (``EVALUATION.num_trials=5``): the server would otherwise only say the
    key is unknown, and the user would not learn that it belongs to ``python -m wam_gym.eval``."""
    from wam_gym.eval.config import EvalConfig  # the episode knobs' owner, imported only to name them

    for override in overrides:
        group, _, rest = override.lstrip("+~").partition(".")
        knob = rest.split("=", 1)[0]
        if group in ("EVALUATION", "MULTIRUN") and knob not in _knobs(ServeConfig, group) \
                and knob in _knobs(EvalConfig, group):
            raise ValueError(f"{group}.{knob} is an evaluation knob (episodes, outputs, actors): {prog} runs no "
                             f"episodes and takes only the model-call knobs; drop it (every key: {prog} --cfg job)")


def _knobs(config_class: type, group: str) -> set[str]:
    """The knob names of ``config_class``'s group ``group`` (a dataclass field such as EVALUATION)."""
    group_class = next(f.default_factory for f in dataclasses.fields(config_class) if f.name == group)
    return {f.name for f in dataclasses.fields(group_class)}
