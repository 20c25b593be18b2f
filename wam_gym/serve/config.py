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
from pathlib import Path

from envs.orientation import check_orientation
from envs.registry import suite_named
from wam_gym.eval import protocols
from wam_gym.model_call import ModelCallConfig, ModelWorkersConfig
from wam_gym.policies import SERVED_AGENTS
from wam_gym.serve.frames import AUTO
from wam_gym.utils.ranges import DAY_S, Range, check_ranges

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeSettings:
    """SERVE.*: the WebSocket endpoint (openpi and vla-eval protocols on one port)."""

    host: str = "127.0.0.1"  # loopback; another interface (0.0.0.0) only when asked, with a warning
    port: int = 8000  # 0: any free port (the log and the port file name it)
    port_file: str | None = None  # write the bound port here once serving (scripts and tests read it); stale one removed
    # required as "Authorization: Api-Key <key>" (openpi-client's api_key=); null: none (an empty key is refused)
    api_key: str | None = None
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
        check_api_key(self.api_key)
        if not self.host.strip():  # the OS would bind every interface: beyond this machine, by a missing value
            raise ValueError("SERVE.host is empty, which listens on every interface: set SERVE.host=127.0.0.1 (this "
                             "machine only, the default) or SERVE.host=0.0.0.0 to serve beyond it on purpose")
        if self.port_file is not None:
            check_port_file(self.port_file)
        if self.client_frames != AUTO:
            check_orientation(self.client_frames, "SERVE.client_frames")
        if self.suite is not None:
            suite_named(self.suite, "SERVE.suite")


SERVE_RANGES = {  # every numeric SERVE knob
    "port": Range(0, 65535, note="0: any free port"),
    "max_message_mb": Range(0, 1024, open_low=True, integer=False, note="megabytes"),
    "max_sessions": Range(1, 65536, note="concurrent connections"),
    "drain_s": Range(0, DAY_S, integer=False, note="seconds; 0: close at once, requests in flight unanswered"),
    "idle_timeout_s": Range(0, DAY_S, open_low=True, integer=False, note="seconds", null="off"),
    "ping_interval_s": Range(0, DAY_S, open_low=True, integer=False, note="seconds", null="no pings"),
    "ping_timeout_s": Range(0, DAY_S, open_low=True, integer=False, note="seconds"),
}


def check_api_key(key: str | None) -> None:
    """SERVE.api_key: null (no authentication, said in so many words) or a key clients can send in a header.
    An empty one would turn authentication off in silence (``${oc.env:VAR}`` of a variable set to '')."""
    if key is None:
        return
    if not key.strip():
        raise ValueError("SERVE.api_key is empty (an environment variable set to ''?), which would serve without "
                         "authentication: set it to a key, or to null to serve without one on purpose")
    if key != key.strip() or not key.isprintable():
        raise ValueError("SERVE.api_key has surrounding whitespace or a control character (a key file's newline?), "
                         "which no client can send in its header: strip it")


def check_port_file(port_file: str) -> None:
    """SERVE.port_file must be a file the server may write once ready: checked now, not after the model loads.
    A file already there must be empty (mktemp's) or hold a port (a stale one is removed at start); anything else
    is the user's, never written over."""
    path = Path(port_file).expanduser()
    if not port_file.strip():
        raise ValueError("SERVE.port_file is empty: name a file (SERVE.port_file=serve.port), or null for none")
    if path.is_dir():
        raise ValueError(f"SERVE.port_file={port_file} is a directory: name a file in it (SERVE.port_file={path / 'port'})")
    if not path.parent.is_dir():
        raise ValueError(f"SERVE.port_file={port_file}: its folder {path.parent} does not exist; create it, or "
                         "name a file in an existing folder")
    if path.exists() and not (path.is_file() and path.stat().st_size <= 16 and _is_port(path.read_bytes())):
        raise ValueError(f"SERVE.port_file={port_file} exists and holds something other than a port: name a new "
                         "file (the server writes its port there)")


@dataclass
class ServeConfig:
    """The whole ``python -m wam_gym.serve`` config."""

    ckpt: str | None = None  # a checkpoint directory (EVALUATION.agent=wam)
    # set by the config group protocol=NAME (wam_gym/eval/protocols.py): served by its chunk rules (replan_steps,
    # action_horizon, num_inference_steps); a LingBot-VA needs one (its input convention). null: none, or the one the
    # checkpoint's input convention was made for
    protocol: str | None = None
    EVALUATION: ModelCallConfig = field(default_factory=ModelCallConfig)  # what is served, one model call
    MULTIRUN: ModelWorkersConfig = field(default_factory=ModelWorkersConfig)  # model workers, GPUs and batching
    SERVE: ServeSettings = field(default_factory=ServeSettings)  # the endpoint

    def __post_init__(self) -> None:
        if self.EVALUATION.agent not in SERVED_AGENTS:
            raise ValueError(f"EVALUATION.agent={self.EVALUATION.agent!r} cannot be served; serve one of {SERVED_AGENTS} "
                             "(wam with ckpt=DIR, python with EVALUATION.policy=pkg.module:factory)")
        protocols.named(self.protocol)  # a known name (the server's build reads what it fixes)



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


def _is_port(text: bytes) -> bool:
    return not text.strip() or text.strip().isdigit()


def _knobs(config_class: type, group: str) -> set[str]:
    """The knob names of ``config_class``'s group ``group`` (a dataclass field such as EVALUATION)."""
    group_class = next(f.default_factory for f in dataclasses.fields(config_class) if f.name == group)
    return {f.name for f in dataclasses.fields(group_class)}
