"""A run's output directory, for training and evaluation alike: one writer at a time, writable,
its identity record and the resume check, and a full disk reported in one line.

* :func:`locked`: one run of a kind per output dir. An ``flock`` on a visible file in it
  (``train.lock``, ``eval.lock``), naming its holder (pid, host, start, command) while held; the
  kernel drops it when the holder dies, so a killed run leaves no stale lock. A second run is
  refused with :class:`OutputDirBusy`, one line naming the dir, the holder and the fix. The name is
  per kind: each names its holder's kind truthfully, and a training and an evaluation write
  disjoint files, so one of each may share a dir; two of one kind would credit or delete each
  other's files. Not hidden: a hidden name reads as an interrupted write's temp file.
* :func:`check_writable`: refuse, before anything starts, a dir that is a file or cannot be written.
* The identity record: a JSON file (``train_config.json``, ``protocol.json``) written atomically
  (:func:`write_record`) and read back as one JSON object or a one-line error (:func:`read_record`).
  Write-once records (training's) resume through :func:`check_resume`: the newest saved record is
  compared with this run's (:func:`differences`: keys both have, less the ones ``ignore`` names),
  a difference is refused (:class:`ResumeMismatchError`) unless allowed, and an allowed one is
  recorded beside the original as ``<name>.resumed-N.json`` (:func:`record_settings`).
  Evaluation's ``protocol.json`` is read and written here too, but compared by
  wam_gym/eval/run_protocol.py: per task where both runs have it, content hashes over paths, a
  field only one side has counts, and an allowed mismatch is kept in the record itself.
* :class:`DiskFullError`: ENOSPC/EDQUOT, or torch's and safetensors' wrappings of a short write
  (:func:`is_disk_full`), re-raised by :func:`disk_full_reported` as one line naming the path, the
  free space, what is kept and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from wam_gym.utils.publish import TargetBusyError, atomic_write_text, writer_lock

log = logging.getLogger(__name__)

TRAIN_LOCK = "train.lock"  # python -m training's; who holds it while held, empty after a clean exit
EVAL_LOCK = "eval.lock"  # python -m wam_gym.eval's


class OutputDirBusy(RuntimeError):
    """Another run of the same kind holds the output dir's lock."""


class ResumeMismatchError(ValueError):
    """A rerun into an output dir whose results were made with other result-changing settings."""


class DiskFullError(OSError):
    """A file could not be written: no space left on the device (or quota). What was written
    before is complete and kept (every write is atomic)."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror  # one line, without "[Errno 28]"

    def __reduce__(self):
        return type(self), (self.strerror,)


# ---------------------------------------------------------------------------------------------- the directory


def check_writable(output_dir: Path, knob: str) -> None:
    """Refuse an output dir that is a file or cannot be written (or created), naming ``knob``."""
    probe = Path(output_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        where = "" if probe == Path(output_dir) else f" ({probe} is a file)"
        raise ValueError(f"{knob}={output_dir} is a file, not a directory{where}: pass a directory path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{knob}={output_dir} is not writable ({probe}: permission denied): "
                         "pass a directory you can write to")


@contextlib.contextmanager
def locked(output_dir: Path, lock_file: str, *, knob: str = "output_dir", what: str = "run",
           error: type[Exception] = OutputDirBusy) -> Iterator[None]:
    """Hold ``output_dir/lock_file`` for the block; when another ``what`` holds it, raise ``error``
    naming the dir by its ``knob``, the holder (pid, host, start, command) and the fix."""
    output_dir = Path(output_dir)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(writer_lock(output_dir, lock=output_dir / lock_file))
        except TargetBusyError as busy:
            raise error(f"{knob}={output_dir} is in use by another {what} ({busy.holder}): wait for it to finish, "
                        f"or use another {knob}") from None
        yield


# ---------------------------------------------------------------------------------------------- the identity record


def write_record(path: Path, record: dict[str, Any], *, sort_keys: bool = False) -> Path:
    """Write ``record`` as indented JSON, atomically: readers see the old file or the new one."""
    return atomic_write_text(path, json.dumps(record, indent=2, sort_keys=sort_keys) + "\n")


def read_record(path: Path, fix: str) -> dict[str, Any]:
    """``path``'s JSON object, or a one-line ValueError ending in ``fix``."""
    try:
        record = json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not readable JSON ({exc}): {fix}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a JSON {type(record).__name__}, not an object: {fix}")
    return record


def saved_records(out: Path, name: str) -> list[Path]:
    """``out/name`` (``train_config.json``), then its ``<stem>.resumed-N.json`` records, oldest first."""
    original = [out / name] if (out / name).is_file() else []
    return original + [p for _, p in _resumed(out, name)]


def _resumed(out: Path, name: str) -> list[tuple[int, Path]]:
    stem = Path(name).stem
    pattern = re.compile(rf"^{re.escape(stem)}\.resumed-(\d+)\.json$")
    return sorted((int(m.group(1)), p) for p in Path(out).glob(f"{stem}.resumed-*.json") if (m := pattern.match(p.name)))


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys (``model.backbone.dim``); an empty dict stays a value."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(saved: dict[str, Any], current: dict[str, Any],
                ignore: Callable[[str], bool] = lambda key: False) -> list[tuple[str, Any, Any]]:
    """(key, saved, current) for every dotted key both records have that differs, in ``current``'s
    order, less those ``ignore`` names. A key only one side has is skipped: a record written before
    a setting existed says nothing about it."""
    old, new = flatten(saved), flatten(current)
    return [(k, old[k], v) for k, v in new.items() if k in old and old[k] != v and not ignore(k)]


def and_more(names: list[str]) -> str:
    """The rest of a one-line list of differences: `` (and 2 more: a, b)``, at most three named."""
    if not names:
        return ""
    return f" (and {len(names)} more: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"


def check_resume(out: Path, name: str, current: dict[str, Any], *, allow: bool, ignore: Callable[[str], bool],
                 refusal: Callable[[Path, list[tuple[str, Any, Any]]], str]) -> list[tuple[str, Any, Any]]:
    """Refuse to resume ``out`` with other settings than its newest saved ``name`` record.

    Reads only. ``refusal(saved_path, diffs)`` words the :class:`ResumeMismatchError`; ``allow``
    lets the differences through (logged) instead. Returns them (empty when the settings match)."""
    saved = saved_records(out, name)
    if not saved:
        log.warning("%s has no %s: resuming without comparing settings", out, name)
        return []
    recorded = read_record(saved[-1], "delete it to resume without comparing settings, or use another output dir")
    diffs = differences(recorded, current, ignore)
    if diffs and not allow:
        raise ResumeMismatchError(refusal(saved[-1], diffs))
    for key, old, new in diffs:
        log.warning("resuming %s despite %s=%r (was %r): the mismatch was allowed", out, key, new, old)
    return diffs


def record_settings(out: Path, name: str, record: dict[str, Any], *, resuming: bool, mismatched: bool) -> Path | None:
    """Record a run's settings without ever overwriting the original ``out/name``.

    A new run writes it (over one a run without results left) and drops the records of the run it
    replaces; a resume with allowed differences adds the next ``<stem>.resumed-N.json``; a
    matching resume writes nothing."""
    saved = saved_records(out, name)
    if not resuming:
        for old in saved[1:]:  # the records of a run this one replaces
            old.unlink()
        return write_record(out / name, record)
    if mismatched or not saved:
        n = 1 + max((n for n, _ in _resumed(out, name)), default=0)
        return write_record(out / f"{Path(name).stem}.resumed-{n}.json" if saved else out / name, record)
    return None


# ---------------------------------------------------------------------------------------------- a full disk

_FULL_PATTERNS = ("no space left on device", "storagefull", "unexpected pos", "file write failed", "os error 28")


def is_disk_full(exc: BaseException | None) -> bool:
    """ENOSPC/EDQUOT, or torch's (``unexpected pos``, ``file write failed``) or safetensors'
    (``StorageFull``) wrapping of a short write, anywhere in the exception's chain."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(p in str(exc).lower() for p in _FULL_PATTERNS):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


@contextlib.contextmanager
def disk_full_reported(path: Path, out: Path, *, kept: str, fix: str) -> Iterator[None]:
    """Re-raise a full disk while writing ``path`` as one :class:`DiskFullError` line: the path,
    the free space where ``out`` is, the cause, what is ``kept``, and the ``fix``."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, DiskFullError) or not is_disk_full(exc):
            raise
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip()
        cause = text.splitlines()[0][:200] if text else ""
        raise DiskFullError(f"no space left on device writing {path} ({free_space(Path(out))} free; "
                            f"{type(exc).__name__}{': ' + cause if cause else ''}; {kept}): {fix}") from exc


def free_space(path: Path) -> str:
    """The free space of the filesystem ``path`` (or its nearest existing parent) is on, in MiB."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return f"{shutil.disk_usage(candidate).free / 2**20:.0f} MiB"
    return "unknown"
