"""Atomic publish: readers see the old file or directory, or the new one, never a partial one.

Everything is first written under a hidden name (leading ``.``; every scan in the project skips
those) in the target's own directory, because a rename is only atomic within one filesystem.

* :func:`atomic_write` / :func:`atomic_write_text`: one file, written through a file object.
* :func:`atomic_path`: one file written by a tool that needs a path (ffmpeg, say).
* :func:`atomic_dir`: a whole directory (a checkpoint). The old directory stays in place until
  the new one is: on Linux the two are swapped in one ``renameat2(RENAME_EXCHANGE)`` call; where
  that is not available the old one is renamed aside first and :func:`recover_dir` puts it back
  if a kill came between the two renames.
* :func:`check_destination`: the one rule for every command that writes a path the user names: what is
  already there (a file, a directory holding anything) is replaced only when the user said so
  (``--overwrite``), and the refusal comes before any work.
* :func:`writer_lock`: one writer per target. A second command writing the same directory is
  refused, naming the first (its pid, host, command and start), instead of deleting its staging
  directory under it. The lock is the kernel's (``flock``), so a killed holder frees it at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import functools
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(f)`` on a temp file, then move it over ``path``."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a hidden temp path beside ``path``; on a clean exit it replaces ``path``.

    ``suffix`` lets tools that choose a format by extension see one (``".tmp.mp4"``). On an
    error the temp file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        _chmod_like_umask(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


class DestinationExists(FileExistsError):
    """A command was pointed at a path that already holds something, without leave to replace it."""


def check_destination(path: str | os.PathLike, overwrite: bool, flag: str = "--overwrite") -> None:
    """Refuse ``path`` if it holds anything (a file, a link, a non-empty directory) unless ``overwrite``.

    An empty directory is taken as made for the output. Call it before loading or computing anything,
    so a refusal costs nothing; ``flag`` is how the user says "replace it" to this command.
    """
    path = Path(path)
    if overwrite or not (path.exists() or path.is_symlink()):
        return
    if path.is_dir() and not path.is_symlink():
        entries = sorted(p.name for p in path.iterdir())
        if not entries:
            return
        held = f"a directory holding {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} ({', '.join(entries[:3])}" \
               f"{', ...' if len(entries) > 3 else ''})"
    else:
        held = "a link" if path.is_symlink() else "a file"
    raise DestinationExists(f"{path} already exists ({held}) and nothing is written over it: write to a new path, "
                            f"or pass {flag} to replace it")


class TargetBusyError(RuntimeError):
    """Another process is writing the same target; ``holder`` says which."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


@contextlib.contextmanager
def writer_lock(target: str | os.PathLike, lock: str | os.PathLike | None = None) -> Iterator[None]:
    """Hold the one-writer lock of ``target`` (a file or directory about to be written) for the block.

    The lock is a file, ``flock``-ed: held by an open file, so a process that dies for any reason
    releases it. While held it names its holder (pid, host, start, command). By default it is
    ``.<name>.lock`` beside the target, removed on release; a ``lock`` path of the caller's (eval's
    ``output_dir/eval.lock``) is kept, emptied. Raises TargetBusyError, naming the holder, when it is
    held: by another process, or by another writer in this one (``flock`` locks open files, not processes).
    """
    target = Path(target).absolute()
    path = Path(lock) if lock is not None else target.with_name(f".{target.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, target)
    try:
        yield
    finally:
        if lock is None:
            path.unlink(missing_ok=True)  # while still held: a waiter that opened it sees a deleted file and retries
        else:
            os.ftruncate(fd, 0)  # released: names nobody
        os.close(fd)


def _acquire(lock: Path, target: Path) -> int:
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that has not said who it is"
            os.close(fd)
            raise TargetBusyError(f"{target} is being written by another writer ({holder}); wait for it to finish "
                                  "or stop it, or write to another path", holder) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:  # not a lock file its holder deleted as we opened it
                break
        os.close(fd)
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {since}: {' '.join(sys.argv)[:300]}\n".encode(), 0)
    return fd


def remove_stale_locks(directory: str | os.PathLike) -> list[str]:
    """Delete the ``.<name>.lock`` files in ``directory`` that no writer holds (a killed writer's); their names."""
    removed = []
    for lock in Path(directory).glob(".*.lock"):
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # held: a writer is at work
        else:
            lock.unlink(missing_ok=True)
            removed.append(lock.name)
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty hidden staging directory; on a clean exit it is published as ``path``.

    On an error the staging directory is removed and ``path`` is left as it was. The target's
    :func:`writer_lock` is held throughout: a second writer is refused, so staging directories found
    beside the target are a killed writer's leftovers, and are removed first.
    """
    final = Path(path)
    with writer_lock(final), _staged(final) as staging:
        yield staging


@contextlib.contextmanager
def _staged(final: Path) -> Iterator[Path]:
    recover_dir(final)
    for stale in final.parent.glob(f".{final.name}.staging-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=final.parent))
    try:
        yield staging
        publish_dir(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_dir(staging: Path, final: Path) -> None:
    """Move the finished directory ``staging`` to ``final``, replacing any old one there."""
    _fsync_tree(staging)
    _chmod_tree_like_umask(staging)
    if final.exists() and _exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # staging now holds the old directory
        fsync_dir(final.parent)
        return
    recover_dir(final)
    old = _aside(final)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(final: str | os.PathLike) -> None:
    """Put back an old directory that a kill left renamed aside (see :func:`publish_dir`)."""
    final = Path(final)
    old = _aside(final)
    if old.is_dir():
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, final)


def remove_dir(path: str | os.PathLike) -> None:
    """Delete a directory so that a kill midway leaves a hidden leftover, never half of it."""
    path = Path(path)
    doomed = path if path.name.startswith(".deleting-") else path.with_name(f".deleting-{path.name}")
    if doomed != path:
        os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def fsync_dir(directory: str | os.PathLike) -> None:
    """Persist a rename itself (matters on power loss, not on a killed process)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _aside(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(directory)


@functools.cache
def _renameat2() -> Callable | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True) if name else None
    return getattr(libc, "renameat2", None)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where that is not supported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (setting it to read it
    would briefly give other threads' files mode 0666)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _chmod_tree_like_umask(directory: Path) -> None:
    """mkdtemp makes the staging directory 0700 and some writers (safetensors) make their files
    0600; a published tree gets what the user's umask gives, like any file they create."""
    mask = _umask()
    directory.chmod(0o777 & ~mask)
    for path in directory.rglob("*"):
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod((0o777 if path.is_dir() else 0o666 | (mode & 0o111)) & ~mask)


def _chmod_like_umask(path: Path) -> None:
    """mkstemp creates files 0600; a published file gets what the user's umask gives."""
    path.chmod(0o666 & ~_umask())
