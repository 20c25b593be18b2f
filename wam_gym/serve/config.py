"""The policy server's config (``python -m wam_gym.serve``), as Hydra structured configs.

``EVALUATION.*`` (what to serve and how each model call runs) and ``MULTIRUN.*`` (model workers,
GPUs, batching) are eval's own groups, so a server runs a model exactly as an evaluation would;
``SERVE.*`` holds what only a server has: where it listens, who may talk to it, and how clients'
keys map onto the model's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wam_gym.eval.config import EvaluationConfig, MultirunConfig
from wam_gym.policies import SERVED_AGENTS
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
    openpi_keys: dict[str, str] = field(default_factory=dict)  # {contract key: openpi key} over the defaults (keymap.py)
    vla_eval_keys: dict[str, str] = field(default_factory=dict)  # {contract key: vla-eval key} over the defaults

    def __post_init__(self) -> None:
        check_ranges(self, "SERVE", SERVE_RANGES)


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
    EVALUATION: EvaluationConfig = field(default_factory=EvaluationConfig)  # what is served, one model call
    MULTIRUN: MultirunConfig = field(default_factory=MultirunConfig)  # model workers, GPUs and batching
    SERVE: ServeSettings = field(default_factory=ServeSettings)  # the endpoint

    def __post_init__(self) -> None:
        if self.EVALUATION.agent not in SERVED_AGENTS:
            raise ValueError(f"EVALUATION.agent={self.EVALUATION.agent!r} cannot be served; serve one of {SERVED_AGENTS} "
                             "(wam with ckpt=DIR, python with EVALUATION.policy=pkg.module:factory)")
        if self.EVALUATION.protocol is not None:
            raise ValueError(f"EVALUATION.protocol={self.EVALUATION.protocol} fixes how evaluation episodes run; a server "
                             "runs none: drop it (python -m wam_gym.eval EVALUATION.agent=remote applies it, and the "
                             "server takes EVALUATION.num_inference_steps and seed as you set them)")
        if self.EVALUATION.imagination_score:
            raise ValueError("EVALUATION.imagination_score scores evaluation episodes; a server runs none: drop it (the "
                             "evaluating harness scores, e.g. python -m wam_gym.eval EVALUATION.agent=remote)")
