"""Suites from packages outside the repo: the entry-point group ``wam_gym.suites`` and ``envs.register_suite``.

The example package is examples/tinybench, whose files docs/evaluate/add-a-benchmark.md shows (scripts/gen_docs.py
copies them in; its --check keeps them the same): a header that imports envs, an env module that imports
collections.abc, numpy, gymnasium, envs.contract and tinybench itself. Here it is copied outside the repository,
installed by pip into a folder of its own, and used from fresh interpreters as a user would: gymnasium.make, then
the page's ``python -m wam_gym.envs list`` and ``check``, and ``python -m wam_gym.eval`` on one of its ids. Broken
plugins are real installed distributions too (a ``.dist-info`` with its ``entry_points.txt``, what
importlib.metadata reads).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

from envs.conformance import ContractError, check_contract
from envs.errors import SuiteHeaderError
from envs.header import check_header
from envs.registry import BUILTIN_SUITES
from envs.suite import Suite

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tinybench"
PAGE = ROOT / "docs" / "evaluate" / "add-a-benchmark.md"
IDS = ["tinybench/Reach-v0", "tinybench/ReachCenter-v0"]


def python(args: list[str], paths: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter with ``paths`` importable after the checkout (whose venv may have wam_gym installed
    from elsewhere)."""
    pythonpath = [str(ROOT), *map(str, paths), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def page_block(test: str) -> str:
    """The page's python block that names ``test`` in its doc-test marker."""
    marker = re.escape(f"<!-- doc-test: tests/test_suite_plugins.py::{test} -->")
    return re.search(rf"{marker}\s*```python[^\n]*\n(.*?)```", PAGE.read_text(), re.S)[1]


# ----------------------------------------------------------------------------- an installed package
MAKE = """
import gymnasium
env = gymnasium.make("tinybench/ReachCenter-v0", image_size=32)
obs, info = env.reset(seed=0)
for steps in range(1, 51):  # straight to the middle: solved well within the step limit
    obs, reward, terminated, truncated, info = env.step(-obs["state"])
    if terminated or truncated:
        break
print(sorted(i for i in gymnasium.registry if i.startswith("tinybench/")))
print(obs["pixels"]["top"].shape, obs["instruction"], info["is_success"], terminated, steps < 50)
print("wam_gym/MetaWorld-reach-v3" in gymnasium.registry)
"""


def install_example(tmp_path: Path) -> Path:
    """pip installs a copy of examples/tinybench (built outside the repo) into a folder; returns the folder."""
    source = shutil.copytree(EXAMPLE, tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                          "--no-build-isolation", "--target", str(site), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert list(site.glob("wam_gym_tinybench-*.dist-info/entry_points.txt")), sorted(p.name for p in site.iterdir())
    return site


def test_a_package_outside_the_repo_adds_a_suite(tmp_path):
    site = install_example(tmp_path)
    made = python(["-c", MAKE], [site], tmp_path)  # no import of envs: gymnasium's import hook registers the ids
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [str(IDS), "(32, 32, 3) move the blue dot to the middle True True True", "True"]

    listed = python(["-m", "wam_gym.envs", "list", "--suite", "tinybench"], [site], tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split()[:3] for line in listed.stdout.splitlines()[1:]]
    assert rows == [[i, "TinyBench", "yes"] for i in IDS]

    checked = python(["-m", "wam_gym.envs", "check", IDS[0]], [site], tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"{IDS[0]}: ok (gymnasium ")
    assert "observation contract kept over 10 steps; cameras {'top': (64, 64, 3)}; state (2,)" in checked.stdout

    evaluated = python(["-m", "wam_gym.eval", "EVALUATION.agent=random", f"MULTIRUN.task_sets=[{IDS[0]}]",
                        "EVALUATION.num_trials=2", f"EVALUATION.output_dir={tmp_path / 'eval'}"], [site], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert list(results["tasks"]) == [IDS[0]] and results["tasks"][IDS[0]]["episodes"] == 2 and results["complete"]


def test_register_suite_adds_a_suite_from_python(tmp_path):
    """The page's block, with the example's source importable but not installed (so no entry point)."""
    again = "\nassert envs.register_suite('tinybench') is envs.register_suite('tinybench')  # again: the same suite\n" \
            "print([s.name for s in envs.suites()].count('tinybench'))\n"
    run = python(["-c", page_block("test_register_suite_adds_a_suite_from_python") + again], [EXAMPLE], tmp_path)
    assert run.returncode == 0, run.stderr
    shapes, count = run.stdout.splitlines()
    assert shapes.startswith("(32, 32, 3) [") and shapes.endswith("move the blue dot onto the red target")
    assert count == "1"


# ----------------------------------------------------------------------------- broken plugins
HEADER = '''"""{doc}"""
from envs import Suite
CAMERAS = ("top",)
SUITE = Suite(name="{name}", title="{name}", entry_point="{name}.env:Env", simulator_module="{name}",
              max_episode_steps=5, env_kwargs={{"{id}": {{}}}})
'''
GOOD_DOC = "A suite.\n\nState (2,): xy.\nAction: Box(-1, 1, (2,)), velocity."


def add_distribution(site: Path, name: str, init: str) -> None:
    """An installed distribution ``name`` whose module ``name`` is ``init``, with a wam_gym.suites entry point."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(init)
    info = site / f"{name}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[wam_gym.suites]\n{name} = {name}\n")


def test_a_broken_plugin_is_skipped_in_one_line_and_the_rest_load(tmp_path):
    site = tmp_path / "site"
    add_distribution(site, "brokenimport", "import no_such_simulator_module\n")
    add_distribution(site, "nostate", HEADER.format(doc="A suite.\n\nAction: Box(2,).", name="nostate",
                                                     id="nostate/Reach-v0"))
    add_distribution(site, "clash", HEADER.format(doc=GOOD_DOC, name="clash", id="wam_gym/MetaWorld-reach-v3"))
    add_distribution(site, "fine", HEADER.format(doc=GOOD_DOC, name="fine", id="fine/Reach-v0"))

    listed = python(["-m", "wam_gym.envs", "list"], [site], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "wam_gym/MetaWorld-reach-v3" in listed.stdout and "fine/Reach-v0" in listed.stdout
    skipped = {line.split()[4]: line for line in listed.stderr.splitlines() if line.startswith("wam_gym: skipped")}
    assert sorted(skipped) == ["brokenimport", "clash", "nostate"], listed.stderr
    for name, line in skipped.items():
        assert f"suite plugin {name} = '{name}' (wam_gym.suites entry point of package '{name}')" in line
        assert line.endswith(f"or uninstall it: pip uninstall {name}")
    assert "ModuleNotFoundError: No module named 'no_such_simulator_module'; see why with: python -c 'import " \
           "brokenimport'" in skipped["brokenimport"]
    assert "its docstring has no line starting 'State': add one" in skipped["nostate"]
    assert "env id 'wam_gym/MetaWorld-reach-v3' is registered by suite 'metaworld'" in skipped["clash"]

    refused = python(["-m", "wam_gym.envs", "check", "nostate/Reach-v0"], [site], tmp_path)
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert last.startswith("error: unknown env id 'nostate/Reach-v0'")
    assert last.endswith("(3 suite plugin(s) failed to load, brokenimport, clash, nostate: the list command says why)")


# ----------------------------------------------------------------------------- the header contract
def header(doc: str = GOOD_DOC, cameras=("top",), **fields) -> types.ModuleType:
    module = types.ModuleType("mybench", doc)
    suite = {"name": "mybench", "title": "MyBench", "entry_point": "mybench.env:Env", "simulator_module": "mybench",
             "max_episode_steps": 5, "env_kwargs": {"mybench/Reach-v0": {}}, **fields}
    module.SUITE, module.CAMERAS = Suite(**suite), cameras
    return module


@pytest.mark.parametrize("module, message", [
    (types.ModuleType("mybench", GOOD_DOC), "defines no SUITE (found NoneType): add SUITE = envs.Suite(...)"),
    (header(name="My Bench"), "SUITE.name='My Bench': give a lower-case name"),
    (header(entry_point="mybench.env.Env"), "give the env class as 'package.module:ClassName'"),
    (header(env_kwargs={}), "SUITE.env_kwargs is empty"),
    (header(env_kwargs={"Reach-v0": {}}), "env id 'Reach-v0': write ids as 'namespace/Name-vN'"),
    (header(env_kwargs={"mybench/Reach-v0": None}), "SUITE.env_kwargs['mybench/Reach-v0'] is not a dict"),
    (header(max_episode_steps=0), "step limit max_episode_steps=0: give a positive int"),
    (header(max_steps_by_id={"mybench/Other-v0": 9}), "max_steps_by_id names 'mybench/Other-v0'"),
    (header(doc="A suite.\n\nState (2,): xy."), "no line starting 'Action'"),
    (header(cameras=None), "it names no cameras: add a docstring line 'Cameras: ...' or a tuple CAMERAS"),
], ids=["no-suite", "name", "entry-point", "no-ids", "id-form", "kwargs", "step-limit", "stray-limit", "no-action",
        "no-cameras"])
def test_a_bad_header_is_refused_naming_the_fix(module, message):
    with pytest.raises(SuiteHeaderError, match=re.escape(message)) as caught:
        check_header(module)
    assert str(caught.value).startswith("suite header 'mybench'") and "\n" not in str(caught.value)


def test_every_builtin_header_keeps_the_contract():
    for name in BUILTIN_SUITES:
        assert check_header(importlib.import_module(name)).name == name.rsplit(".", 1)[1]


# ----------------------------------------------------------------------------- the observation contract
def test_the_contract_check_names_what_breaks_it(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from tinybench.env import TinyBenchEnv

    assert check_contract(TinyBenchEnv(image_size=16), steps=3)["pixels"]["top"].shape == (16, 16, 3)

    class FloatFrames(TinyBenchEnv):
        def _sim_frames(self):
            return {c: f / 255.0 for c, f in super()._sim_frames().items()}

    with pytest.raises(ContractError, match=r"^reset: obs\['pixels'\]\['top'\] is float64 \(16, 16, 3\), not uint8"):
        check_contract(FloatFrames(image_size=16), steps=1)
    grid_state = TinyBenchEnv(image_size=16)
    grid_state.observation_space["state"] = spaces.Box(-1, 1, (2, 1), np.float32)
    with pytest.raises(ContractError, match=r"observation_space\['state'\] is Box.*not a 1-d float32 Box; the contract"):
        check_contract(grid_state, steps=1)
