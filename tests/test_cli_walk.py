"""Every command-line entry point, walked with bad inputs: each refuses in one line, before any work.

A row runs a real ``python -m MODULE ...`` (or ``python scripts/X.py ...``) in an empty working
directory and asserts: a non-zero exit, no ``Traceback`` on stderr, exactly one ``error:`` line and it
is the last (``error: ...`` or argparse's ``prog: error: ...``), and nothing written in the working
directory. The inputs are chosen to fail fast: a refusal must come before a model loads or a simulator
starts, so each row takes the seconds of its imports (two run at a time; the whole walk ~2-3 minutes).

``test_every_entry_point_is_walked`` finds the entry points (``__main__.py`` modules and files with
``if __name__ == "__main__":`` under wam_gym/, training/ and scripts/) and requires a row for each, and
one for each subcommand, except the developer scripts in ``EXEMPT``, each with the reason.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARALLEL = 2  # this machine's cores: more only queue on them
ROW_TIMEOUT_S = 60  # a refusal takes the seconds of imports; a row still running after this started the work
ERROR_LINE = re.compile(r"^(?:\S[^:]*: )?error: \S")  # `error: ...`, or argparse's `prog: error: ...`


@dataclass(frozen=True)
class Row:
    id: str
    entry: str  # a module (``python -m entry``) or a script path relative to the repository (``python entry``)
    args: tuple[str, ...]  # {file} a text file, {dir} an empty folder, {missing} no such path, {busy_port} a bound port


def row(id_: str, entry: str, *args: str) -> Row:
    return Row(id_, entry, args)


WAM = "EVALUATION.agent=wam"
PY_POLICY = ("EVALUATION.agent=python", "EVALUATION.policy=tests.example_policy:make_policy")

ROWS = [
    # --- python -m wam_gym.eval
    row("eval-unknown-knob", "wam_gym.eval", "EVALUATION.num_trialz=3"),
    row("eval-zero-trials", "wam_gym.eval", "EVALUATION.num_trials=0"),
    row("eval-huge-trials", "wam_gym.eval", "EVALUATION.num_trials=1000000000"),
    row("eval-missing-ckpt", "wam_gym.eval", WAM, "ckpt={missing}"),
    row("eval-ckpt-is-a-file", "wam_gym.eval", WAM, "ckpt={file}"),
    row("eval-empty-output-dir", "wam_gym.eval", "EVALUATION.agent=random", "EVALUATION.output_dir="),
    row("eval-remote-url-without-port", "wam_gym.eval", "EVALUATION.agent=remote", "REMOTE.url=ws://localhost"),
    # --- python -m wam_gym.serve
    row("serve-unknown-knob", "wam_gym.serve", "SERVE.prot=8000"),
    row("serve-port-out-of-range", "wam_gym.serve", *PY_POLICY, "SERVE.port=70000"),
    row("serve-port-in-use", "wam_gym.serve", *PY_POLICY, "SERVE.host=127.0.0.1", "SERVE.port={busy_port}"),
    row("serve-missing-ckpt", "wam_gym.serve", "ckpt={missing}"),
    # --- python -m wam_gym.world_model
    row("wm-eval-zero-trials", "wam_gym.world_model", "--world-model", "{dir}", "--detector", "d", "--output", "o",
        "--policy", "expert", "--policy", "random", "--trials", "0"),
    row("wm-eval-huge-steps", "wam_gym.world_model", "--world-model", "{dir}", "--detector", "d", "--output", "o",
        "--policy", "expert", "--policy", "random", "--steps", "100000000"),
    row("wm-eval-detector-is-a-file", "wam_gym.world_model", "--world-model", "{dir}", "--detector", "{file}",
        "--output", "o", "--policy", "expert", "--policy", "random"),
    row("wm-eval-unimportable-policy", "wam_gym.world_model", "--world-model", "{dir}", "--detector", "d",
        "--output", "o", "--policy", "expert", "--policy", "python=no_such_module:make"),
    row("wm-eval-missing-world-model", "wam_gym.world_model", "--world-model", "{missing}", "--detector", "d",
        "--output", "o", "--policy", "expert", "--policy", "random"),
    row("wm-eval-unknown-flag", "wam_gym.world_model", "--trails", "3"),
    row("wm-eval-empty-output", "wam_gym.world_model", "--world-model", "{dir}", "--detector", "d", "--output", "",
        "--policy", "expert", "--policy", "random"),
    # --- python -m wam_gym.compare
    row("compare-missing-run", "wam_gym.compare", "{missing}", "{missing}"),
    row("compare-run-is-a-file", "wam_gym.compare", "{file}", "{file}"),
    row("compare-empty-run", "wam_gym.compare", "", ""),
    row("compare-level-out-of-range", "wam_gym.compare", "{dir}", "{dir}", "--level", "2"),
    # --- python -m wam_gym.envs
    row("envs-list-unknown-suite", "wam_gym.envs", "list", "--suite", "metawrld"),
    row("envs-check-unknown-id", "wam_gym.envs", "check", "wam_gym/MetaWorld-pick-plac-v3"),
    row("envs-check-negative-steps", "wam_gym.envs", "check", "wam_gym/MetaWorld-reach-v3", "--steps", "-1"),
    row("envs-check-huge-steps", "wam_gym.envs", "check", "wam_gym/MetaWorld-reach-v3", "--steps", "1000000000"),
    row("envs-check-string-bool", "wam_gym.envs", "check", "wam_gym/MetaWorld-reach-v3", "--kwarg", "lazy_pixels=yes"),
    row("envs-check-unknown-kwarg", "wam_gym.envs", "check", "wam_gym/MetaWorld-reach-v3", "--kwarg", "image_sise=32"),
    # --- python -m wam_gym.demo
    row("demo-zero-trials", "wam_gym.demo", "--trials", "0"),
    row("demo-output-is-a-file", "wam_gym.demo", "--output", "{file}"),
    row("demo-unknown-flag", "wam_gym.demo", "--quik"),
    row("demo-empty-output", "wam_gym.demo", "--output", ""),
    # --- python -m training
    row("train-unknown-knob", "training", "task=metaworld_tiny", "max_stepz=3"),
    row("train-zero-steps", "training", "task=metaworld_tiny", "max_steps=0"),
    row("train-missing-dataset", "training", "task=metaworld_tiny", "dataset.root={missing}"),
    row("train-dataset-is-a-file", "training", "task=metaworld_tiny", "dataset.root={file}"),
    row("train-empty-output-dir", "training", "task=metaworld_tiny", "output_dir="),
    row("train-huge-workers", "training", "task=metaworld_tiny", "num_workers=100000"),
    # --- python -m training.datasets
    row("datasets-check-missing", "training.datasets", "check", "{missing}"),
    row("datasets-info-file", "training.datasets", "info", "{file}"),
    row("datasets-check-empty-dir", "training.datasets", "check", "{dir}"),
    row("datasets-convert-missing-src", "training.datasets", "convert", "{missing}", "out"),
    row("datasets-convert-zero-gop", "training.datasets", "convert", "{dir}", "out", "--video-gop", "0"),
    # --- python -m training.collect
    row("collect-zero-episodes", "training.collect", "--env", "wam_gym/MetaWorld-reach-v3", "--episodes", "0",
        "--output", "o"),
    row("collect-unknown-env", "training.collect", "--env", "wam_gym/MetaWorld-rech-v3", "--output", "o"),
    row("collect-output-is-a-file", "training.collect", "--env", "wam_gym/MetaWorld-reach-v3", "--output", "{file}"),
    row("collect-huge-image", "training.collect", "--env", "wam_gym/MetaWorld-reach-v3", "--image-size", "100000",
        "--output", "o"),
    # --- python -m training.fit_vae
    row("fit-vae-unknown-knob", "training.fit_vae", "stepz=3"),
    row("fit-vae-missing-dataset", "training.fit_vae", "dataset.root={missing}"),
    # --- scripts/convert_fastwam_checkpoint.py
    row("convert-to-ours-missing", "scripts/convert_fastwam_checkpoint.py", "to-ours", "{missing}", "out",
        "--inputs", "fastwam_libero"),
    row("convert-to-ours-text-file", "scripts/convert_fastwam_checkpoint.py", "to-ours", "{file}", "out",
        "--inputs", "fastwam_libero"),
    row("convert-to-theirs-not-a-checkpoint", "scripts/convert_fastwam_checkpoint.py", "to-theirs", "{dir}", "out.pt"),
    row("convert-inspect-folder", "scripts/convert_fastwam_checkpoint.py", "inspect", "{dir}"),
    # --- the other scripts
    row("video-cache-unknown-knob", "scripts/video_cache.py", "max_stepz=3"),
    row("precompute-text-unknown-knob", "scripts/precompute_text_embeds.py", "task=metaworld_tiny", "max_stepz=3"),
    row("imagination-bound-missing-ckpt", "scripts/imagination_bound.py", "--checkpoint", "{missing}"),
    row("imagination-bound-zero-seeds", "scripts/imagination_bound.py", "--checkpoint", "{dir}", "--seeds", "0"),
    row("psnr-missing-video", "scripts/psnr_score.py", "--gt_video", "{missing}", "--pred_video", "{missing}",
        "--output_file", "o.json"),
    row("psnr-video-is-a-folder", "scripts/psnr_score.py", "--gt_video", "{dir}", "--pred_video", "{dir}",
        "--output_file", "o.json"),
    row("wm-interaction-missing-world-model", "scripts/world_model_interaction.py", "--world_model", "{missing}",
        "--dataset", "{missing}", "--replay", "--output_dir", "o"),
    row("wm-interaction-zero-iterations", "scripts/world_model_interaction.py", "--world_model", "{dir}",
        "--dataset", "{dir}", "--replay", "--n_iter", "0", "--output_dir", "o"),
    row("tune-concurrency-unknown-flag", "scripts/tune_eval_concurrency.py", "--benchmark", "x", "--bogus"),
    row("tiny-fastwam-output-is-a-file", "scripts/tiny_fastwam_checkpoint.py", "{file}"),
    row("tiny-fastwam-zero-image", "scripts/tiny_fastwam_checkpoint.py", "out", "--image-size", "0"),
    row("tiny-lingbot-va-output-is-a-file", "scripts/tiny_lingbot_va_release.py", "{file}"),
    row("inspect-lingbot-va-not-a-release", "scripts/inspect_lingbot_va.py", "{dir}"),
    row("export-lingbot-va-output-exists", "scripts/export_lingbot_va_release.py", "{dir}", "{dir}"),
    row("lerobot-crosscheck-missing-dataset", "scripts/lerobot_crosscheck.py", "{missing}", "--lerobot", "{missing}",
        "--work", "w"),
    row("gen-docs-unknown-flag", "scripts/gen_docs.py", "--chek"),
]

# Subcommands each need a row of their own (test_every_entry_point_is_walked reads them from the code too).
SUBCOMMANDS = {
    "wam_gym.envs": ("list", "check"),
    "training.datasets": ("check", "info", "convert"),
    "scripts/convert_fastwam_checkpoint.py": ("to-ours", "to-theirs", "inspect"),
}

EXEMPT = {  # developer scripts, not walked
    "scripts/fastwam_reference.py": "runs in a scratch venv outside the project, on FastWAM's own code",
    "scripts/fastwam_encoders_reference.py": "runs in a scratch venv outside the project, on FastWAM's own code",
    "scripts/lingbot_va_reference.py": "runs outside the project, on LingBot-VA's own code",
    "scripts/lingbot_va_train_reference.py": "runs outside the project, on LingBot-VA's own training code",
    "scripts/build_deepspeed_ops.py": "takes no input: compiles DeepSpeed's CPU ops (make test runs it)",
    "scripts/lerobot/side.py": "runs in LeRobot's venv, driven by scripts/lerobot_crosscheck.py (which is walked)",
}


# ----------------------------------------------------------------------------- running the rows
@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> dict[str, SimpleNamespace]:
    """Every row, two at a time, each in its own empty working directory."""
    inputs = tmp_path_factory.mktemp("inputs")
    (inputs / "file.txt").write_text("not what any command wants\n")
    (inputs / "empty").mkdir()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    values = {"file": str(inputs / "file.txt"), "dir": str(inputs / "empty"), "missing": str(inputs / "no_such_path"),
              "busy_port": str(busy.getsockname()[1])}
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(OMP_NUM_THREADS="1", MUJOCO_GL=env.get("MUJOCO_GL", "egl"), PYTHONPATH=str(ROOT))

    def run(r: Row) -> tuple[str, SimpleNamespace]:
        cwd = tmp_path_factory.mktemp(r.id)
        head = ["-m", r.entry] if not r.entry.endswith(".py") else [str(ROOT / r.entry)]
        argv = [sys.executable, *head, *(a.format(**values) for a in r.args)]
        try:
            done = subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True, timeout=ROW_TIMEOUT_S)
            return r.id, SimpleNamespace(cwd=cwd, returncode=done.returncode, stderr=done.stderr)
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return r.id, SimpleNamespace(cwd=cwd, returncode=None, stderr=f"{stderr}\n(still running after "
                                                                               f"{ROW_TIMEOUT_S} s: killed)")

    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            return dict(pool.map(run, ROWS))
    finally:
        busy.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("r", [pytest.param(r, id=r.id) for r in ROWS])
def test_a_bad_input_is_refused_in_one_line_before_any_work(r: Row, walk):
    run = walk[r.id]
    tail = run.stderr[-2000:]
    assert run.returncode is not None, f"not refused within {ROW_TIMEOUT_S} s: {tail}"
    assert run.returncode != 0, f"exit status 0: {tail}"
    assert "Traceback" not in run.stderr, tail
    lines = run.stderr.strip().splitlines()
    errors = [line for line in lines if ERROR_LINE.match(line)]
    assert lines and errors == [lines[-1]], f"the last stderr line is not the one error line: {tail}"
    written = sorted(str(p.relative_to(run.cwd)) for p in run.cwd.rglob("*"))
    assert not written, f"a refused command wrote {written}"


# ----------------------------------------------------------------------------- coverage of the table
def entry_points() -> set[str]:
    """Every command-line entry point: ``pkg.module`` for modules, ``scripts/...py`` for scripts."""
    found = set()
    for path in [*(ROOT / "wam_gym").rglob("*.py"), *(ROOT / "training").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        relative = path.relative_to(ROOT)
        if relative.parts[0] == "scripts":
            if 'if __name__ == "__main__"' in path.read_text():
                found.add(str(relative))
        elif path.name == "__main__.py":
            found.add(".".join(relative.parts[:-1]))
        elif 'if __name__ == "__main__"' in path.read_text():
            found.add(".".join(relative.with_suffix("").parts))
    return found


def subcommands(entry: str) -> set[str]:
    """The subcommand names ``add_parser("name"`` declares in the entry point's source."""
    return set(re.findall(r'add_parser\(\s*"([\w-]+)"', _source(entry)))


def test_every_entry_point_is_walked():
    walked = {r.entry for r in ROWS}
    found = entry_points()
    assert found - walked - EXEMPT.keys() == set(), "entry points without a row (add one, or exempt it with why)"
    assert walked - found == set(), "rows for entry points that no longer exist"
    assert EXEMPT.keys() <= found, "exempt scripts that no longer exist"
    for entry, names in SUBCOMMANDS.items():
        assert subcommands(entry) <= set(names), f"{entry}: a subcommand is missing from SUBCOMMANDS"
        walked_subs = {r.args[0] for r in ROWS if r.entry == entry and r.args}
        assert set(names) <= walked_subs, f"{entry}: subcommands without a row: {set(names) - walked_subs}"


def test_subcommand_entry_points_are_known():
    """Every entry point that declares subcommands is in SUBCOMMANDS (each then needs a row per subcommand)."""
    with_subcommands = {e for e in entry_points() - EXEMPT.keys() if subcommands(e) or "add_subparsers" in _source(e)}
    assert with_subcommands <= SUBCOMMANDS.keys()


def _source(entry: str) -> str:
    if entry.endswith(".py"):
        return (ROOT / entry).read_text()
    path = ROOT / Path(*entry.split("."))
    return (path / "__main__.py").read_text() if path.is_dir() else path.with_suffix(".py").read_text()
