"""A training run's output_dir, besides the checkpoints' contents: the run config and the resume
check, the leftovers of killed saves, and a full disk reported as such.

* ``train_config.json`` is written once, by the run that starts the directory, and never
  overwritten. A rerun resumes only with the same result-changing settings
  (:func:`check_resume`): anything but the bookkeeping knobs (:data:`BOOKKEEPING`) and the
  dataset's identity (its ``meta/info.json``, not its path). ``allow_resume_mismatch=true``
  resumes anyway and records the new settings in ``train_config.resumed-N.json``; the next rerun
  is compared with the newest such record. ``resume=false`` starts over: the old step
  checkpoints are deleted (a later resume must never mix them with the new run's).
* :func:`clean_leftovers` removes what a killed save left (hidden staging, ``.deleting-*``,
  ``.checkpoint.old``): one writer per output_dir is assumed, as for every checkpoint here.
* :func:`disk_full_reported` turns ENOSPC, and torch's and safetensors' wrappings of it
  (``unexpected pos``, ``file write failed``, ``StorageFull``), into one line naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wam_gym.utils.publish import atomic_write_text, recover_dir, remove_dir, remove_stale_locks

log = logging.getLogger(__name__)

RUN_CONFIG = "train_config.json"
RESUMED_RE = re.compile(r"^train_config\.resumed-(\d+)\.json$")
DATASET_IDENTITY = "dataset_identity"  # the key the run config keeps the dataset's identity under
# mixed_precision=auto means bf16 on a GPU that has it, fp32 elsewhere: the run config keeps what it
# became, so resuming a GPU's bf16 run on a CPU (or the other way round) is a difference like any other.
PRECISION = "mixed_precision_resolved"
# Knobs that change how a run is logged, saved, fed or sped up, never what it computes: they may
# differ on resume (raising max_steps to train longer is the usual one; lr_lambda follows the
# current max_steps on purpose). dataset.root is compared by identity instead of by path.
BOOKKEEPING = frozenset({
    "task", "output_dir", "max_steps", "log_every", "save_every", "keep_checkpoints", "log_video_every", "resume",
    "allow_resume_mismatch", "num_workers", "dataloader_prefetch_factor", "dataloader_persistent_workers",
    "dataloader_pin_memory", "dataloader_worker_threads", "video_latent_cache", "video_latent_cache_fields",
    "vae_micro_batch_size", "model.vae_micro_batch_size", "model.backbone.attention_backend",
    "model.backbone.use_gradient_checkpointing", "dataset.root", "dataset.cache_episodes",
})
BOOKKEEPING_GROUPS = ("infra.", "precompute.")  # speed profiles (cached latents equal online ones) and cache generation


class ResumeMismatchError(ValueError):
    """A rerun into an output_dir whose checkpoints were trained with other settings."""


class DiskFullError(RuntimeError):
    """A checkpoint could not be written: no space left on the device."""


# ---------------------------------------------------------------------------------------------- the run config


def describe(cfg, dataset_identity: dict[str, Any] | None, precision: str) -> dict[str, Any]:
    """What ``train_config.json`` holds: the config as JSON, plus the dataset's identity and the
    precision ``mixed_precision`` resolved to on this machine."""
    record = json.loads(json.dumps(asdict(cfg), default=str))
    if dataset_identity is not None:
        record[DATASET_IDENTITY] = dataset_identity
    record[PRECISION] = precision
    return record


def saved_configs(out: Path) -> list[Path]:
    """train_config.json, then its train_config.resumed-N.json records, oldest first."""
    resumed = sorted((int(m.group(1)), p) for p in out.glob("train_config.resumed-*.json") if (m := RESUMED_RE.match(p.name)))
    original = [out / RUN_CONFIG] if (out / RUN_CONFIG).is_file() else []
    return original + [p for _, p in resumed]


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved, current) for every result-changing key both configs have, in config order.

    Keys only one side has are skipped: a config written before a knob existed says nothing about it."""
    old, new = _flatten(saved), _flatten(current)
    return [(k, old[k], v) for k, v in new.items() if k in old and old[k] != v and not _bookkeeping(k)]


def check_resume(out: Path, current: dict[str, Any], allow_mismatch: bool) -> list[tuple[str, Any, Any]]:
    """Refuse to resume ``out`` with other result-changing settings than its newest saved config.

    Call only when a checkpoint will be resumed; reads only. Returns the differences that
    ``allow_mismatch`` let through (empty when the settings match)."""
    saved = saved_configs(out)
    if not saved:
        log.warning("%s has checkpoints but no %s: resuming without comparing settings", out, RUN_CONFIG)
        return []
    diffs = differences(json.loads(saved[-1].read_text()), current)
    if diffs and not allow_mismatch:
        raise ResumeMismatchError(_mismatch_message(out, saved[-1], diffs, current))
    for key, old, new in diffs:
        log.warning("allow_resume_mismatch=true: resuming %s with %s=%r (was %r)", out, key, new, old)
    return diffs


def _mismatch_message(out: Path, saved: Path, diffs: list, current: dict) -> str:
    key, old, new = diffs[0]
    more = f" (and {len(diffs) - 1} more: {', '.join(d[0] for d in diffs[1:4])})" if len(diffs) > 1 else ""
    if key.startswith(DATASET_IDENTITY + "."):
        field = key.split(".", 1)[1]
        what = f"dataset.root's meta/info.json {field}: {old!r} in {saved.name}, {new!r} in {current['dataset']['root']}"
    else:
        what = f"{key}={old!r} in {saved.name}, {key}={new!r} now"
    return (f"output_dir={out} holds checkpoints trained with other settings, {what}{more}: resuming would mix the "
            f"two runs silently. Use another output_dir, or resume=false to start over (deletes {out}/checkpoints), "
            "or allow_resume_mismatch=true to resume anyway (recorded in train_config.resumed-N.json)")


def write_run_config(out: Path, record: dict[str, Any], *, resuming: bool, mismatched: bool) -> Path | None:
    """Record the run's settings without ever overwriting the original ``train_config.json``.

    A new run writes it (over one a run without checkpoints left); a resume with allowed
    differences adds the next ``train_config.resumed-N.json``; a matching resume writes nothing."""
    text = json.dumps(record, indent=2)
    if not resuming:
        for old in saved_configs(out)[1:]:  # the records of a run this one replaces
            old.unlink()
        return atomic_write_text(out / RUN_CONFIG, text)
    if mismatched or not saved_configs(out):
        names = saved_configs(out)
        n = 1 + max((int(m.group(1)) for p in names if (m := RESUMED_RE.match(p.name))), default=0)
        path = out / RUN_CONFIG if not names else out / f"train_config.resumed-{n}.json"
        return atomic_write_text(path, text)
    return None


def start_over(out: Path) -> None:
    """resume=false: delete the step checkpoints of the run in ``out``, so no later resume mixes them in."""
    root = out / "checkpoints"
    if root.is_dir() and any(root.iterdir()):
        log.warning("resume=false: deleting %s (the checkpoints of the run this one replaces)", root)
        remove_dir(root)


def _flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _bookkeeping(key: str) -> bool:
    return key in BOOKKEEPING or key.startswith(BOOKKEEPING_GROUPS)


# ---------------------------------------------------------------------------------------------- leftovers


def clean_leftovers(out: Path) -> list[str]:
    """Remove what killed saves left in ``out``; returns the names removed.

    Step checkpoints stage in ``checkpoints/.step-*.staging``, deletions go through
    ``checkpoints/.deleting-*``, the final checkpoint stages in ``.checkpoint.staging-*`` and may
    be left renamed aside as ``.checkpoint.old`` (put back if ``checkpoint/`` is missing), and
    atomic file writes leave ``.<name>.*.tmp``, and a killed publish its ``.checkpoint.lock``. None of
    them is ever read, and nothing but a rerun would remove those a kill at the very end left."""
    removed = []
    patterns = ("checkpoints/.step-*.staging*", "checkpoints/.deleting-*", ".checkpoint.staging-*", f".{RUN_CONFIG}.*.tmp",
                ".train_config.resumed-*.json.*.tmp")
    for pattern in patterns:
        for path in out.glob(pattern):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(str(path.relative_to(out)))
    if (out / ".checkpoint.old").exists():
        recover_dir(out / "checkpoint")  # back in place if the new one never arrived, else deleted
        removed.append(".checkpoint.old")
    removed += remove_stale_locks(out)  # the final checkpoint's writer lock, if a kill kept it
    if removed:
        log.info("removed leftovers of an interrupted run in %s: %s", out, removed)
    return removed


# ---------------------------------------------------------------------------------------------- a full disk

_FULL_PATTERNS = ("no space left on device", "storagefull", "unexpected pos", "file write failed", "os error 28")


def is_disk_full(exc: BaseException) -> bool:
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
def disk_full_reported(path: Path, out: Path) -> Iterator[None]:
    """Re-raise a full disk while writing ``path`` as one :class:`DiskFullError` line naming the fix."""
    try:
        yield
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise DiskFullError(
            f"no space left on device writing {path} ({_free(out)} free; {type(exc).__name__}: {cause}): free space "
            f"or set output_dir=<a directory on a disk with room>; the previous checkpoint in {out} is kept"
        ) from exc


def _free(path: Path) -> str:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return f"{shutil.disk_usage(candidate).free / 2**20:.0f} MiB"
    return "unknown"
