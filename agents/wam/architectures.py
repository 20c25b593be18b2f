"""The WAM architectures a checkpoint directory can hold, named by its ``wam_config.json``'s ``"architecture"``.

``mot`` (no ``"architecture"`` entry: every checkpoint before FastWAM) is our Mixture-of-Transformers
(:mod:`agents.wam.mot`); ``fastwam`` is FastWAM (:mod:`agents.wam.fastwam`). Each names its config class
and the policy that serves it; both are imported on first use, so reading a config loads no model code
beyond its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

DEFAULT = "mot"
_CLASSES = {  # architecture -> (config class, policy class), as "module:name"
    "mot": ("agents.wam.config:MoTConfig", "agents.wam.policy:WAMPolicy"),
    "fastwam": ("agents.wam.fastwam.config:FastWAMConfig", "agents.wam.fastwam.policy:FastWAMPolicy"),
}
ARCHITECTURES = tuple(_CLASSES)


def architecture(config_data: Mapping[str, Any], source: str = "wam_config.json") -> str:
    """The architecture a checkpoint's config data names (none named: ``mot``)."""
    name = config_data.get("architecture", DEFAULT)
    if name not in _CLASSES:
        raise ValueError(f"{source} names architecture {name!r}, which this wam_gym does not know "
                         f"({', '.join(ARCHITECTURES)}); upgrade wam_gym, or check the file")
    return name


def config_class(name: str) -> type:
    return _load(_CLASSES[name][0])


def policy_class(name: str) -> type:
    return _load(_CLASSES[name][1])


def _load(path: str) -> type:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
