"""Observation keys on the wire <-> our env contract (envs/protocol.py).

A key map is a dict ``{contract key: wire keys}``. Contract keys are ``pixels.<camera>``,
``state`` and ``instruction``; the wire keys of one input are the keys clients use for it, with
``.`` stepping into a nested dict (vla-eval's ``images.agentview`` is ``obs["images"]["agentview"]``;
openpi's LIBERO example uses flat keys with slashes, ``observation/image``). A client sends the
first; a server reads the first one the observation has, as vla-eval's own model servers read
``states`` or ``state``. The defaults:

- openpi (its LIBERO example, ``examples/libero/main.py``): the first camera is
  ``observation/image``, the second ``observation/wrist_image``, any further one
  ``observation/<camera>``; ``observation/state``; ``prompt``.
- vla-eval: ``images.<camera>``, ``state``, ``task_description`` (its recommended keys,
  ``vla_eval.types.Observation``), and what its benchmarks send for the suites we have: LIBERO
  and LIBERO-Pro call robosuite's ``robot0_eye_in_hand`` camera ``images.wrist`` and the state
  ``states``, RoboCasa sends ``states``, RoboTwin ``joint_state`` (its other keys are ours).

``SERVE.openpi_keys`` / ``SERVE.vla_eval_keys`` (the server) and ``REMOTE.keys`` (our
harness as a client) replace them with one key each, e.g. ``'SERVE.vla_eval_keys={state: proprio}'``;
inputs not named keep their default.

Frames cross here too: the contract's are upright, a wire's are as its client turned them
(envs/orientation.py). :func:`to_wire` turns them as asked and says so under ``image_orientation``
(our extension: other servers ignore it); :func:`to_contract` turns them upright from what the
observation says, else from what the server takes its client to send (wam_gym/serve/frames.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.orientation import ORIENTATIONS, UPRIGHT, reorient, to_upright
from envs.protocol import INSTRUCTION, PIXELS, STATE, nonfinite_state
from wam_gym.remote.wire import OPENPI, PROTOCOLS, VLA_EVAL


class ObservationError(ValueError):
    """A client's observation does not fit the model: named key, shape or type, and the fix."""


# Our camera -> the name vla-eval's benchmarks give it, where that differs: its LIBERO benchmarks
# (libero, libero_pro, libero_mem, libero_plus) send robosuite's eye-in-hand view as images.wrist.
VLA_EVAL_CAMERAS = {"robot0_eye_in_hand": "wrist"}
# vla-eval's state keys: its recommended one, then what its benchmarks send (LIBERO, RoboCasa: states; RoboTwin:
# joint_state). The first is what our client sends: every vla-eval model server that takes a state reads it.
VLA_EVAL_STATE = ("state", "states", "joint_state")
ORIENTATION_KEY = "image_orientation"  # an observation's own word on how its frames are turned


def vla_eval_camera(camera: str) -> str:
    """The name vla-eval's benchmarks give our ``camera`` (its key under ``images``)."""
    return VLA_EVAL_CAMERAS.get(camera, camera)


def default_keys(protocol: str, cameras: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The default ``{contract key: wire keys}`` of ``protocol`` for ``cameras`` (in the model's order)."""
    if protocol == OPENPI:
        names = ["observation/image", "observation/wrist_image"]
        keys = {f"{PIXELS}.{cam}": (names[i] if i < 2 else f"observation/{cam}",) for i, cam in enumerate(cameras)}
        return {**keys, STATE: ("observation/state",), INSTRUCTION: ("prompt",)}
    if protocol == VLA_EVAL:
        keys = {f"{PIXELS}.{cam}": tuple(dict.fromkeys((f"images.{cam}", f"images.{vla_eval_camera(cam)}")))
                for cam in cameras}
        return {**keys, STATE: VLA_EVAL_STATE, INSTRUCTION: ("task_description",)}
    raise ValueError(f"protocol {protocol!r}: choose one of {PROTOCOLS}")


def key_map(protocol: str, cameras: Sequence[str], overrides: Mapping[str, str] | None = None,
            knob: str = "the key map") -> dict[str, tuple[str, ...]]:
    """The defaults with ``overrides`` (the knob ``knob``; one wire key each) applied; an override of a
    key the model does not take is refused."""
    keys = default_keys(protocol, cameras)
    unknown = sorted(set(overrides or {}) - set(keys))
    if unknown:
        raise ValueError(f"{knob} maps {unknown}, which name no input of the model; map any of {sorted(keys)}")
    for contract, name in (overrides or {}).items():
        if not isinstance(name, str) or not name.strip(".").strip():  # '' would be read as no key at all
            raise ValueError(f"{knob}.{contract}={name!r}: give the wire key clients use for it, a non-empty string")
    return {**keys, **{contract: (name,) for contract, name in (overrides or {}).items()}}


def to_contract(wire: Any, keys: Mapping[str, Sequence[str]], knob: str = "the key map",
                hints: Mapping[str, str] | None = None, frames: str = UPRIGHT) -> dict[str, Any]:
    """One client observation -> one contract observation (a row), every input checked, its frames turned
    upright from ``image_orientation`` when it has one, else from ``frames``. A missing input's error names
    both fixes: ``hints[contract key]`` (how the client is made to send it; else "send it") and the knob ``knob``."""
    if not isinstance(wire, Mapping):
        raise ObservationError(f"an observation must be a dict, got {type(wire).__name__}")
    hints = hints or {}
    frames = wire.get(ORIENTATION_KEY, frames)
    if not isinstance(frames, str) or frames not in ORIENTATIONS:
        raise ObservationError(f"{ORIENTATION_KEY}={frames!r} is not a frame orientation: send one of "
                               f"{sorted(ORIENTATIONS)}, or leave it out")
    pixels = {}
    for contract, names in keys.items():
        if contract.startswith(f"{PIXELS}."):
            camera = contract[len(PIXELS) + 1:]
            name, image = _lookup(wire, names, contract, knob, hints.get(contract))
            if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3):
                raise ObservationError(f"{name!r} (camera {camera}) must be a uint8 (H, W, 3) image, got {_describe(image)}")
            if 0 in image.shape:  # as a WAM's frames refuse it; a served python policy would be handed it
                raise ObservationError(f"{name!r} (camera {camera}) is an empty image {image.shape}: send frames of "
                                       "H, W >= 1 (the camera's render failed?)")
            pixels[camera] = to_upright(image, frames)
    name, state = _lookup(wire, keys[STATE], STATE, knob, hints.get(STATE))
    if not (isinstance(state, np.ndarray) and state.ndim == 1 and state.dtype.kind in "biuf"):
        raise ObservationError(f"{name!r} (state) must be a 1-D numeric array, got {_describe(state)}")
    problem = nonfinite_state(state)  # checked here for every served policy (a python one would act on it)
    if problem:
        raise ObservationError(f"{name!r}: {problem}")
    name, instruction = _lookup(wire, keys[INSTRUCTION], INSTRUCTION, knob, hints.get(INSTRUCTION))
    if not isinstance(instruction, str):
        raise ObservationError(f"{name!r} (instruction) must be a string, got {_describe(instruction)}")
    return {PIXELS: pixels, STATE: state.astype(np.float32), INSTRUCTION: instruction}


def to_wire(obs: Mapping[str, Any], keys: Mapping[str, Sequence[str]], frames: str = UPRIGHT) -> dict[str, Any]:
    """One contract observation -> what a client of the protocol sends (each input under its first wire key),
    its frames turned to ``frames`` and said so under ``image_orientation``."""
    wire: dict[str, Any] = {ORIENTATION_KEY: frames}
    for contract, names in keys.items():
        if contract.startswith(f"{PIXELS}."):
            value = reorient(obs[PIXELS][contract[len(PIXELS) + 1:]], UPRIGHT, frames)
        else:
            value = obs[contract]
        if contract == STATE:
            value = np.asarray(value, dtype=np.float32)
        *parents, leaf = names[0].split(".")
        node = wire
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return wire


def _lookup(wire: Mapping[str, Any], names: Sequence[str], contract: str, knob: str, hint: str | None) -> tuple[str, Any]:
    """(the first of ``names`` that ``wire`` has, its value)."""
    for name in names:
        node: Any = wire
        for part in name.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            return name, node
    also = f"; also read as {', '.join(map(repr, names[1:]))}" if len(names) > 1 else ""
    raise ObservationError(f"the observation lacks {names[0]!r} (the model's {contract}{also}); it has keys "
                           f"{_keys(wire)}: {hint or 'send it'}, or map the model's {contract} to one of those with {knob}")


def _keys(wire: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in wire.items():
        out += _keys(value, f"{prefix}{key}.") if isinstance(value, Mapping) else [f"{prefix}{key}"]
    return sorted(out)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__
