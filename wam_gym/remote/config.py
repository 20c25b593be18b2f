"""``REMOTE.*``: the policy server that ``EVALUATION.agent=remote`` asks (``python -m wam_gym.eval``).

The knobs of the connection, read by the remote client alone (:class:`~wam_gym.remote.client.RemoteSettings` is
what each rollout actor gets of them). What needs no task is checked here, when the config is built; the keys a
task's observation must hold are checked by the eval's preflight, which knows the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlparse

from envs.orientation import check_orientation
from wam_gym.remote.wire import OPENPI, PROTOCOLS
from wam_gym.utils.ranges import DAY_S, Range, check_ranges


@dataclass
class RemoteConfig:
    """REMOTE.*: where the policy server listens, which protocol it speaks, and how to talk to it."""

    url: str | None = None  # ws://host:port of an openpi or vla-eval policy server (EVALUATION.agent=remote)
    protocol: str = OPENPI  # openpi | vla-eval
    keys: dict[str, str] = field(default_factory=dict)  # {contract key: wire key} (wam_gym/remote/keymap.py)
    api_key: str | None = None  # sent as openpi's "Authorization: Api-Key" header ('': refused)
    # longest wait for one answer, and for a server lost mid-run to come back (the run's first connection gives
    # up within seconds: a server never reached is a wrong URL or a server not started)
    timeout_s: float = 300.0
    # how frames are turned when sent (envs/orientation.py), and said so; null: as the field's drivers for the
    # task's suite turn them (LIBERO: mirrored, as openpi's and vla-eval's LIBERO clients send)
    frames: str | None = None

    def __post_init__(self) -> None:
        if self.url is not None:
            check_url(self.url)
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("REMOTE.api_key is empty (an environment variable set to ''?): set it to the "
                             "server's key, or to null to send none")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"REMOTE.protocol={self.protocol!r}: choose one of {list(PROTOCOLS)}")
        for contract, wire in self.keys.items():
            if not isinstance(wire, str) or not wire:
                raise ValueError(f"REMOTE.keys.{contract}={wire!r}: give the key the server expects, a string")
        if self.frames is not None:
            check_orientation(self.frames, "REMOTE.frames")
        check_ranges(self, "REMOTE", REMOTE_RANGES)


def check_url(url: str) -> None:
    """``url`` is ws(s)://host:port, or a one-line error saying how to write it."""
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"REMOTE.url={url!r}: {exc}; write it as ws://host:port") from None
    if parsed.scheme not in ("ws", "wss") or not parsed.hostname:
        raise ValueError(f"REMOTE.url={url!r}: write it as ws://host:port (or wss://host:port)")
    if not parsed.port:  # none: websockets would try port 80 (443), never where a policy server listens by default
        said = "names no port" if parsed.port is None else "names port 0, which no server listens on"
        raise ValueError(f"REMOTE.url={url!r} {said}: write it as {parsed.scheme}://{parsed.hostname}:PORT "
                         "(python -m wam_gym.serve listens on SERVE.port, 8000 by default)")


# a budget beyond a day is "wait forever" in disguise: a server lost for good would hold the run
REMOTE_RANGES = {"timeout_s": Range(0, DAY_S, open_low=True, integer=False, note="seconds")}
