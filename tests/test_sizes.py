"""No class over 200 lines or 20 methods, no function over 60 lines, in the library (agents, envs, training, wam_gym).

A class past that does several jobs; a function past that does several steps: split it (issue 53). The ones
not split yet are listed in ``NOT_SPLIT_YET`` with their size today, and the list only shrinks: an entry that
grew fails (split it instead of growing it), an entry now within the limits fails (take it off the list), and
anything new past the limits fails. Lines count from the ``def``/``class`` line to the last line of the body;
methods are the functions defined directly in the class body (properties included: each is code to read).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "envs", "training", "wam_gym")
MAX_CLASS_LINES, MAX_METHODS, MAX_FUNCTION_LINES = 200, 20, 60

# "path:qualified name" -> its size today (lines, or (lines, methods) for a class): split these next.
NOT_SPLIT_YET: dict[str, int | tuple[int, int]] = {
}


def _sizes(tree: ast.AST, prefix: str = "") -> dict[str, int | tuple[int, int]]:
    """Every class and function of a module past the limits: qualified name -> its size."""
    found: dict[str, int | tuple[int, int]] = {}
    for node in ast.iter_child_nodes(tree):
        name = f"{prefix}{getattr(node, 'name', '')}"
        lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) for child in node.body)
            if lines > MAX_CLASS_LINES or methods > MAX_METHODS:
                found[name] = (lines, methods)
            found.update(_sizes(node, f"{name}."))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if lines > MAX_FUNCTION_LINES:
                found[name] = lines
            found.update(_sizes(node, f"{name}."))
    return found


def oversized() -> dict[str, int | tuple[int, int]]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            found.update({f"{module}:{name}": size for name, size in _sizes(ast.parse(path.read_text())).items()})
    return found


def test_nothing_new_grows_past_the_limits():
    new = {name: size for name, size in oversized().items() if name not in NOT_SPLIT_YET}
    assert not new, (f"past {MAX_CLASS_LINES} lines or {MAX_METHODS} methods a class, {MAX_FUNCTION_LINES} lines a "
                     f"function: {new}; split them by what they do")


def test_the_ones_not_split_yet_only_shrink():
    found = oversized()
    grew = {name: (size, found[name]) for name, size in NOT_SPLIT_YET.items()
            if name in found and _larger(found[name], size)}
    assert not grew, f"grew (before, now): {grew}; split them instead"
    done = sorted(name for name in NOT_SPLIT_YET if name not in found)
    assert not done, f"within the limits now: take {done} off NOT_SPLIT_YET"


def _larger(now: int | tuple[int, int], before: int | tuple[int, int]) -> bool:
    pairs = zip(now, before) if isinstance(now, tuple) else [(now, before)]
    return any(a > b for a, b in pairs)
