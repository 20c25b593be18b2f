"""Checkpoint directories, what every architecture's share: the file names, the atomic publish, and the checks
and readers of a component folder.

A checkpoint is a directory, each component in its library's own format:

    wam_config.json                 the model's config ("architecture" names its kind: agents/wam/architectures.py)
    transformer/  action_expert/  vae/ ...   diffusers (config.json + *.safetensors)
    text_encoder/                   transformers (config.json + model.safetensors)
    tokenizer/                      transformers tokenizer files
    lora/                           optional peft adapters (see agents/wam/lora.py)

Which components, and how they are built and loaded, is each architecture's own ``checkpoint`` module
(:mod:`agents.wam.mot.checkpoint`, :mod:`agents.wam.fastwam.checkpoint`). Nothing here downloads: paths must
be local directories. No pickle is ever loaded.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from agents.wam.architectures import CONFIG_FILE
from agents.wam.errors import MissingCheckpointError
from agents.wam.lora import base_state_dict, has_lora, save_lora
from wam_gym.utils.publish import atomic_dir

STATS_FILE = "dataset_stats.json"  # a checkpoint's own copy of its training statistics


def publish(model, directory: str | Path, components: tuple[str, ...], extra_files: Mapping[str, str | Path] | None = None
            ) -> Path:
    """Write the model's ``components`` (its attributes of those names, each in its library's format),
    its LoRA adapters (``lora/``), its config and ``extra_files``, published in one rename."""
    target = Path(directory)
    with atomic_dir(target) as staging:
        for name, source in (extra_files or {}).items():
            shutil.copyfile(source, staging / name)
        for name in components:
            if name == "tokenizer":
                model.tokenizer.save_pretrained(str(staging / name))
            else:
                save_component(getattr(model, name), staging / name)
        if has_lora(model):
            save_lora(model, staging / "lora")
        model.config.save(staging / CONFIG_FILE)
    return target


def save_component(module: torch.nn.Module, path: Path) -> None:
    """One component in its library's format (with adapters: the base weights under the plain names)."""
    if not has_lora(module):
        module.save_pretrained(str(path), safe_serialization=True)
        return
    # With adapters injected the module's own state dict has peft's names; save the base
    # weights under the plain names so the folder loads with the library's from_pretrained.
    path.mkdir(parents=True)
    module.save_config(str(path))
    save_file(base_state_dict(module), str(path / "diffusion_pytorch_model.safetensors"))


def _require_dir(path: Path, what: str, fix: str) -> None:
    if not path.is_dir():
        raise MissingCheckpointError(f"{what} {path} is not a local directory; {fix}")


def _require_weights(folder: Path, root: Path) -> None:
    has_config = (folder / "config.json").is_file()
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.safetensors.index.json"))
    if not (has_config and has_weights):
        missing = [n for n, ok in (("config.json", has_config), ("*.safetensors", has_weights)) if not ok]
        raise MissingCheckpointError(
            f"{root} is incomplete: {folder.relative_to(root)}/ lacks {', '.join(missing)} "
            "(only safetensors weights are loaded; re-save or re-download the checkpoint)"
        )
    for index in folder.glob("*.safetensors.index.json"):
        shards = _read_json(index).get("weight_map", {}).values()
        if unsafe := sorted({s for s in shards if not str(s).endswith(".safetensors")}):
            raise MissingCheckpointError(
                f"{index} names non-safetensors shards {unsafe[:3]}; only safetensors weights are loaded "
                "(convert the shards with safetensors, or re-save the checkpoint)"
            )


@dataclass(frozen=True)
class SavedKind:
    """One architecture's checkpoint directory: the "architecture" its wam_config.json names, and how each way of
    not being one is told (each message ends with its fix)."""

    architecture: str  # wam_config.json's "architecture"
    label: str  # the model's name in messages
    config_class: type  # its config, read with from_dict
    writers: str  # what writes such a directory
    not_a_directory: str  # the fix when the path is no local directory
    written_by: str  # what writes one, said when the directory holds another architecture
    damaged: str  # the fix when its config does not describe the model


def read_model_config(root: Path, kind: SavedKind):
    """The config of the checkpoint directory ``root``, which must hold a ``kind.architecture``."""
    _require_dir(root, f"{kind.label} checkpoint", kind.not_a_directory)
    if not (root / CONFIG_FILE).is_file():
        raise MissingCheckpointError(f"{root} has no {CONFIG_FILE}: it is no checkpoint directory; pass one that "
                                     f"{kind.writers} wrote")
    data = _read_json(root / CONFIG_FILE)
    if not isinstance(data, dict) or data.get("architecture") != kind.architecture:
        named = data.get("architecture", "mot") if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise MissingCheckpointError(f"{root / CONFIG_FILE} is not a {kind.label}'s (\"architecture\" is {named!r}, not "
                                     f"\"{kind.architecture}\"): pass a {kind.label} checkpoint directory "
                                     f"({kind.written_by} writes one)")
    try:
        return kind.config_class.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise MissingCheckpointError(f"{root / CONFIG_FILE} does not describe a {kind.label} "
                                     f"({' '.join(str(exc).split())}); {kind.damaged}") from None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MissingCheckpointError(f"{path} is not readable JSON ({exc}); re-save the checkpoint") from exc


def load_tokenizer(folder: Path):
    """A checkpoint's tokenizer folder; a missing or unreadable one is named with its cause."""
    _require_dir(folder, "tokenizer folder", f"the checkpoint {folder.parent} is incomplete")
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad file: all mean the same
        raise MissingCheckpointError(
            f"{folder.parent}: tokenizer/ cannot be loaded ({_root_cause(exc)}); its files are truncated or corrupt: "
            "re-save the checkpoint (or copy it again)"
        ) from exc


def _root_cause(exc: BaseException) -> str:
    """The innermost exception of a chain, on one line (the libraries wrap the real reason twice)."""
    while exc.__cause__ or exc.__context__:
        exc = exc.__cause__ or exc.__context__
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
