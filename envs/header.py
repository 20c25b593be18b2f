"""A suite's header: its package docstring (``envs.<suite>``), whose labelled lines (``State (8,): ...``,
``Action: ...``, ``Pixels: ...``) say what its envs observe and take. The env reference page
(scripts/gen_docs.py) and the policy server's greeting read them here.
"""

from __future__ import annotations

import importlib
import inspect
import re

from envs.registry import Suite


def header_doc(suite: Suite) -> str:
    """The docstring of the package that declares ``suite`` (its entry point's package)."""
    package = suite.entry_point.split(":")[0].rsplit(".", 1)[0]
    return inspect.getdoc(importlib.import_module(package)) or ""


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
