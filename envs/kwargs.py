"""Every registered env's constructor keywords, type-checked where they enter: ``gymnasium.make``.

``gymnasium.make(id, lazy_pixels="false")`` used to reach the constructor as it was: a non-empty string
is true, so lazy pixels turned on and every step's pixels read black. Each id is registered with a
:class:`CheckedEntry` (envs/registry.py), which checks the keywords against the env class's
``__init__`` annotations before it builds the env: one place for every suite. A bool must be a bool,
an int an int (not a bool), a camera list a list of strings (not one string), and so on; an unknown
keyword is refused with the nearest known one. Each message names the id, the keyword and its value.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class EnvKwargError(ValueError):
    """A constructor keyword of a registered env has the wrong type, or does not exist."""


@dataclass(frozen=True)
class CheckedEntry:
    """What gymnasium calls to build a registered id: the env class, its keywords checked first."""

    target: str  # "module:Class", the suite's entry point
    env_id: str

    def env_class(self) -> type:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    @property
    def metadata(self) -> dict[str, Any]:  # gymnasium reads the creator's render modes from here
        return self.env_class().metadata

    def __call__(self, **kwargs: Any):
        env_class = self.env_class()
        check_kwargs(env_class, kwargs, self.env_id)
        return env_class(**kwargs)

    def __str__(self) -> str:
        return self.target


def check_kwargs(env_class: type, kwargs: Mapping[str, Any], env_id: str) -> None:
    """Refuse the first keyword ``env_class(**kwargs)`` does not take, or takes of another type."""
    parameters = inspect.signature(env_class.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return  # takes anything: its own checks judge
    known = [name for name in parameters if name != "self"]
    hints = _hints(env_class)
    for name, value in kwargs.items():
        if name not in parameters:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]}? " if near else ""
            raise EnvKwargError(f"{env_id} takes no keyword {name!r}: {hint}its keywords are {', '.join(known)}")
        expected = hints.get(name)
        if expected is not None and not matches(value, expected):
            raise EnvKwargError(f"{env_id}: {name}={value!r} is {_a(type(value).__name__)}, not {type_name(expected)}: "
                                f"pass {_example(name, expected, parameters[name].default)}")


def _hints(env_class: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(env_class.__init__)
    except (NameError, TypeError):  # an annotation only a type checker can resolve: that class checks its own
        return {}


def matches(value: Any, expected: Any) -> bool:
    """Whether ``value`` is of the annotated type ``expected`` (Any, or a type left unchecked: True)."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, (bool, np.bool_))
    if expected is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if expected is float:
        return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
                and math.isfinite(value))
    if expected is str:
        return isinstance(value, str)
    if origin in (list, tuple, Sequence) or expected in (list, tuple, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            return False  # a string is a sequence of strings, never the list of names meant
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(matches, value, args))
        return not args or all(matches(v, args[0]) for v in value)
    if origin in (dict, Mapping) or expected in (dict, Mapping):
        return isinstance(value, Mapping)
    return True


def type_name(expected: Any) -> str:
    """``int | Sequence[int]`` -> "an int or a list of int"."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if expected is type(None):
        return "None"
    if origin in (list, tuple, Sequence):
        return f"a list of {args[0].__name__}" if args and isinstance(args[0], type) else "a list"
    if origin in (dict, Mapping):
        return "a dict"
    return _a(expected.__name__) if isinstance(expected, type) else str(expected)


def _a(name: str) -> str:
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def _example(name: str, expected: Any, default: Any) -> str:
    if expected is bool or bool in typing.get_args(expected):
        return f"{name}=True or {name}=False"
    if default is not inspect.Parameter.empty and default is not None and matches(default, expected):
        shown = list(default) if isinstance(default, tuple) else default
        return f"{type_name(expected)}, e.g. {name}={shown!r}"
    return type_name(expected)
