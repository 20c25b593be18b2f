"""The package stack: imports only point down.

    wam_gym (serving, evaluation, world-model env, demo, CLIs)
      training
        agents
          envs
    wam_gym.utils: the leaf, usable from every layer, importing none of them

Every import statement counts, also the lazy ones inside functions. A string entry point
(``"wam_gym.world_model.env:WorldModelEnv"`` in a suite table) is not an import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEAF = "wam_gym.utils"
LAYERS = {"envs": 0, "agents": 1, "training": 2, "wam_gym": 3}


def _layer(module: str) -> int | None:
    """The layer of a dotted module name; -1 for the leaf, None for anything else."""
    if module == LEAF or module.startswith(LEAF + "."):
        return -1
    return LAYERS.get(module.split(".")[0])


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _source_files() -> list[Path]:
    return sorted(p for package in LAYERS for p in (ROOT / package).rglob("*.py"))


def upward_imports() -> list[str]:
    offences = []
    for path in _source_files():
        own = _layer(_module_name(path))
        for line, target in _imports(path):
            theirs = _layer(target)
            if theirs is None or own is None:
                continue
            pointing_up = theirs > own
            leaf_reaching_out = own == -1 and theirs != -1  # the leaf may use only itself
            if pointing_up or leaf_reaching_out:
                offences.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    return offences


def test_no_import_points_up_the_stack():
    offences = upward_imports()
    assert not offences, "imports that point up the stack (envs <- agents <- training <- wam_gym):\n" + "\n".join(offences)


@pytest.mark.parametrize("source, expected", [
    ("from training.data.lerobot import LeRobotDataset\n", ["envs/x.py:1: imports training.data.lerobot"]),
    ("def f():\n    import wam_gym.broker\n", ["envs/x.py:2: imports wam_gym.broker"]),
    ("from wam_gym.utils.video import tile\nfrom envs import make\n", []),
])
def test_the_check_sees_lazy_and_leaf_imports(tmp_path, monkeypatch, source, expected):
    fake_root = tmp_path
    (fake_root / "envs").mkdir()
    (fake_root / "envs" / "x.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    assert upward_imports() == expected


def test_the_leaf_imports_no_layer(tmp_path, monkeypatch):
    (tmp_path / "wam_gym" / "utils").mkdir(parents=True)
    (tmp_path / "wam_gym" / "utils" / "x.py").write_text("from agents.wam import policy\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports() == ["wam_gym/utils/x.py:1: imports agents.wam"]
