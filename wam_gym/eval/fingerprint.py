"""Content fingerprints: which model, statistics or Python policy a result belongs to, byte for byte.

Every byte of every file that fixes the model is read (a sampled hash missed fine-tunes that touch
only norms or a merged LoRA), so hashing is made cheap by a cache: one small JSON file per hashed
file under ``$WAM_GYM_CACHE/fingerprints/`` (default ``~/.cache/wam_gym/fingerprints/``), holding the
file's SHA-256 and the facts it was hashed under: resolved path, size, mtime_ns, ctime_ns, inode and
device. A later hash of an unchanged file is one ``stat`` and one small read; a touched, rewritten or
replaced file (another inode, even with the same size and mtime) misses and is read again. Entries are
published atomically, so concurrent writers never tear one; an entry that does not parse or does not
match the file is ignored and rewritten, never trusted. An unwritable cache only costs time.

- :func:`file_sha256`: one file's SHA-256 (the statistics file's fingerprint).
- :func:`checkpoint_fingerprint`: a checkpoint directory's files that fix the model (MODEL_FILES).
- :func:`python_fingerprint`: a Python policy (``pkg.module:factory``): its import string and the
  code and config files of its top-level package (POLICY_FILES), or its module file when not in one.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from wam_gym.utils.publish import atomic_write_text

logger = logging.getLogger(__name__)

CACHE_ENV = "WAM_GYM_CACHE"  # the wam_gym cache folder; fingerprints live in its fingerprints/
# A checkpoint's weights, its configs and statistics, its tokenizer's vocabularies (spiece.model, merges.txt).
MODEL_FILES = (".safetensors", ".json", ".txt", ".model")
# A policy's code and the config files next to it (weights it loads from elsewhere are not its code).
POLICY_FILES = (".py", ".json", ".yaml", ".yml", ".toml")
BLOCK = 8 << 20  # bytes read per step: large reads, a bounded buffer
_SHA256 = re.compile(r"[0-9a-f]{64}")


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of every byte of ``path``, from the cache when the file is as it was hashed."""
    with open(path, "rb", buffering=0) as f:
        facts = _facts(path, os.fstat(f.fileno()))  # of the file opened: a rename after this does not matter
        entry = cache_dir() / f"{hashlib.sha256(facts['path'].encode()).hexdigest()[:32]}.json"
        cached = _cached(entry, facts)
        if cached is not None:
            return cached
        digest = _digest(f)
        if _facts(path, os.fstat(f.fileno())) == facts:  # not written to while it was read
            _store(entry, {**facts, "sha256": digest})
    return digest


def checkpoint_fingerprint(ckpt: str | os.PathLike) -> str:
    """Every weights, config, statistics and tokenizer file of a checkpoint directory, at any depth."""
    root = Path(ckpt)
    return _combined((path.relative_to(root).as_posix(), path) for path in _files(root, MODEL_FILES))


def python_fingerprint(target: str) -> str:
    """``target`` (``pkg.module`` or ``pkg.module:factory``) and the content of its code: every
    POLICY_FILES file of the module's top-level package folder, at any depth, or the module's file
    alone when it is in no package. Finding it imports its parent packages, not the module."""
    name = target.partition(":")[0]
    try:
        spec, why = importlib.util.find_spec(name), ""
    except (ImportError, ValueError) as exc:  # a parent package that is not there, or fails to import
        spec, why = None, f" ({exc})"
    if spec is None:
        raise ValueError(f"EVALUATION.policy={target!r}: cannot find {name}{why}; install it or put its folder on "
                         "PYTHONPATH")
    if not spec.has_location or not spec.origin:
        raise ValueError(f"EVALUATION.policy={target!r}: {name} has no source file to fingerprint; name a module "
                         "of a file (pkg.module:factory)")
    origin = Path(spec.origin)
    depth = name.count(".") + bool(spec.submodule_search_locations)  # folders from the file up to the top package
    if depth == 0:  # a module in no package: its file alone
        root, files = origin.parent, [origin]
    else:
        root = origin.parents[depth - 1]
        files = sorted({origin, *_files(root, POLICY_FILES)})  # the module's own file whatever its suffix (.so)
    return _combined([("import", target), *((path.relative_to(root).as_posix(), path) for path in files)])


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "wam_gym") / "fingerprints"


def _files(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files under ``root`` with one of ``suffixes``, in path order; hidden ones (a killed write's
    temp files) and __pycache__ are no part of it."""
    return sorted(path for path in root.rglob("*") if path.suffix in suffixes and path.is_file() and not any(
        part.startswith(".") or part == "__pycache__" for part in path.relative_to(root).parts))


def _combined(entries: Iterable[tuple[str, str | Path]]) -> str:
    """One hash of named parts: a file's part is its content's SHA-256, a string is itself."""
    h = hashlib.sha256()
    for name, part in entries:
        h.update(f"{name}\0{file_sha256(part) if isinstance(part, Path) else part}\n".encode())
    return h.hexdigest()


def _facts(path: str | os.PathLike, stat: os.stat_result) -> dict:
    """What a cached hash is valid for: this file (path, inode, device) unchanged (size, mtime, and ctime,
    which a rewrite changes even when it restores the mtime)."""
    return {"path": str(Path(path).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino, "device": stat.st_dev}


def _digest(f) -> str:
    # hashlib.file_digest (3.11+) reads the same way; this loop also runs on 3.10
    h, buffer = hashlib.sha256(), bytearray(BLOCK)
    view = memoryview(buffer)
    while n := f.readinto(buffer):
        h.update(view[:n])
    return h.hexdigest()


def _cached(entry: Path, facts: dict) -> str | None:
    """The entry's hash when it is well formed and made for exactly this file; else None (a miss)."""
    try:
        stored = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or {k: stored.get(k) for k in facts} != facts:
        return None
    digest = stored.get("sha256")
    return digest if isinstance(digest, str) and _SHA256.fullmatch(digest) else None


def _store(entry: Path, record: dict) -> None:
    try:
        atomic_write_text(entry, json.dumps(record, sort_keys=True) + "\n")
    except OSError as exc:
        _warn_unwritable(str(entry.parent), exc.strerror or str(exc))


@functools.cache
def _warn_unwritable(directory: str, why: str) -> None:
    logger.warning("fingerprint cache %s is not writable (%s): every file is read again each time; set %s to a "
                   "writable folder", directory, why, CACHE_ENV)
