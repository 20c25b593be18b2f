"""The table of wam_gym env ids: which suite, which entry point, how to install it.

Each suite is a package whose ``__init__`` is a light header (ids, tasks, instructions;
no gymnasium, no simulator) and whose ``env`` module holds the env class. The registry
imports only headers, so gymnasium's import hook can build it even while an env module
is itself being imported, and registration costs microseconds.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from envs.errors import UnknownEnvError

NAMESPACE = "wam_gym"
_SUITE_MODULES = (
    "envs.metaworld",
    "envs.libero",
    "envs.robosuite",
    "envs.maniskill",
    "envs.robocasa",
    "envs.robotwin",
    "envs.world_model",
)


@dataclass(frozen=True)
class Suite:
    """One benchmark suite and the env ids it registers."""

    name: str  # short name, also the pip extra
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

    @property
    def install(self) -> str:
        return f"pip install 'wam_gym[{self.name}]'"

    def installed(self) -> bool:
        return importlib.util.find_spec(self.simulator_module) is not None

    def episode_steps(self, env_id: str) -> int:
        return self.max_steps_by_id.get(env_id, self.max_episode_steps)


def env_id(name: str, version: int) -> str:
    return f"{NAMESPACE}/{name}-v{version}"


@cache
def suites() -> tuple[Suite, ...]:
    return tuple(importlib.import_module(m).SUITE for m in _SUITE_MODULES)


def all_env_ids() -> dict[str, Suite]:
    return {i: s for s in suites() for i in s.env_kwargs}


def suite_of(env_id_: str) -> Suite:
    """The suite registering ``env_id_``, or an error that suggests near names."""
    table = all_env_ids()
    if env_id_ in table:
        return table[env_id_]
    # Compare names without the namespace, so "MetaWorld-reach-v2" finds "wam_gym/MetaWorld-reach-v3".
    names = {i.removeprefix(f"{NAMESPACE}/"): i for i in table}
    near = [names[n] for n in difflib.get_close_matches(env_id_.removeprefix(f"{NAMESPACE}/"), names, n=3, cutoff=0.6)]
    hint = f" Did you mean {', '.join(near)}?" if near else ""
    raise UnknownEnvError(
        f"unknown env id {env_id_!r}.{hint} List every id with: python -m wam_gym.envs list"
    )


def suite_named(name: str, knob: str = "suite") -> Suite:
    """The suite called ``name`` (Suite.name: libero, metaworld, ...), or a one-line error naming ``knob``."""
    by_name = {suite.name: suite for suite in suites()}
    if name not in by_name:
        raise ValueError(f"{knob}={name!r} is not a suite: choose one of {sorted(by_name)}")
    return by_name[name]


def register_envs() -> None:
    """Register every id with gymnasium (idempotent); its constructor keywords are type-checked on make
    (envs/kwargs.py)."""
    import gymnasium

    from envs.kwargs import CheckedEntry

    for id_, suite in all_env_ids().items():
        if id_ in gymnasium.registry:
            continue
        gymnasium.register(
            id=id_,
            entry_point=CheckedEntry(suite.entry_point, id_),
            kwargs=dict(suite.env_kwargs[id_]),
            max_episode_steps=suite.episode_steps(id_),
        )
