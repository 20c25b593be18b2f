"""The WAM architectures a checkpoint directory can hold, named by its ``wam_config.json``'s ``"architecture"``.

Every architecture is a package of the same shape, ``agents/wam/<name>/``: ``config`` (its config class and
presets), ``model`` (the model, a :class:`~agents.wam.interface.WAMModel`), ``policy`` (the policy that serves
it, a :class:`~agents.wam.policy.WAMPolicy`), ``checkpoint`` (build, load, save), and ``inputs`` where its
input/output convention is its own (FastWAM's). The package's ``ARCHITECTURE`` record names what of its exports
each role is; they load on first use (the package's lazy exports), so reading a config loads no model code
beyond its own.

``mot`` (no ``"architecture"`` entry: every checkpoint before FastWAM) is our Mixture-of-Transformers
(:mod:`agents.wam.mot`); ``fastwam`` is FastWAM (:mod:`agents.wam.fastwam`); ``lingbot_va`` is LingBot-VA
(:mod:`agents.wam.lingbot_va`), whose policy keeps each episode's state between calls (it is served to
:class:`~agents.episode_memory.MemoryChunkAgent`, not through :class:`~agents.wam.policy.WAMPolicy`). Adding one is
its package and one line in :data:`PACKAGES`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT = "mot"
CONFIG_FILE = "wam_config.json"  # a checkpoint's config: the model's, with its "architecture"
PACKAGES = {
    "mot": "agents.wam.mot",
    "fastwam": "agents.wam.fastwam",
    "lingbot_va": "agents.wam.lingbot_va",
}


@dataclass(frozen=True)
class Architecture:
    """One architecture: which of its package's exports plays each role (names, imported on first use)."""

    name: str  # what wam_config.json's "architecture" says
    package: str  # agents.wam.<name>
    config: str  # its config class (a ModelConfig)
    presets: str  # preset name -> a function making its config (``model=<preset>``)
    policy: str  # its policy class (evaluation, ``python -m wam_gym.serve``)
    build: str  # config -> a model to train (random weights, or the preset's pretrained ones)
    load: str  # checkpoint directory, **config overrides -> the model
    save: str  # (model, directory, extra_files) -> the directory, published atomically

    def export(self, name: str) -> Any:
        return getattr(importlib.import_module(self.package), name)

    def config_class(self) -> type:
        return self.export(self.config)

    def preset_makers(self) -> Mapping[str, Callable[[], Any]]:
        return self.export(self.presets)

    def policy_class(self) -> type:
        return self.export(self.policy)

    def build_model(self, config):
        return self.export(self.build)(config)

    def load_model(self, directory, **overrides):
        return self.export(self.load)(directory, **overrides)

    def save_model(self, model, directory, extra_files: Mapping[str, Any] | None = None):
        return self.export(self.save)(model, directory, extra_files)


def named(name: str) -> Architecture:
    """The architecture ``name`` (a key of :data:`PACKAGES`): its package's ``ARCHITECTURE``."""
    return importlib.import_module(PACKAGES[name]).ARCHITECTURE


def architecture(config_data: Mapping[str, Any], source: str = CONFIG_FILE) -> Architecture:
    """The architecture a checkpoint's config data names (none named: ``mot``)."""
    name = config_data.get("architecture", DEFAULT)
    if name not in PACKAGES:
        raise ValueError(f"{source} names architecture {name!r}, which this wam_gym does not know "
                         f"({', '.join(PACKAGES)}); upgrade wam_gym, or check the file")
    return named(name)


def of_config(config) -> Architecture:
    """The architecture of a model config object."""
    return architecture(config.to_dict(), type(config).__name__)


def of_checkpoint(directory: str | Path) -> Architecture:
    """The architecture of the checkpoint in ``directory``; one without a config file gets the default's,
    whose loader then names what is missing."""
    config_file = Path(directory).expanduser() / CONFIG_FILE
    if not config_file.is_file():
        return named(DEFAULT)
    try:
        data = json.loads(config_file.read_text())
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise ValueError(f"{config_file} is not a model config (a JSON object): the checkpoint is truncated or corrupt; "
                         "re-save it, or copy it again")
    return architecture(data, str(config_file))


def every_architecture() -> list[Architecture]:
    return [named(name) for name in PACKAGES]
