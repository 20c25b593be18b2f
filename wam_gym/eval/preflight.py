"""Checks of an evaluation's inputs that run before any model loads or actor starts.

Each one would otherwise surface minutes later inside a model worker or an actor (as a
traceback, a hang, or not at all: un-normalised actions, silently resized frames). The
messages are one line and name the fix; ``python -m wam_gym.eval`` prints them as ``error: ...``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import typing
from pathlib import Path
from typing import Any

from agents.wam.architectures import CONFIG_FILE  # json only: no model code
from agents.wam.lingbot_va.folder import is_lingbot_va, is_release, trained_inputs  # json only: no model code
from envs.contract import parse_image_size
from envs.kwargs import matches  # the one type check of a value against its annotation
from envs.protocol import INSTRUCTION, PIXELS, STATE
from envs.registry import suite_of

STATS_FILE = "dataset_stats.json"  # agents.wam.checkpoint.STATS_FILE (that module imports transformers)


# ----------------------------------------------------------------- the checkpoint
def checkpoint_dir(ckpt: str | None) -> Path:
    """``ckpt=`` as an absolute directory (``~`` expanded) holding a wam_config.json, or a LingBot-VA release."""
    from agents.wam.errors import MissingCheckpointError

    if ckpt is None:
        raise ValueError("EVALUATION.agent=wam needs ckpt=<checkpoint dir> (or EVALUATION.agent=expert|random)")
    root = Path(ckpt).expanduser()
    if root.is_file():  # the config file itself, or a weights file: the checkpoint is the folder
        folder = f"ckpt={root.parent}" if root.name == CONFIG_FILE else f"the folder holding {CONFIG_FILE}"
        raise MissingCheckpointError(f"ckpt={ckpt} is a file; pass the checkpoint directory python -m training "
                                     f"saved ({folder})")
    if not (root / CONFIG_FILE).is_file() and not is_release(root):
        raise MissingCheckpointError(f"ckpt={ckpt} is not a checkpoint directory (no {CONFIG_FILE}); pass the "
                                     "directory python -m training saved, or a LingBot-VA release folder")
    return root.resolve()


def load_model_config(path: Path):
    """The checkpoint's config (a MoTConfig, or its architecture's), every field of the JSON checked against its type."""
    from agents.wam.architectures import architecture
    from agents.wam.errors import MissingCheckpointError

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MissingCheckpointError(f"{path} is not readable JSON ({exc}): the checkpoint is truncated or "
                                     "corrupt; re-save it, or copy it again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a model config (a JSON object); re-save the checkpoint")
    config_type = architecture(data, str(path)).config_class()
    problem = type_problem(config_type, {k: v for k, v in data.items() if k != "architecture"})
    if problem:
        raise ValueError(f"{path}: {problem}; fix that field, or re-save the checkpoint")
    try:
        return config_type.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}; fix the file, or re-save the checkpoint") from None


def type_problem(cls, data: Any, prefix: str = "") -> str | None:
    """The first field of ``data`` (JSON for dataclass ``cls``) whose value has the wrong type."""
    if not isinstance(data, dict):
        return f"{prefix.rstrip('.') or 'the file'} must be a JSON object, got {json.dumps(data)[:60]}"
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        expected, value = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(expected):
            problem = type_problem(expected, value, f"{prefix}{f.name}.")
            if problem:
                return problem
        elif not matches(value, expected):
            return f"{prefix}{f.name}={json.dumps(value)} is not {_type_name(expected)}"
    return None


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp)


def dataset_stats(ckpt: Path, stats_path: str | None, model) -> Path:
    """The statistics file actions are un-normalised with, read and checked against the model."""
    from agents.wam.normalization import Normalizer

    if stats_path is None:
        path = ckpt / STATS_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"ckpt={ckpt} has no {STATS_FILE}: without its training data's statistics the actions would "
                "not be un-normalised; set EVALUATION.dataset_stats_path=<dataset>/meta/stats.json"
            )
    else:
        path = Path(stats_path).expanduser().resolve()
        if path.is_dir():  # a dataset's root, say: its statistics are one file in it
            raise ValueError(f"EVALUATION.dataset_stats_path={stats_path} is a directory: point it at the statistics "
                             "file, the training dataset's meta/stats.json")
    try:
        normalizer = Normalizer.from_stats_file(path, Normalizer.recorded_mode(ckpt / STATS_FILE))
    except (ValueError, KeyError, TypeError) as exc:  # unreadable JSON, or a file of another kind
        raise ValueError(f"dataset stats {path} cannot be read ({exc}); point EVALUATION.dataset_stats_path at "
                         "the training dataset's meta/stats.json") from None
    sizes = {"action": (normalizer.action_dim, model.action_dim), "state": (normalizer.state_dim, model.state_dim)}
    for name, (stats, expected) in sizes.items():
        if stats != expected:
            raise ValueError(f"dataset stats {path} describe a {stats}-d {name}, the checkpoint's model a "
                             f"{expected}-d one: point EVALUATION.dataset_stats_path at the stats of the data it was "
                             "trained on")
    return path


# ----------------------------------------------------------------- the envs
def check_image_size(env_kwargs: dict[str, Any], model, allow_resize: bool) -> bool:
    """Refuse env frames of another size than the checkpoint's (they would be resized in silence).
    Returns whether frames will be resized (allowed by ``EVALUATION.allow_image_resize``)."""
    if "image_size" not in env_kwargs:
        return False
    size, expected = parse_image_size(env_kwargs["image_size"]), tuple(model.image_size)
    if size == expected or model.crops_frames:
        return False  # a model whose input convention crops and scales every frame takes any size
    if not allow_resize:
        raise ValueError(
            f"env_kwargs.image_size={list(size)} differs from the checkpoint's image_size {list(expected)}: its "
            "frames would be resized before the model sees them. Drop env_kwargs.image_size (the env then renders "
            "at the checkpoint's size), or set EVALUATION.allow_image_resize=true"
        )
    return True


def check_cameras(env_kwargs: dict[str, Any], model) -> None:
    """Refuse env cameras that leave out one the checkpoint takes: every episode would fail on its
    first observation, after the model workers had loaded."""
    if "cameras" not in env_kwargs:
        return
    missing = [camera for camera in model.cameras if camera not in env_kwargs["cameras"]]
    if missing:
        raise ValueError(
            f"env_kwargs.cameras={list(env_kwargs['cameras'])} lacks {missing}, which the checkpoint takes "
            f"(cameras={list(model.cameras)}). Drop env_kwargs.cameras (the env then renders the checkpoint's), "
            "or list all of them"
        )


def check_video_camera(camera: str | None, tasks, env_kwargs: dict[str, Any]) -> None:
    """``EVALUATION.video_camera`` must be one every task's env renders."""
    if camera is None:
        return
    for task in tasks:
        cameras = env_cameras(task.env_id, env_kwargs)
        if cameras is not None and camera not in cameras:
            raise ValueError(f"EVALUATION.video_camera={camera!r}: {task.name} renders cameras {list(cameras)}; "
                             "pick one of them, or null for all side by side")


def env_cameras(env_id: str, env_kwargs: dict[str, Any]) -> tuple[str, ...] | None:
    """The cameras ``envs.make(env_id, **env_kwargs)`` renders, or None when only the built env knows."""
    if "cameras" in env_kwargs:
        return tuple(env_kwargs["cameras"])
    module, _, name = suite_of(env_id).entry_point.partition(":")
    try:  # env modules are light (simulators are imported when an env is built)
        parameter = inspect.signature(getattr(importlib.import_module(module), name)).parameters.get("cameras")
    except Exception:  # noqa: BLE001 - a module that cannot load here is reported by its actor
        return None
    default = None if parameter is None else parameter.default
    return None if default in (None, inspect.Parameter.empty) else tuple(default)


def check_against_model(evaluation, model) -> None:
    """Inference knobs the checkpoint cannot honour (its model workers would refuse them after loading)."""
    from agents.wam.config import VIDEO_MODES

    if evaluation.video_mode not in (None, *VIDEO_MODES):
        raise ValueError(f"EVALUATION.video_mode={evaluation.video_mode!r}: choose one of {VIDEO_MODES}, or null "
                         "for the checkpoint's")
    if evaluation.action_horizon is not None and evaluation.action_horizon > model.action_horizon:
        raise ValueError(f"EVALUATION.action_horizon={evaluation.action_horizon}: the checkpoint predicts "
                         f"1..{model.action_horizon} actions per call; pick one in that range, or null")


def wam_checkpoint(ckpt: str | None, evaluation, protocol=None):
    """``(checkpoint dir, its MoTConfig, the statistics file)`` for EVALUATION.agent=wam under the named
    ``protocol`` (an EvalProtocol, or None), all checked (eval's manager and ``python -m wam_gym.serve``)."""
    root = checkpoint_dir(ckpt)
    if is_lingbot_va(root):  # a release, or one python -m training wrote: its settings are its convention's
        return root, release_facts(root, evaluation, protocol), None
    model = load_model_config(root / CONFIG_FILE)
    check_against_model(evaluation, model)
    return root, model, dataset_stats(root, evaluation.dataset_stats_path, model)


def release_facts(root: Path, evaluation, protocol):
    """A LingBot-VA release folder, or a checkpoint python -m training wrote: what its protocol's input convention
    says of it (cameras, sizes, chunk, the statistics a release lacks). The protocol is required: their folders
    carry none of it, and ours name the convention (which must be the protocol's) but not the benchmark side."""
    from agents.wam.lingbot_va.folder import ReleaseFacts
    from agents.wam.lingbot_va.inputs import CONVENTIONS
    from wam_gym.eval.protocols import of_convention

    if protocol is None or protocol.model_inputs not in CONVENTIONS:
        if not is_release(root):  # python -m training's: its wam_config.json names the convention
            own = trained_inputs(root)
            fit = of_convention(own)
            raise ValueError(f"ckpt={root} holds a LingBot-VA trained under the input convention {own}, whose "
                             f"benchmark side is its protocol's: evaluate it with protocol="
                             f"{fit.name if fit is not None else own}")
        raise ValueError(f"ckpt={root} is a LingBot-VA release folder, which carries no evaluation settings: name "
                         "the protocol it is evaluated under, protocol=lingbot_va_libero")
    if not is_release(root) and trained_inputs(root) != protocol.model_inputs:
        raise ValueError(f"protocol={protocol.name} feeds the model by {protocol.model_inputs}, and ckpt={root} "
                         f"was trained under {trained_inputs(root)}: evaluate it under the protocol of its convention")
    if evaluation.dataset_stats_path is not None:
        raise ValueError(f"EVALUATION.dataset_stats_path={evaluation.dataset_stats_path}: a LingBot-VA is "
                         f"un-normalised by its convention's statistics ({protocol.model_inputs}); drop the knob")
    facts = ReleaseFacts.of(CONVENTIONS[protocol.model_inputs])
    check_against_model(evaluation, facts)
    return facts


# ----------------------------------------------------------------- agent=python, agent=remote
def check_python_policy(evaluation) -> None:
    """``EVALUATION.policy`` names an importable factory (its model workers would fail on it later)."""
    from agents.policy import load_policy_factory

    if not evaluation.policy:
        raise ValueError("EVALUATION.agent=python needs EVALUATION.policy=pkg.module:factory, a callable "
                         "factory(device) that returns a Policy (see agents/policy.py)")
    load_policy_factory(evaluation.policy)  # its ValueError names the fix


def check_remote(remote, tasks, env_kwargs: dict[str, Any]) -> None:
    """``REMOTE`` names a server, and each key it maps is one the tasks observe (RemoteConfig checks the rest):
    every actor would otherwise fail on them, or wait in vain."""
    from wam_gym.remote.keymap import default_keys

    if not remote.url:
        raise ValueError("EVALUATION.agent=remote needs REMOTE.url=ws://host:port, the address of an openpi or "
                         "vla-eval policy server")
    for task in tasks:
        cameras = env_cameras(task.env_id, env_kwargs)
        known = set(default_keys(remote.protocol, cameras or ()))
        # Cameras only the built env knows: its pixels.* entries are checked by the actor (keymap.key_map).
        unknown = sorted(k for k in remote.keys if k not in known and not (cameras is None and k.startswith(f"{PIXELS}.")))
        if unknown:
            raise ValueError(f"REMOTE.keys maps {unknown}, which {task.name} does not observe; map any of "
                             f"{sorted(known)} ({PIXELS}.<camera>, {STATE}, {INSTRUCTION})")
