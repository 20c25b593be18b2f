"""A training run's output_dir, besides the checkpoints' contents: what makes its settings
comparable on resume, starting over, the leftovers of killed saves, and a full disk's message.

The mechanics are wam_gym/utils/run_dir.py's, shared with evaluation (the lock, the identity
record, the resume check, the one disk-full error); what is training's is here:

* ``train_config.json`` is written once, by the run that starts the directory, and never
  overwritten. A rerun resumes only with the same result-changing settings
  (:func:`check_resume`): anything but the bookkeeping knobs (:data:`BOOKKEEPING`) and the
  dataset's identity (its ``meta/info.json``, not its path). ``allow_resume_mismatch=true``
  resumes anyway and records the new settings in ``train_config.resumed-N.json``; the next rerun
  is compared with the newest such record. ``resume=false`` starts over: the old step
  checkpoints are deleted (a later resume must never mix them with the new run's).
* One training per output_dir: :func:`locked` (``train.lock``).
* :func:`clean_leftovers` removes what a killed save left (hidden staging, ``.deleting-*``,
  ``.checkpoint.old``): the lock makes this run the only writer.
* :func:`disk_full_reported` turns a full disk while saving into one line naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wam_gym.utils import run_dir
from wam_gym.utils.publish import recover_dir, remove_dir, remove_stale_locks

log = logging.getLogger(__name__)

RUN_CONFIG = "train_config.json"
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
    "model.backbone.use_gradient_checkpointing", "model.training.gradient_checkpointing", "dataset.root",
    "dataset.cache_episodes",
})
BOOKKEEPING_GROUPS = ("infra.", "precompute.")  # speed profiles (cached latents equal online ones) and cache generation


# ---------------------------------------------------------------------------------------------- the run config


def describe(cfg, dataset_identity: dict[str, Any] | None, precision: str) -> dict[str, Any]:
    """What ``train_config.json`` holds: the config as JSON, plus the dataset's identity and the
    precision ``mixed_precision`` resolved to on this machine."""
    record = json.loads(json.dumps(asdict(cfg), default=str))
    if dataset_identity is not None:
        record[DATASET_IDENTITY] = dataset_identity
    record[PRECISION] = precision
    return record


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved, current) for every result-changing key both configs have, in config order."""
    return run_dir.differences(saved, current, _bookkeeping)


def check_resume(out: Path, current: dict[str, Any], allow_mismatch: bool) -> list[tuple[str, Any, Any]]:
    """Refuse to resume ``out`` with other result-changing settings than its newest saved config.

    Call only when a checkpoint will be resumed; reads only. Returns the differences that
    ``allow_mismatch`` let through (empty when the settings match)."""
    return run_dir.check_resume(out, RUN_CONFIG, current, allow=allow_mismatch, ignore=_bookkeeping,
                                refusal=lambda saved, diffs: _mismatch_message(out, saved, diffs, current))


def _mismatch_message(out: Path, saved: Path, diffs: list, current: dict) -> str:
    key, old, new = diffs[0]
    more = run_dir.and_more([d[0] for d in diffs[1:]])
    if key.startswith(DATASET_IDENTITY + "."):
        field = key.split(".", 1)[1]
        what = f"dataset.root's meta/info.json {field}: {old!r} in {saved.name}, {new!r} in {current['dataset']['root']}"
    else:
        what = f"{key}={old!r} in {saved.name}, {key}={new!r} now"
    return (f"output_dir={out} holds checkpoints trained with other settings, {what}{more}: resuming would mix the "
            f"two runs silently. Use another output_dir, or resume=false to start over (deletes {out}/checkpoints), "
            "or allow_resume_mismatch=true to resume anyway (recorded in train_config.resumed-N.json)")


def start_over(out: Path) -> None:
    """resume=false: delete the step checkpoints of the run in ``out``, so no later resume mixes them in."""
    root = out / "checkpoints"
    if root.is_dir() and any(root.iterdir()):
        log.warning("resume=false: deleting %s (the checkpoints of the run this one replaces)", root)
        remove_dir(root)


def _bookkeeping(key: str) -> bool:
    return key in BOOKKEEPING or key.startswith(BOOKKEEPING_GROUPS)


# ---------------------------------------------------------------------------------------------- the writer


def locked(out: Path) -> contextlib.AbstractContextManager[None]:
    """Hold ``out``'s training lock; a second training into it gets a one-line OutputDirBusy naming this one."""
    return run_dir.locked(out, run_dir.TRAIN_LOCK, knob="output_dir", what="training run")


def write_run_config(out: Path, record: dict[str, Any], *, resuming: bool, mismatched: bool) -> Path | None:
    """``train_config.json`` once, or the next ``train_config.resumed-N.json`` (see run_dir.record_settings)."""
    with disk_full_reported(out / RUN_CONFIG, out):
        return run_dir.record_settings(out, RUN_CONFIG, record, resuming=resuming, mismatched=mismatched)


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


def disk_full_reported(path: Path, out: Path) -> contextlib.AbstractContextManager[None]:
    """A full disk while writing ``path`` (a checkpoint, the run config) as one
    :class:`wam_gym.utils.run_dir.DiskFullError` line naming the fix."""
    return run_dir.disk_full_reported(path, out, kept=f"the previous checkpoint in {out} is kept",
                                      fix="free space or set output_dir=<a directory on a disk with room>")
