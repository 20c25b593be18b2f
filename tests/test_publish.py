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


# ------------------------------------------------------------------ one writer per target (issue 39, class 4)
HOLD = textwrap.dedent("""
    import sys, time
    from wam_gym.utils.publish import atomic_dir
    with atomic_dir(sys.argv[1]) as staging:
        (staging / "theirs").write_text("half written")
        print(staging, flush=True)
        time.sleep(120)
""")


def _holder(target: Path) -> tuple[subprocess.Popen, Path]:
    """Another process in the middle of publishing ``target``; its staging directory."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    return proc, Path(proc.stdout.readline().strip())


def test_a_second_writer_is_refused_naming_the_first_and_leaves_its_staging(tmp_path):
    target = tmp_path / "ckpt"
    proc, staging = _holder(target)
    try:
        with pytest.raises(publish.TargetBusyError, match=rf"ckpt is being written by another writer \(pid {proc.pid} "
                                                          r"on \S+, since .*: .*\); wait for it to finish or stop it"):
            with atomic_dir(target):
                pass
        assert (staging / "theirs").read_text() == "half written"  # before, the second writer deleted it
    finally:
        proc.kill()
        proc.wait()
    with atomic_dir(target) as mine:  # a killed holder frees the lock at once; its staging is a leftover now
        (mine / "ours").write_text("whole")
    assert _tree(target) == {"ours": "whole"} and not staging.exists()
    assert _visible(tmp_path) == ["ckpt"] and sorted(os.listdir(tmp_path)) == ["ckpt"]  # no lock file, no staging


def test_a_kept_lock_file_names_nobody_once_released_and_refuses_a_second_writer_in_the_same_process(tmp_path):
    lock = tmp_path / "out" / "eval.lock"
    with publish.writer_lock(tmp_path / "out", lock=lock):
        assert lock.read_text().startswith(f"pid {os.getpid()} on ")
        with pytest.raises(publish.TargetBusyError, match=rf"out is being written by another writer \(pid {os.getpid()} "):
            with publish.writer_lock(tmp_path / "out", lock=lock):
                pass
    assert lock.read_text() == ""


COLLECT = textwrap.dedent("""
    import sys, time
    from training.data import DatasetWriter
    writer = DatasetWriter(sys.argv[1], 10, ("cam",), overwrite=True)  # collect --overwrite, mid-way
    print(writer.root, flush=True)
    time.sleep(120)
""")


def test_a_second_convert_or_collect_into_the_same_place_is_refused(tmp_path):
    """convert publishes its destination and DatasetWriter (collect) holds its root: a second one into the same
    place stops, naming the first, where it used to delete the first's files under it."""
    import numpy as np

    from training.data import DatasetWriter
    from training.data.lerobot.convert import convert

    src = tmp_path / "src"
    with DatasetWriter(src, 10, ("cam",)) as writer:
        writer.add_frame({"cam": np.zeros((8, 8, 3), np.uint8)}, np.zeros(2), np.zeros(2), "hold")
        writer.save_episode()
    converting, staging = _holder(tmp_path / "dst")
    collecting = subprocess.Popen([sys.executable, "-c", COLLECT, str(tmp_path / "other")], stdout=subprocess.PIPE,
                                  text=True, cwd=ROOT)
    collecting.stdout.readline()
    try:
        with pytest.raises(publish.TargetBusyError, match=rf"dst is being written by another writer \(pid "
                                                          rf"{converting.pid} "):
            convert(src, tmp_path / "dst")
        assert staging.exists()
        with pytest.raises(publish.TargetBusyError, match=rf"other is being written by another writer \(pid "
                                                          rf"{collecting.pid} "):
            DatasetWriter(tmp_path / "other", 10, ("cam",), overwrite=True)
    finally:
        for proc in (converting, collecting):
            proc.kill()
            proc.wait()
    DatasetWriter(tmp_path / "other", 10, ("cam",), overwrite=True).abort()  # free once its holder is gone
