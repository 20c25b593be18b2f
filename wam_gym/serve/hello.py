"""What the server's greeting says: what the model expects (:func:`greeting_metadata`, both protocols),
and what vla-eval's runner reads to configure itself (:func:`hello_fields`, its HELLO reply only).

The metadata names the model (its checkpoint folder's name or the policy's import path, and a
fingerprint of its weights, statistics and the settings that change its actions; never a path of the
server's machine), the evaluation protocol it is served by, the frames the server takes clients to send
(wam_gym/serve/frames.py), its chunk and replan count, its cameras, state and action sizes, and whether it
remembers each episode (wam_gym/serve/episodes.py: then it answers one action per observation).

vla-eval's runner (``vla-eval run``: ``vla_eval.orchestrator``, 0.8) connects, sends HELLO and
reads three fields of the model server's reply before it builds its benchmark:

- ``observation_params``: constructor params of the benchmark. Its benchmarks render and send the
  wrist image and the state only when asked (LIBERO: ``send_wrist_image``, ``send_state``, both
  false by default), so a model server names what its model takes, as vla-eval's own servers do.
  The run's own params win (the config's ``params:`` and ``--param KEY=VALUE``); a param the
  benchmark's constructor does not take is dropped with a warning.
- ``observation_spec`` / ``action_spec``: ``{component: DimSpec.to_dict()}``, compared with the
  benchmark's own; a mismatch is logged as a warning, never refused.

Everything here follows from the served model (its cameras, state and action sizes), never from
a suite. A checkpoint does not record its state's or its actions' layout, so both are declared
``raw`` with their sizes, as vla-eval's LeRobot server declares them; vla-eval then warns that
``raw`` is not its benchmark's named layout. Written as plain dicts: the server does not import
vla-eval (tests/test_serve.py reads them with vla-eval's own classes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from envs.header import labelled
from envs.protocol import PIXELS, STATE
from envs.registry import header_doc, suite_named
from wam_gym.remote.keymap import vla_eval_camera
from wam_gym.serve.frames import ClientFrames


@dataclass(frozen=True)
class ServedModel:
    """What the served model takes and answers, as far as it is known before it runs."""

    cameras: tuple[str, ...]  # in the model's order
    state_dim: int | None = None  # None: not known before the model runs (EVALUATION.agent=python)
    action_dim: int | None = None
    name: str = ""  # its checkpoint folder's name, or the policy's import path
    suite: str | None = None  # the suite it was trained on (the checkpoint's, or SERVE.suite); None: unknown
    convention: str | None = None  # its input convention (wam_gym, fastwam_libero); None: the policy's own
    protocol: str | None = None  # the evaluation protocol it is served by (wam_gym/eval/protocols.py); None: none


def greeting_metadata(model: ServedModel, identity: dict[str, Any], frames: ClientFrames) -> dict[str, Any]:
    """The greeting's description of the model, before it loads (the server adds action_horizon, replan_steps
    and episodes once it has). ``identity``: what an evaluation records of it, paths left out."""
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return {
        "model": {"name": model.name, "fingerprint": fingerprint, **identity},
        "protocol": model.protocol,
        "frames": {**frames.greeting(), "model_convention": model.convention},
        "suite": model.suite,
        "cameras": list(model.cameras),
        "state": {"dim": model.state_dim, "layout": _state_layout(model.suite)},
        "action_dim": model.action_dim,
    }


def _state_layout(suite: str | None) -> str | None:
    """The suite header's ``State`` line (LIBERO: end-effector position (3), axis-angle (3), gripper qpos (2))."""
    if suite is None:
        return None
    return labelled(header_doc(suite_named(suite)), "State") or None


def runner_params(cameras: tuple[str, ...]) -> dict[str, dict[str, bool]]:
    """``{contract key: the benchmark params that make vla-eval's runner send it}``. Every served model
    takes a state; vla-eval's benchmarks always send their main view and send a second camera as the
    wrist image."""
    return {STATE: {"send_state": True}, **{f"{PIXELS}.{camera}": {"send_wrist_image": True} for camera in cameras[1:]}}


def runner_hints(cameras: tuple[str, ...]) -> dict[str, str]:
    """How to make vla-eval's runner send each input it can be asked for: the first fix a missing-key error names."""
    return {key: "send it (vla-eval's runner: " + " ".join(f"--param {k}={str(v).lower()}" for k, v in params.items())
            + ")" for key, params in runner_params(cameras).items()}


def hello_fields(model: ServedModel) -> dict[str, Any]:
    """The fields of our HELLO reply that vla-eval's runner reads."""
    params: dict[str, bool] = {}
    for needed in runner_params(model.cameras).values():
        params.update(needed)
    images = {vla_eval_camera(camera): _spec("image", 0, "rgb_hwc_uint8") for camera in model.cameras}
    state = _spec("state", model.state_dim or 0, "raw", "the env's state vector, as the model was trained on it")
    actions = _spec("actions", model.action_dim or 0, "raw", "one action per observation, in the env's units")
    return {"observation_params": params,
            "observation_spec": {**images, "state": state, "language": _spec("language", 0, "language")},
            "action_spec": {"actions": actions}}


def _spec(name: str, dims: int, format: str, description: str = "") -> dict[str, Any]:
    """One component as vla_eval.specs.DimSpec.to_dict writes it (dims 0: not a fixed-size vector)."""
    return {"name": name, "dims": dims, "format": format, **({"description": description} if description else {})}
