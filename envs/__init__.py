"""Benchmark suites as registered, vectorized gymnasium environments.

``gymnasium.make("wam_gym/MetaWorld-pick-place-v3")`` works after ``pip install`` with no
import (see ``wam_gym/gym_hook.py``). This package adds id checking with suggestions and a
vector-env helper that never forks a process holding a GL context.

A benchmark outside this repository joins with :func:`register_suite`, or on its own install through an
entry point of the group ``wam_gym.suites`` (envs/plugins.py; docs/evaluate/add-a-benchmark.md).
"""

from __future__ import annotations

from typing import Any

from envs.errors import MissingAssetsError, MissingSimulatorError, SuiteHeaderError, UnknownEnvError
from envs.registry import all_env_ids, register_envs, register_suite, suite_of, suites
from envs.suite import Suite, env_id

__all__ = [
    "MissingAssetsError",
    "MissingSimulatorError",
    "Suite",
    "SuiteHeaderError",
    "UnknownEnvError",
    "all_env_ids",
    "env_id",
    "make",
    "make_vec",
    "register_envs",
    "register_suite",
    "suite_of",
    "suites",
]


def make(env_id: str, **kwargs: Any):
    """``gymnasium.make`` for a wam_gym id, with a suggestion when the id is misspelt."""
    import gymnasium

    suite_of(env_id)
    register_envs()
    return gymnasium.make(env_id, **kwargs)


MAX_NUM_ENVS = 1024  # copies of one env in one vector: more is a typo (each holds a simulator and its GL context)
MAKE_KEYWORDS = ("max_episode_steps", "disable_env_checker")  # gymnasium.make's own keywords, not the env's


def _check_vector_args(env_id: str, num_envs: int, mode: str, context: str, kwargs: dict[str, Any]) -> None:
    """Here, not in each async worker (whose error would come back as a worker's traceback)."""
    from envs.kwargs import CheckedEntry, check_kwargs

    suite = suite_of(env_id)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or not 1 <= num_envs <= MAX_NUM_ENVS:
        raise ValueError(f"num_envs={num_envs!r}: give an int in [1, {MAX_NUM_ENVS}]")
    if mode not in ("async", "sync"):
        raise ValueError(f"vectorization_mode={mode!r}: choose 'async' (a process per env) or 'sync' (one process)")
    if mode == "async" and context not in ("forkserver", "spawn"):
        raise ValueError(f"context={context!r}: choose 'forkserver' (the default) or 'spawn'; a forked worker "
                         "inherits its parent's GL context and renders garbage or crashes")
    env_kwargs = {k: v for k, v in kwargs.items() if k not in MAKE_KEYWORDS}
    check_kwargs(CheckedEntry(suite.entry_point, env_id).env_class(), env_kwargs, env_id)


def make_vec(
    env_id: str,
    num_envs: int,
    vectorization_mode: str = "async",
    context: str = "forkserver",
    autoreset: bool = False,
    **kwargs: Any,
):
    """A VectorEnv of ``num_envs`` copies, set up for evaluation.

    Async workers start with forkserver (never fork), and each builds its env and GL context
    itself on first reset. Autoreset is off by default so that every episode can be started
    with its own seed (see wam_gym.eval.rollout.run_episodes).
    """
    import gymnasium
    from gymnasium.vector import AutoresetMode

    _check_vector_args(env_id, num_envs, vectorization_mode, context, kwargs)
    register_envs()
    mode = AutoresetMode.NEXT_STEP if autoreset else AutoresetMode.DISABLED
    vector_kwargs: dict[str, Any] = {"autoreset_mode": mode}
    if vectorization_mode == "async":
        vector_kwargs["context"] = context
    return gymnasium.make_vec(
        env_id, num_envs=num_envs, vectorization_mode=vectorization_mode, vector_kwargs=vector_kwargs, **kwargs
    )
