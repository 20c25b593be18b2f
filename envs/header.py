"""A suite's header: the module that declares it to the registry (``envs.<suite>``, or a plugin's package).

What a header holds, and :func:`check_header` asks of every suite, built-in or plugin:

- ``SUITE``: an :class:`envs.suite.Suite` (its name, its ids and their constructor keywords, the env class's
  ``"module:Class"``, its step limit);
- a docstring whose labelled lines say what its envs observe and take: ``State (8,): ...`` and ``Action: ...``,
  and its cameras as a ``Cameras: ...`` (or ``Pixels: ...``) line or a ``CAMERAS`` tuple of every camera name.

The env reference page and a plugin's page (scripts/gen_docs.py) and the policy server's greeting read them here.
A header imports no simulator and no gymnasium: the registry imports every header whenever gymnasium is imported.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from types import ModuleType

from envs.errors import SuiteHeaderError
from envs.suite import Suite

NAME = re.compile(r"[a-z][a-z0-9_]*")  # a suite's name is a --suite / SERVE.suite value and an extra's name
ENTRY_POINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
ENV_ID = re.compile(r"[\w:-]+/[\w:.-]+-v\d+")  # gymnasium's form, with the namespace that keeps ids apart
GUIDE = "docs/evaluate/add-a-benchmark.md"


def labelled(doc: str, label: str) -> str:
    """The first sentence of ``doc`` that starts a line with ``label`` (``State (8,): ...``), lines joined."""
    for paragraph in doc.split("\n\n"):
        lines = paragraph.splitlines()
        for i, line in enumerate(lines):
            if re.match(rf"{label}\b", line):
                return first_sentence(" ".join(lines[i:]))
    return ""


def first_sentence(text: str) -> str:
    """Up to the first full stop outside brackets followed by a space or the end (so ``0.1 m`` and
    ``(e.g. x)`` go on)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            return text[: i + 1]
    return text


def check_header(header: ModuleType) -> Suite:
    """``header``'s suite, or a :class:`SuiteHeaderError` naming the header and what to change (see ``GUIDE``)."""
    where = f"suite header {getattr(header, '__name__', header)!r}"
    suite = getattr(header, "SUITE", None)
    if not isinstance(suite, Suite):
        raise SuiteHeaderError(f"{where} defines no SUITE (found {type(suite).__name__}): add SUITE = envs.Suite(...) "
                               f"to it, as {GUIDE} shows")
    problem = _suite_problem(suite) or _doc_problem(header)
    if problem:
        raise SuiteHeaderError(f"{where}: {problem}")
    return suite


def _suite_problem(suite: Suite) -> str:
    """What is wrong with ``suite``'s fields, and the fix; empty when nothing is."""
    if not NAME.fullmatch(str(suite.name)):
        return f"SUITE.name={suite.name!r}: give a lower-case name of letters, digits and _ (e.g. 'mybench')"
    if not ENTRY_POINT.fullmatch(str(suite.entry_point)):
        return f"SUITE.entry_point={suite.entry_point!r}: give the env class as 'package.module:ClassName'"
    if not isinstance(suite.env_kwargs, Mapping) or not suite.env_kwargs:
        return "SUITE.env_kwargs is empty: map each env id to its constructor keywords, e.g. {'mybench/Reach-v0': {}}"
    bad_id = next((i for i in suite.env_kwargs if not isinstance(i, str) or not ENV_ID.fullmatch(i)), None)
    if bad_id is not None:
        return f"env id {bad_id!r}: write ids as 'namespace/Name-vN' (envs.env_id('Name', N, namespace='yours'))"
    bad_kwargs = next((i for i, kw in suite.env_kwargs.items() if not isinstance(kw, Mapping)), None)
    if bad_kwargs is not None:
        return f"SUITE.env_kwargs[{bad_kwargs!r}] is not a dict: give the id's constructor keywords, or {{}}"
    limits = {"max_episode_steps": suite.max_episode_steps, **dict(suite.max_steps_by_id)}
    bad = next((k for k, v in limits.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1), None)
    if bad is not None:
        return f"step limit {bad}={limits[bad]!r}: give a positive int"
    stray = next((i for i in suite.max_steps_by_id if i not in suite.env_kwargs), None)
    return f"SUITE.max_steps_by_id names {stray!r}, which is not one of its ids" if stray else ""


def _doc_problem(header: ModuleType) -> str:
    """Which labelled line the docstring lacks; empty when none."""
    doc = inspect.getdoc(header) or ""
    for label, example in (("State", "State (4,): end-effector xyz and gripper opening."),
                           ("Action", "Action: Box(-1, 1, (4,)), end-effector xyz delta and gripper effort.")):
        if not labelled(doc, label):
            return f"its docstring has no line starting {label!r}: add one, e.g. {example!r}"
    cameras = getattr(header, "CAMERAS", None)
    if not (labelled(doc, "Cameras") or labelled(doc, "Pixels") or (isinstance(cameras, tuple) and cameras)):
        return ("it names no cameras: add a docstring line 'Cameras: ...' or a tuple CAMERAS = ('front', ...) of "
                "every camera its envs render")
    return ""
