"""Docs that cannot rot: the site builds strictly, generated pages are current, and every command runs.

- docs/reference/*.md are generated from the code by ``python scripts/gen_docs.py``; a stale page fails
  here with that command.
- ``mkdocs build --strict`` succeeds: a broken link or anchor, a nav entry without its page or a page
  left out of the nav fails it (mkdocs.yml's ``validation``).
- Every fenced ``bash`` / ``sh`` / ``shell`` / ``console`` / ``python`` / ``py`` block of README.md and
  docs/**/*.md (but docs/reference/, which is generated) has exactly one marker directly above it
  (blank lines may come between):

      <!-- doc-test: run -->
          this file runs the block and expects exit status 0 within 120 s (blocks of the same code
          run once, for all their places): bash blocks with
          ``bash -euo pipefail -c`` from the repo root, this venv first on PATH and MUJOCO_GL=egl
          (``console`` blocks: their ``$ `` lines); python blocks with this interpreter's ``-c``.
      <!-- doc-test: tests/test_x.py::test_name -->
          that test runs what the block shows (in the suite, not here): the file must define it and
          name each ``python -m`` module, script (by path or name) and ``make`` target of the block
          (python blocks: each module it imports).
      !!! note "Not run in the tests"
          Needs a GPU.
          a visible note; the indented line(s) under it say why (a GPU, the Hugging Face hub, ...).
      > **Not run in the tests:** Needs a GPU.
          the same note as a Markdown blockquote, for pages GitHub renders (README.md): GitHub shows
          mkdocs' admonitions as raw text. The reason follows on the same line or the quote's next ones.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 120
SHELL_LANGS = {"bash", "sh", "shell", "console"}
PYTHON_LANGS = {"python", "py"}
RUN = "<!-- doc-test: run -->"
TESTED = re.compile(r"<!-- doc-test: (?P<file>tests/\S+\.py)::(?P<test>\w+) -->")
NOTE = '!!! note "Not run in the tests"'
QUOTE_NOTE = "**Not run in the tests:**"  # as a blockquote's first words: > **Not run in the tests:** reason
# programs that run another entry point (found by its -m, script or target) or name none of their own
LAUNCHERS = {"bash", "sh", "env", "time", "exec", "sudo", "torchrun", "deepspeed", "accelerate", "make", "cd",
             "export", "echo", "cat", "mkdir", "rm", "cp", "mv", "ls", "set", "source", ".", "kill", "wait",
             "sleep", "curl", "git", "pip", "head", "tail", "test", "[", "for", "do", "done", "if", "then", "fi"}
OPTIONS = (f"put one of these directly above it: {RUN} (the tests run it); "
           "<!-- doc-test: tests/test_x.py::test_name --> (that test runs it); "
           f'or the note {NOTE} with the reason on the next, indented line (e.g. "    Needs a GPU."), '
           f"in README.md the blockquote > {QUOTE_NOTE} with the reason after it")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repo root
    line: int  # of the opening fence, from 1
    lang: str
    code: str
    markers: tuple[str, ...]  # what stands directly above it: "run", "tests/x.py::t", "note"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


# ----------------------------------------------------------------------------- reading the pages
def doc_pages() -> list[Path]:
    docs = ROOT / "docs"
    pages = [p for p in sorted(docs.rglob("*.md")) if (docs / "reference") not in p.parents]
    return [ROOT / "README.md", *pages]


def markers_above(lines: list[str], i: int) -> tuple[str, ...]:
    """The markers stacked directly above line ``i`` (blank lines between allowed), nearest first."""
    found, k = [], i - 1
    while True:
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k < 0:
            return tuple(found)
        text = lines[k].strip()
        if text.startswith("<!-- doc-test:"):
            match = TESTED.fullmatch(text)
            found.append("run" if text == RUN else f"{match['file']}::{match['test']}" if match else f"bad: {text}")
            k -= 1
            continue
        if text.startswith(">"):  # a blockquote note: its first words the title, then the reason
            top = k
            while top > 0 and lines[top - 1].strip().startswith(">"):
                top -= 1
            quote = " ".join(line.strip()[1:].strip() for line in lines[top:k + 1])
            if quote.startswith(QUOTE_NOTE) and quote[len(QUOTE_NOTE):].strip():
                found.append("note")
                k = top - 1
                continue
            return tuple(found)
        top = k  # a note: indented reason lines under the admonition line
        while top >= 0 and lines[top].strip() and lines[top][:1] in " \t" and lines[top].strip() != NOTE:
            top -= 1
        indent = len(lines[top]) - len(lines[top].lstrip()) if top >= 0 else 0
        reason_indent = len(lines[k]) - len(lines[k].lstrip())
        if top < k and top >= 0 and lines[top].strip() == NOTE and reason_indent > indent:
            found.append("note")
            k = top - 1
            continue
        return tuple(found)


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    lines, out, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        opening = re.match(r"^\s*(`{3,}|~{3,})\s*\{?\.?([\w+-]*)", lines[i])
        if not opening:
            i += 1
            continue
        fence = opening[1]
        end = i + 1
        while end < len(lines) and not re.fullmatch(rf"\s*{fence[0]}{{{len(fence)},}}\s*", lines[end]):
            end += 1
        lang = opening[2].lower()
        if lang in SHELL_LANGS | PYTHON_LANGS:
            code = textwrap.dedent("\n".join(lines[i + 1:end]))
            out.append(Block(str(path.relative_to(root)), i + 1, lang, code, markers_above(lines, i)))
        i = end + 1
    return out


BLOCKS = [b for page in doc_pages() for b in blocks_of(page)]


def commands(block: Block) -> list[str]:
    """The command lines of a shell block: continuations joined, ``console`` output left out."""
    text = re.sub(r"\\\n", " ", block.code)
    lines = text.splitlines()
    if block.lang == "console":
        return [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def entry_points(block: Block) -> list[tuple[str, ...]]:
    """What a test must name for each entry point of the block, as alternatives: a ``python -m``
    module, a script of the repo (its path or its name, as tests' ``load_script`` takes it), a
    ``make`` target, an installed command (``vla-eval``); for a python block, each module it imports."""
    found = []
    if block.lang in PYTHON_LANGS:
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.Import):
                found += [(alias.name,) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.append((node.module,))
        return found
    for line in commands(block):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        program = next((w for w in words if not re.match(r"\w+=", w)), "")
        name = Path(program).name
        if name and name not in LAUNCHERS and not name.startswith("python") and not name.endswith((".py", ".sh")):
            found.append((name,))  # an installed command: vla-eval, wam-gym-envs, hf
        for k, word in enumerate(words):
            if word == "-m" and k + 1 < len(words):
                found.append((words[k + 1],))
            elif word.endswith((".py", ".sh")) and (ROOT / word.removeprefix("./")).is_file():
                found.append((word.removeprefix("./"), Path(word).stem))
            elif Path(word).name == "make":
                args = itertools.takewhile(lambda w: w not in ("&&", "||", ";", "|"), words[k + 1:])
                targets = [w for w in args if not w.startswith("-") and "=" not in w]
                found += [(targets[0],)] if targets else [("make",)]
    return found


# ----------------------------------------------------------------------------- generated pages and the site
def test_generated_pages_are_current():
    run = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    if run.returncode:
        pytest.fail(run.stderr.strip()[-3000:], pytrace=False)


def test_check_names_a_stale_page_and_the_command(tmp_path, monkeypatch, capsys):
    gen_docs = load_script("gen_docs")
    monkeypatch.setattr(gen_docs, "ROOT", tmp_path)
    monkeypatch.setattr(gen_docs, "PAGES", {"docs/reference/x.md": lambda: gen_docs.HEADER + "# X\n"})
    assert gen_docs.main(["--check"]) == 1
    assert "docs/reference/x.md; regenerate them with: python scripts/gen_docs.py" in capsys.readouterr().err
    assert gen_docs.main([]) == 0 and gen_docs.main(["--check"]) == 0
    assert (tmp_path / "docs/reference/x.md").read_text().startswith("<!-- generated by scripts/gen_docs.py")


def test_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed here: pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's notice about MkDocs 2.0, not about these docs
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, env=env)
    problems = [line for line in run.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    if run.returncode:
        pytest.fail("mkdocs build --strict failed; fix these:\n" + "\n".join(problems or [run.stderr[-3000:]]),
                    pytrace=False)


@pytest.mark.parametrize("title", ["Environments", "Configuration", "Bad inputs"])
def test_generated_pages_say_so(title):
    page = {"Environments": "envs", "Configuration": "config", "Bad inputs": "bad-inputs"}[title]
    text = (ROOT / "docs" / "reference" / f"{page}.md").read_text()
    assert text.startswith("<!-- generated by scripts/gen_docs.py; do not edit") and f"\n# {title}\n" in text


def test_installed_suites_have_the_spaces_their_page_gives():
    """The env page reads spaces from each suite's own description; an installed suite is held to it."""
    import envs
    from envs.errors import MissingAssetsError, MissingSimulatorError
    from envs.registry import suites

    page = (ROOT / "docs" / "reference" / "envs.md").read_text()
    checked = []
    for suite in suites():
        if suite.name == "world_model" or not suite.installed():
            continue  # the world model's spaces are its checkpoint's
        env_id = next(iter(suite.env_kwargs))
        try:
            env = envs.make(env_id, image_size=16)
        except (MissingAssetsError, MissingSimulatorError):
            continue
        section = page.split(f"\n## {suite.title}\n", 1)[1].split("\n## ", 1)[0]
        row = {name: re.search(rf"^\| {name} \| (.*) \|$", section, re.M)[1] for name in ("state", "action")}
        shapes = {"state": env.observation_space["state"].shape, "action": env.action_space.shape}
        env.close()
        for name, shape in shapes.items():
            assert str(shape) in row[name], f"{env_id}: {name} is {shape}, the page says {row[name]!r}"
        checked.append(suite.name)
    assert checked, "no suite is installed here to check the env page against"


# ----------------------------------------------------------------------------- code blocks
def test_every_code_block_is_run_tested_or_says_why_not():
    unmarked = [b.where for b in BLOCKS if not b.markers]
    doubled = [f"{b.where} ({', '.join(b.markers)})" for b in BLOCKS if len(b.markers) > 1]
    bad = [f"{b.where} ({b.markers[0][5:]}: write {RUN} or <!-- doc-test: tests/test_x.py::test_name -->)"
           for b in BLOCKS if b.markers and b.markers[0].startswith("bad: ")]
    problems = ([f"{w}: no marker" for w in unmarked] + [f"{w}: more than one marker" for w in doubled]
                + [f"{w}: unknown marker" for w in bad])
    assert not problems, f"{len(problems)} code block(s) neither run in a test nor say why:\n" + \
        "\n".join(problems) + f"\nFor each, {OPTIONS}"


def _marked(kind: str) -> list:
    want = (lambda m: m == "run") if kind == "run" else (lambda m: "::" in m)
    return [pytest.param(b, id=b.where) for b in BLOCKS if len(b.markers) == 1 and want(b.markers[0])]


@pytest.mark.parametrize("block", _marked("tested"))
def test_block_names_a_test_that_covers_it(block: Block):
    file, test = block.markers[0].split("::")
    path = ROOT / file
    assert path.is_file(), f"{block.where}: its marker names {file}, which does not exist: name a test file"
    source = path.read_text()
    defined = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert test in defined, f"{block.where}: {file} defines no {test}: name a test it defines"
    points = entry_points(block)
    assert points, (f"{block.where}: the block has no python -m module, script or make target that {file} could "
                    f"name: mark it {RUN} or with a note instead")
    missing = [alternatives[0] for alternatives in points if not any(a in source for a in alternatives)]
    assert not missing, f"{block.where}: {file} never names {missing}, so {test} cannot be what runs this block: " \
                        "name the test that runs it"


def _runs() -> list:
    """The blocks to run, one per distinct code: a command shown on two pages (README.md and a docs page, say)
    runs once, under an id naming every place it stands."""
    places: dict[tuple[str, str], list[Block]] = {}
    for block in (p.values[0] for p in _marked("run")):
        places.setdefault((block.lang, block.code), []).append(block)
    return [pytest.param(same[0], id=" = ".join(b.where for b in same)) for same in places.values()]


@pytest.mark.parametrize("block", _runs())
def test_run_block(block: Block):
    if block.lang in PYTHON_LANGS:
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", "\n".join(commands(block)) if block.lang == "console" else block.code]
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""), "MUJOCO_GL": "egl"}
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the block's own children too
            proc.communicate()
            pytest.fail(f"{block.where} ran over {RUN_TIMEOUT_S} s: make it quicker, or mark it as tested elsewhere")
    if proc.returncode:
        pytest.fail(f"{block.where} exited {proc.returncode}:\n{out[-3000:]}", pytrace=False)


# ----------------------------------------------------------------------------- the marker rules themselves
def _blocks(tmp_path: Path, text: str) -> list[Block]:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(text))
    return blocks_of(page, root=tmp_path)


def test_markers_are_read_as_the_convention_says(tmp_path):
    blocks = _blocks(tmp_path, """\
        ```bash
        echo none
        ```

        <!-- doc-test: run -->

        ```console
        $ echo run
        run
        ```

        !!! note "Not run in the tests"
            Needs a GPU.

        ```python
        import torch
        ```

        !!! note "Not run in the tests"

        ```sh
        echo a note without its reason
        ```

        <!-- doc-test: run -->
        <!-- doc-test: tests/test_docs.py::test_run_block -->
        ```bash
        python -m wam_gym.eval benchmark=metaworld && make demo DEMO_DIR=x && scripts/install.sh .venv docs
        ```

        ```text
        not a command
        ```

        > **Not run in the tests:** Needs a GPU;
        > the reason may go on.

        ```bash
        make demo
        ```

        > **Not run in the tests:**

        ```bash
        echo a quoted note without its reason
        ```

        > A quote that is no note.

        ```bash
        echo unmarked
        ```
        """)
    assert [(b.line, b.lang, b.markers) for b in blocks] == [
        (1, "bash", ()), (7, "console", ("run",)), (15, "python", ("note",)), (21, "sh", ()),
        (27, "bash", ("tests/test_docs.py::test_run_block", "run")), (38, "bash", ("note",)), (44, "bash", ()),
        (50, "bash", ())]
    assert commands(blocks[1]) == ["echo run"]
    assert entry_points(blocks[2]) == [("torch",)]
    assert entry_points(blocks[4]) == [("wam_gym.eval",), ("demo",), ("scripts/install.sh", "install")]
