"""Observation keys on the wire <-> our env contract (envs/protocol.py).

A key map is a dict ``{contract key: wire key}``. Contract keys are ``pixels.<camera>``,
``state`` and ``instruction``; a wire key is the key a protocol's client uses, with ``.``
stepping into a nested dict (vla-eval's ``images.agentview`` is ``obs["images"]["agentview"]``;
openpi's LIBERO example uses flat keys with slashes, ``observation/image``). The defaults:

- openpi (its LIBERO example, ``examples/libero/main.py``): the first camera is
  ``observation/image``, the second ``observation/wrist_image``, any further one
  ``observation/<camera>``; ``observation/state``; ``prompt``.
- vla-eval (its recommended keys, ``vla_eval.types.Observation``): ``images.<camera>``,
  ``state``, ``task_description``.

``SERVE.openpi_keys`` / ``SERVE.vla_eval_keys`` (the server) and ``EVALUATION.remote_keys`` (our
harness as a client) replace them, e.g. ``'SERVE.vla_eval_keys={state: states}'``; keys not
named keep their default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.protocol import INSTRUCTION, PIXELS, STATE
from wam_gym.wire import OPENPI, PROTOCOLS, VLA_EVAL


class ObservationError(ValueError):
    """A client's observation does not fit the model: named key, shape or type, and the fix."""


def default_keys(protocol: str, cameras: Sequence[str]) -> dict[str, str]:
    """The default ``{contract key: wire key}`` of ``protocol`` for ``cameras`` (in the model's order)."""
    if protocol == OPENPI:
        names = ["observation/image", "observation/wrist_image"]
        keys = {f"{PIXELS}.{cam}": names[i] if i < 2 else f"observation/{cam}" for i, cam in enumerate(cameras)}
        return {**keys, STATE: "observation/state", INSTRUCTION: "prompt"}
    if protocol == VLA_EVAL:
        return {**{f"{PIXELS}.{cam}": f"images.{cam}" for cam in cameras}, STATE: "state", INSTRUCTION: "task_description"}
    raise ValueError(f"protocol {protocol!r}: choose one of {PROTOCOLS}")


def key_map(protocol: str, cameras: Sequence[str], overrides: Mapping[str, str] | None = None,
            knob: str = "the key map") -> dict[str, str]:
    """The defaults with ``overrides`` (the knob ``knob``) applied; an override of a key the model
    does not take is refused."""
    keys = default_keys(protocol, cameras)
    unknown = sorted(set(overrides or {}) - set(keys))
    if unknown:
        raise ValueError(f"{knob} maps {unknown}, which name no input of the model; map any of {sorted(keys)}")
    return {**keys, **(overrides or {})}


def to_contract(wire: Any, keys: Mapping[str, str], knob: str = "the key map") -> dict[str, Any]:
    """One client observation -> one contract observation (a row), every input checked; errors name ``knob``."""
    if not isinstance(wire, Mapping):
        raise ObservationError(f"an observation must be a dict, got {type(wire).__name__}")
    pixels = {}
    for contract, name in keys.items():
        if contract.startswith(f"{PIXELS}."):
            camera = contract[len(PIXELS) + 1:]
            image = _lookup(wire, name, contract, knob)
            if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3):
                raise ObservationError(f"{name!r} (camera {camera}) must be a uint8 (H, W, 3) image, got {_describe(image)}")
            pixels[camera] = image
    state = _lookup(wire, keys[STATE], STATE, knob)
    if not (isinstance(state, np.ndarray) and state.ndim == 1 and state.dtype.kind in "biuf"):
        raise ObservationError(f"{keys[STATE]!r} (state) must be a 1-D numeric array, got {_describe(state)}")
    instruction = _lookup(wire, keys[INSTRUCTION], INSTRUCTION, knob)
    if not isinstance(instruction, str):
        raise ObservationError(f"{keys[INSTRUCTION]!r} (instruction) must be a string, got {_describe(instruction)}")
    return {PIXELS: pixels, STATE: state.astype(np.float32), INSTRUCTION: instruction}


def to_wire(obs: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, Any]:
    """One contract observation -> what a client of the protocol sends."""
    wire: dict[str, Any] = {}
    for contract, name in keys.items():
        value = obs[PIXELS][contract[len(PIXELS) + 1:]] if contract.startswith(f"{PIXELS}.") else obs[contract]
        if contract == STATE:
            value = np.asarray(value, dtype=np.float32)
        *parents, leaf = name.split(".")
        node = wire
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return wire


def _lookup(wire: Mapping[str, Any], name: str, contract: str, knob: str) -> Any:
    node: Any = wire
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ObservationError(f"the observation lacks {name!r} (the model's {contract}); it has keys "
                                   f"{_keys(wire)}: send it, or map the model's {contract} to one of those with {knob}")
        node = node[part]
    return node


def _keys(wire: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in wire.items():
        out += _keys(value, f"{prefix}{key}.") if isinstance(value, Mapping) else [f"{prefix}{key}"]
    return sorted(out)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__
