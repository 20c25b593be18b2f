"""The table of env ids: which suite, which entry point, how to install it.

A suite is declared by its header module: a package whose docstring says what its envs observe and take
(envs/header.py) and whose ``SUITE`` lists its ids; its ``env`` module holds the env class. The built-in
suites (``BUILTIN_SUITES``) and those of other packages (entry points of the group ``wam_gym.suites``,
envs/plugins.py) are added the same way, by :func:`register_suite`. The registry imports only headers, so
gymnasium's import hook can build it even while an env module is itself being imported.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from types import ModuleType

from envs.errors import SuiteHeaderError, UnknownEnvError
from envs.header import check_header
from envs.suite import NAMESPACE, Suite

BUILTIN_SUITES = (  # header modules, in the order listings and the env reference show them
    "envs.metaworld",
    "envs.libero",
    "envs.robosuite",
    "envs.maniskill",
    "envs.robocasa",
    "envs.robotwin",
    "envs.world_model",
)


_headers: dict[str, ModuleType] = {}  # suite name -> its header module, in registration order
_plugin_errors: dict[str, str] = {}  # entry-point name -> why that plugin was skipped, one line (envs/plugins.py)
_loaded = False


def _load() -> None:
    """The built-in suites, then the plugins' (once per process)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # first: a plugin's header importing envs.registry must not start this again
    for module in BUILTIN_SUITES:
        _add(importlib.import_module(module))  # a bad built-in header is our bug: raise
    from envs.plugins import load_plugins

    _plugin_errors.update(load_plugins(_add))


def _add(header: ModuleType) -> Suite:
    """Check ``header`` and add its suite; the same header again is a no-op."""
    suite = check_header(header)
    if _headers.get(suite.name) is header:
        return suite
    where = f"suite header {header.__name__!r}"
    if suite.name in _headers:
        raise SuiteHeaderError(f"{where}: the suite name {suite.name!r} is taken by {_headers[suite.name].__name__!r}: "
                               "give SUITE another name")
    taken = all_env_ids()
    clash = [i for i in suite.env_kwargs if i in taken]
    if clash:
        raise SuiteHeaderError(f"{where}: env id {clash[0]!r} is registered by suite {taken[clash[0]].name!r}: give "
                               "the ids your own namespace (envs.env_id(name, version, namespace='yours'))")
    _headers[suite.name] = header
    return suite


def register_suite(header: ModuleType | str) -> Suite:
    """Add a benchmark suite, declared by its header module (or that module's import name), to the registry.

    Its ids then work everywhere the built-in ones do: ``gymnasium.make``, ``envs.make``, ``python -m
    wam_gym.envs list`` / ``check`` and evaluation. A package makes this happen on its own install with an entry
    point of the group ``wam_gym.suites`` naming the header module (docs/evaluate/add-a-benchmark.md). A bad header
    raises :class:`~envs.errors.SuiteHeaderError`, saying what to fix; registering the same header again is a no-op.
    """
    _load()
    suite = _add(importlib.import_module(header) if isinstance(header, str) else header)
    if "gymnasium" in sys.modules:  # gymnasium's import hook already ran: register the new ids now
        register_envs()
    return suite


def suites() -> tuple[Suite, ...]:
    _load()
    return tuple(header.SUITE for header in _headers.values())


def header_module(suite: Suite) -> ModuleType:
    """The header module that declared ``suite`` (its docstring says what the suite's envs observe and take)."""
    _load()
    return _headers[suite.name]


def header_doc(suite: Suite) -> str:
    """The docstring of the header module that declared ``suite`` (what its envs observe and take)."""
    return inspect.getdoc(header_module(suite)) or ""


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
    skipped = (f" ({len(_plugin_errors)} suite plugin(s) failed to load, {', '.join(_plugin_errors)}: the list "
               "command says why)") if _plugin_errors else ""
    raise UnknownEnvError(
        f"unknown env id {env_id_!r}.{hint} List every id with: python -m wam_gym.envs list{skipped}"
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
