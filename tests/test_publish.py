"""Atomic publish of files and directories, with real processes killed mid-publish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from wam_gym.utils import publish
from wam_gym.utils.publish import atomic_dir, atomic_path, atomic_write_text, recover_dir, remove_dir

ROOT = Path(__file__).resolve().parents[1]


def _tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def _visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_atomic_write_text_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a" / "r.json"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert os.listdir(target.parent) == ["r.json"]


def test_atomic_path_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "v.mp4"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target, suffix=".tmp.mp4") as tmp:
        assert tmp.name.startswith(".v.mp4.") and tmp.name.endswith(".tmp.mp4")
        tmp.write_text("half")
        raise RuntimeError("encoder died")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["v.mp4"]


def test_published_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f", "x")
        with atomic_dir(tmp_path / "d") as staging:
            (staging / "w").write_text("x")
            (staging / "sub").mkdir(mode=0o700)
            (staging / "sub" / "private").write_text("x")
            (staging / "sub" / "private").chmod(0o600)  # as safetensors writes its files
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "d" / "sub").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "d" / "sub" / "private").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_atomic_dir_replaces_a_directory(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    target = tmp_path / "checkpoint"
    for version in ("1", "2"):
        with atomic_dir(target) as staging:
            (staging / "weights").write_text(version)
            (staging / "sub").mkdir()
            (staging / "sub" / "config").write_text(version)
    assert _tree(target) == {"sub/config": "2", "weights": "2"}
    assert os.listdir(tmp_path) == ["checkpoint"]


def test_atomic_dir_error_keeps_the_old_directory(tmp_path):
    target = tmp_path / "checkpoint"
    with atomic_dir(target) as staging:
        (staging / "weights").write_text("old")
    with pytest.raises(OSError), atomic_dir(target) as staging:
        (staging / "weights").write_text("half")
        raise OSError("disk full")
    assert _tree(target) == {"weights": "old"}
    assert os.listdir(tmp_path) == ["checkpoint"]


def test_recover_dir_puts_back_an_old_directory_renamed_aside(tmp_path):
    aside = tmp_path / ".checkpoint.old"
    aside.mkdir()
    (aside / "weights").write_text("old")
    recover_dir(tmp_path / "checkpoint")
    assert _tree(tmp_path / "checkpoint") == {"weights": "old"}


def test_remove_dir_renames_before_deleting(tmp_path, monkeypatch):
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-1" / "w").write_text("x")
    seen = []
    monkeypatch.setattr(publish.shutil, "rmtree", lambda p, **kw: seen.append(Path(p).name))
    remove_dir(tmp_path / "step-1")
    assert seen == [".deleting-step-1"] and _visible(tmp_path) == []


# A child process publishes version "new" over version "old" and is SIGKILLed at one point of
# the publish. Whatever the point, `checkpoint/` then holds one whole version, never none.
_CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from wam_gym.utils import publish

    target, point, exchange = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    if not exchange:
        publish._exchange = lambda a, b: False
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace, real_exchange = os.replace, publish._exchange
    if point == "before_swap":  # staging complete, nothing renamed yet
        publish._exchange = die
        publish.os.replace = die
    elif point == "between_renames":  # rename-aside only: the old one is aside, the new not yet in
        calls = []
        def replace(a, b):
            calls.append(a)
            if len(calls) == 2:
                die()
            real_replace(a, b)
        publish.os.replace = replace
    elif point == "before_cleanup":  # new one in place, the old one not yet deleted
        publish.shutil.rmtree = die
    with publish.atomic_dir(target) as staging:
        (staging / "weights").write_text("new")
        (staging / "config").write_text("new")
""")


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
@pytest.mark.parametrize("point", ["before_swap", "between_renames", "before_cleanup"])
def test_a_kill_anywhere_in_a_directory_publish_leaves_a_whole_version(tmp_path, point, exchange):
    if point == "between_renames" and exchange:
        pytest.skip("renameat2 swaps in one call: there is no such window")
    target = tmp_path / "checkpoint"
    with atomic_dir(target) as staging:
        (staging / "weights").write_text("old")
        (staging / "config").write_text("old")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(target), point, "1" if exchange else "0"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    recover_dir(target)  # what every publish (and every loader of a checkpoint) does first
    expected = "new" if point == "before_cleanup" else "old"
    assert _tree(target) == {"config": expected, "weights": expected}
    # Leftovers are hidden, and the next publish clears them.
    assert _visible(tmp_path) == ["checkpoint"]
    with atomic_dir(target) as staging:
        (staging / "weights").write_text("next")
    assert _tree(target) == {"weights": "next"}
    assert os.listdir(tmp_path) == ["checkpoint"]
