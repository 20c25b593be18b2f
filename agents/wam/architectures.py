"""The WAM architectures a checkpoint directory can hold, named by its ``wam_config.json``'s ``"architecture"``.

``mot`` (no ``"architecture"`` entry: every checkpoint before FastWAM) is our Mixture-of-Transformers
(:mod:`agents.wam.mot`); ``fastwam`` is FastWAM (:mod:`agents.wam.fastwam`). Each names, as
``"module:attribute"`` imported on first use (reading a config loads no model code beyond its own):

    config   its config class (a :class:`~agents.wam.config.ModelConfig`)
    policy   the policy that serves it (evaluation, ``python -m wam_gym.serve``)
    build    config -> a model to train (random weights, or the preset's pretrained ones)
    load     checkpoint directory, **config overrides -> the model
    save     (model, directory, extra_files) -> the directory, published atomically
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT = "mot"


@dataclass(frozen=True)
class Architecture:
    name: str
    config: str
    policy: str
    build: str
    load: str
    save: str

    def config_class(self) -> type:
        return _imported(self.config)

    def policy_class(self) -> type:
        return _imported(self.policy)

    def build_model(self, config):
        return _imported(self.build)(config)

    def load_model(self, directory, **overrides):
        return _imported(self.load)(directory, **overrides)

    def save_model(self, model, directory, extra_files: Mapping[str, Any] | None = None):
        return _imported(self.save)(model, directory, extra_files)


def _imported(path: str):
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


ARCHITECTURES = {
    "mot": Architecture(
        "mot", config="agents.wam.config:MoTConfig", policy="agents.wam.wam_policy:WAMPolicy",
        build="agents.wam.checkpoint:build_model", load="agents.wam.checkpoint:load_pretrained",
        save="agents.wam.checkpoint:save_pretrained",
    ),
    "fastwam": Architecture(
        "fastwam", config="agents.wam.fastwam.config:FastWAMConfig", policy="agents.wam.fastwam.fastwam_policy:FastWAMPolicy",
        build="agents.wam.fastwam.checkpoint:build_fastwam", load="agents.wam.fastwam.checkpoint:load_fastwam",
        save="agents.wam.fastwam.checkpoint:save_fastwam",
    ),
}


def architecture(config_data: Mapping[str, Any], source: str = "wam_config.json") -> Architecture:
    """The architecture a checkpoint's config data names (none named: ``mot``)."""
    name = config_data.get("architecture", DEFAULT)
    if name not in ARCHITECTURES:
        raise ValueError(f"{source} names architecture {name!r}, which this wam_gym does not know "
                         f"({', '.join(ARCHITECTURES)}); upgrade wam_gym, or check the file")
    return ARCHITECTURES[name]


def of_config(config) -> Architecture:
    """The architecture of a model config object."""
    return architecture(config.to_dict(), type(config).__name__)
