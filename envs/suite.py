"""A benchmark suite as data: its name, its env ids and their constructor keywords, its limits.

A suite's header module (envs/header.py says what it holds) defines one ``SUITE``; the registry
(envs/registry.py) collects them. Kept apart from both so a header, the header check and the
registry all import it without importing each other.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NAMESPACE = "wam_gym"


@dataclass(frozen=True)
class Suite:
    """One benchmark suite and the env ids it registers."""

    name: str  # short name (--suite, SERVE.suite); for a built-in suite also the pip extra
    title: str
    entry_point: str  # "module:Class" gymnasium imports on make()
    simulator_module: str  # import name whose presence means "installed"
    max_episode_steps: int
    env_kwargs: Mapping[str, dict[str, Any]]  # env id -> constructor kwargs
    assets: str = ""  # what else must be on disk, and how to get it
    max_steps_by_id: Mapping[str, int] = field(default_factory=dict)
    settle_steps: int = 0  # no-op steps a reset runs before the first observation (objects drop into place)
    image_orientation: str = "upright"  # how its cameras' frames are stored (every suite renders upright)
    # how the field's drivers for this benchmark turn its frames (envs/orientation.py): what openpi's and vla-eval's
    # clients send a policy server, read from their code; the policy server turns them upright from it
    driver_frames: str = "upright"
    lazy_pixels: bool = True  # its envs take lazy_pixels=True (render only when asked; envs/contract.py)
    install_command: str = ""  # how to install its simulator; empty: wam_gym's extra of its name (a plugin sets its own)

    @property
    def install(self) -> str:
        return self.install_command or f"pip install 'wam_gym[{self.name}]'"

    def installed(self) -> bool:
        return importlib.util.find_spec(self.simulator_module) is not None

    def episode_steps(self, env_id: str) -> int:
        return self.max_steps_by_id.get(env_id, self.max_episode_steps)


def env_id(name: str, version: int, namespace: str = NAMESPACE) -> str:
    return f"{namespace}/{name}-v{version}"
