"""``EVALUATION.agent=remote``: a policy server (openpi or vla-eval protocol) as a chunk-queue agent's predictor.

:class:`RemotePolicy` is a synchronous WebSocket client, one per rollout actor, one round trip
per observation row. The server's chunk length is unknown until it answers, so ``action_horizon``
is None (each chunk is executed whole) unless the server's metadata names one.

Failures fall in two kinds, because they call for opposite handling:

- :class:`PolicyServerLost`: the server cannot be reached for ``REMOTE.timeout_s``, drops the
  connection, or goes silent. The episode cannot go on (a vla-eval server's episode state, an
  openpi server's history, are gone with the connection), so the actor reports it and the
  manager reruns the episode from its start: a restart of the server costs no episode.
- :class:`PolicyServerError`: the server answered with an error (an observation it refuses,
  a malformed answer, a rejected api key). Rerunning would fail the same way: the run stops.

Frames go out turned as the field's drivers for the task's suite turn them (LIBERO: mirrored, as
openpi's and vla-eval's LIBERO clients send; ``REMOTE.frames`` sets another), so any
server trained on the field's frames reads them right, and each observation says how under
``image_orientation``, which wam_gym.serve reads. Frames are decoded only by wam_gym.remote.wire
(msgpack, never pickle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.policy import ModelCost, Prediction, as_prediction
from agents.predictor import Predictor
from envs.orientation import UPRIGHT
from envs.protocol import INSTRUCTION, PIXELS, batch_size, take_row
from envs.registry import suite_of
from wam_gym import __version__
from wam_gym.remote.config import RemoteConfig
from wam_gym.remote.keymap import key_map, to_wire
from wam_gym.remote.link import PolicyServerError, PolicyServerLost, ServerLink
from wam_gym.remote.wire import OPENPI, VLA_EVAL, VLA_EVAL_PROTOCOL_VERSION, as_message, pack_openpi


@dataclass
class RemoteSettings:
    """What an actor needs of the REMOTE.* knobs (wam_gym/remote/config.py), resolved for its tasks (picklable)."""

    url: str  # ws://host:port or wss://host:port
    protocol: str = OPENPI  # openpi | vla-eval
    keys: dict[str, str] = field(default_factory=dict)  # {contract key: wire key} overrides (wam_gym/remote/keymap.py)
    api_key: str | None = None  # openpi's "Authorization: Api-Key <key>" header
    timeout_s: float = 300.0  # longest wait for one answer, and for an unreachable server
    # what the server said it serves when the run began (served_model); a later connection to another is refused
    expected_model: Any = None
    frames: dict[str, str] = field(default_factory=dict)  # {task name: how its frames are turned when sent}

    @classmethod
    def from_config(cls, remote: RemoteConfig, tasks=()) -> RemoteSettings:
        """The knobs, and how each of ``tasks`` (wam_gym.eval.tasks.Task) sends its frames."""
        frames = {task.name: remote.frames or suite_of(task.env_id).driver_frames for task in tasks}
        return cls(remote.url, remote.protocol, dict(remote.keys), remote.api_key, remote.timeout_s, frames=frames)


class RemotePolicy(Predictor):
    """A policy server's client as a :class:`~agents.predictor.Predictor`."""

    def __init__(self, settings: RemoteSettings):
        self.settings = settings
        self.action_horizon: int | None = None  # from the server's metadata, when it names one
        self.metadata: dict[str, Any] = {}
        self.link = ServerLink(settings.url, settings.timeout_s, settings.api_key)  # the websocket, opened on demand
        self._keys: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}  # per camera tuple
        self._task, self._started = None, False
        self._frames = UPRIGHT  # how this episode's frames go out (settings.frames of its task)
        # The server's own model time, when it reports one (openpi's server_timing.infer_ms); else None.
        self.cost = ModelCost()

    def __str__(self) -> str:
        return f"the policy server at {self.settings.url}"

    @property
    def served_model(self) -> Any:
        """What the server says it serves, as JSON data: wam_gym.serve's ``model`` entry (the checkpoint's and
        statistics' content hashes and the inference settings), else another server's whole greeting."""
        return json.loads(json.dumps(self.metadata.get("model", self.metadata), sort_keys=True, default=str))

    # ----------------------------------------------------------------- episodes
    def begin_episode(self, seed: int, task: str | None = None) -> None:
        """Connect (again) if needed: a server that stays away raises PolicyServerLost."""
        super().begin_episode(seed, task)
        self._task, self._started = task, False
        self._frames = self.settings.frames.get(task, UPRIGHT)
        self._connect()

    def end_episode(self, success: bool) -> None:
        if self.settings.protocol == VLA_EVAL and self._started and self.link.is_open:
            try:  # the result is ours already: a server gone by now changes nothing
                self.link.send_message("episode_end", {"success": bool(success)})
            except PolicyServerLost:
                pass
        self._started = False

    def close(self) -> None:
        self.link.close()

    # ----------------------------------------------------------------- predict
    def predict(self, obs, noise_seeds=None) -> Prediction:
        n = batch_size(obs)
        seeds = self._seeds(n, noise_seeds)
        return Prediction.stack([self._ask(take_row(obs, row), seeds[row]) for row in range(n)])

    def predict_row(self, obs, noise_seed=None) -> Prediction:
        return self._ask(obs, self._seeds(1, None if noise_seed is None else [noise_seed])[0])

    def _seeds(self, n: int, noise_seeds) -> list[int]:
        """One call's noise seeds (Predictor.call_seeds), connecting first if needed."""
        seeds = self.call_seeds(n, noise_seeds)
        if not self.link.is_open:  # used without begin_episode; a connection lost mid-episode raised already
            self._connect()
        return seeds

    def _ask(self, row: dict[str, Any], seed: int) -> Prediction:
        wire = to_wire(row, self._key_map(row), self._frames)
        if self.settings.protocol == OPENPI:
            wire["noise_seed"] = seed  # our extension: wam_gym.serve samples with it, other servers ignore it
            self.link.send(pack_openpi(wire))
            answer = self.link.recv()
            if isinstance(answer, str):  # openpi's server sends its error as a text frame, then closes
                self.close()
                raise PolicyServerError(f"the policy server at {self.settings.url} failed: {answer.strip()}")
            return self._prediction(self.link.decode(answer))
        if not self._started:  # the instruction is known only now, from the first observation
            self.link.send_message("episode_start", {"task": {"name": self._task, "instruction": row[INSTRUCTION]},
                                                     "seed": self.episode_seed})
            self._started = True
        seq = self.link.send_message("observation", wire)
        while True:
            message = as_message(self.link.decode(self.link.recv()))
            if message is None:
                raise PolicyServerError(f"the policy server at {self.settings.url} sent a frame that is no vla-eval "
                                        "message; set REMOTE.protocol=openpi if it is an openpi server")
            if message.type == "error":
                raise PolicyServerError(f"the policy server at {self.settings.url} failed: "
                                        f"{message.payload.get('error', message.payload)}")
            if message.type == "action" and message.seq == seq:
                return self._prediction(message.payload)

    def _key_map(self, row: dict[str, Any]) -> dict[str, tuple[str, ...]]:
        cameras = tuple(row[PIXELS])  # in the env's order: the first is openpi's observation/image
        if cameras not in self._keys:
            self._keys[cameras] = key_map(self.settings.protocol, cameras, self.settings.keys, "REMOTE.keys")
        return self._keys[cameras]

    def _prediction(self, answer: Any) -> Prediction:
        """An answer's ``actions``, (H, A) or one action (A,), as a one-row Prediction."""
        if not isinstance(answer, dict) or "actions" not in answer:
            keys = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
            raise PolicyServerError(f"the policy server at {self.settings.url} answered without 'actions' ({keys})")
        self.cost.add(_infer_seconds(answer), None)
        actions = np.asarray(answer["actions"])
        actions = actions[None] if actions.ndim == 1 else actions
        if self.action_horizon is not None:
            actions = actions[: self.action_horizon]
        try:
            return as_prediction(actions[None], 1).row(0)
        except ValueError as exc:
            raise PolicyServerError(f"the policy server at {self.settings.url}: {exc}") from None

    # ----------------------------------------------------------------- the connection
    @property
    def on_wait(self):
        return self.link.on_wait

    @on_wait.setter
    def on_wait(self, hook) -> None:
        self.link.on_wait = hook

    def _connect(self, first: bool = False) -> None:
        """Open a connection unless one is open (:meth:`ServerLink.connect`), then greet the server."""
        if self.link.connect(first):
            self._handshake()

    def _handshake(self) -> None:
        """openpi: the server speaks first (its metadata); vla-eval: HELLO, answered by one HELLO."""
        if self.settings.protocol == VLA_EVAL:
            self.link.send_message("hello", {"harness_version": f"wam_gym {__version__}",
                                         "protocol_version": VLA_EVAL_PROTOCOL_VERSION})
        frame = self.link.recv(hint=" (set REMOTE.protocol=vla-eval if it is a vla-eval server)"
                           if self.settings.protocol == OPENPI else "")
        if isinstance(frame, str):
            raise PolicyServerError(f"the policy server at {self.settings.url} failed: {frame.strip()}")
        metadata = self.link.decode(frame)
        if self.settings.protocol == VLA_EVAL:
            message = as_message(metadata)
            if message is None or message.type != "hello":
                raise PolicyServerError(f"the policy server at {self.settings.url} did not answer HELLO; set "
                                        "REMOTE.protocol=openpi if it is an openpi server")
            metadata = message.payload
        self.metadata = metadata if isinstance(metadata, dict) else {}
        expected = self.settings.expected_model
        if expected is not None and self.served_model != expected:
            self.close()
            raise PolicyServerError(
                f"the policy server at {self.settings.url} now serves another model ({_short(self.served_model)}) than "
                f"the one this run's episodes came from ({_short(expected)}): serve that model again, or evaluate "
                "into a new EVALUATION.output_dir")
        horizon = self.metadata.get("action_horizon")
        self.action_horizon = horizon if isinstance(horizon, int) and not isinstance(horizon, bool) and horizon > 0 \
            else None


def served_model(settings: RemoteSettings, first: bool = False) -> Any:
    """Connect once and read what the server serves (:attr:`RemotePolicy.served_model`): a run records it, so
    that its episodes are never counted with another model's. ``first``: the run's first connection (a server
    not reached within FIRST_CONNECT_S raises PolicyServerError, naming the URL and its knob)."""
    policy = RemotePolicy(settings)
    try:
        policy._connect(first)
        return policy.served_model
    finally:
        policy.close()


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _infer_seconds(answer: dict[str, Any]) -> float | None:
    """The model time a server reports with an answer: openpi's ``server_timing.infer_ms`` (its
    own servers and ``python -m wam_gym.serve`` send it); None when the server does not say."""
    timing = answer.get("server_timing")
    infer_ms = timing.get("infer_ms") if isinstance(timing, dict) else None
    if isinstance(infer_ms, (int, float)) and not isinstance(infer_ms, bool) and infer_ms >= 0:
        return float(infer_ms) / 1000.0
    return None
