"""The output directory of an evaluation: one run at a time, and resumed only by the run it belongs to.

A rerun into the same ``EVALUATION.output_dir`` runs only the missing episodes and credits the
ones on disk to itself, so it must be the same evaluation: ``run_identity.json`` records the
settings that change an episode's outcome (checkpoint content, statistics, seed, episode
length, env kwargs, agent and inference settings) on the first run, and a rerun with other
values is refused. The plan (tasks, num_trials) is not part of it: trial ``k`` of a task is
fixed by these settings alone (seed ``seed + k``), so adding trials or tasks resumes cleanly.

Two runs writing one directory would each run every missing episode; an exclusive lock on
``output_dir/eval.lock`` (``fcntl.flock``, released by the kernel when its holder dies, so a killed
run leaves no stale lock) refuses the second. The file is not hidden: a hidden name reads as the
temp file of an interrupted write, which an output dir must not keep, and a killed holder cannot
remove it.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wam_gym.eval.errors import OutputDirBusy, ResumeMismatch
from wam_gym.results import space_checked
from wam_gym.utils.publish import atomic_write_text

logger = logging.getLogger(__name__)

LOCK_FILE = "eval.lock"  # who holds it while it is held; empty after a clean exit
IDENTITY_FILE = "run_identity.json"
# Inference knobs that change actions (cross-KV reuse, compile, video decoding do not).
INFERENCE_FIELDS = ("sampler", "num_inference_steps", "shift", "action_horizon", "replan_steps", "video_mode")
_SAMPLES, _SAMPLE_BYTES = 64, 4096  # spread reads of a weights file: cheap, and any retraining changes them


# ----------------------------------------------------------------- the directory itself
def check_writable(output_dir: Path) -> None:
    """Refuse, before anything starts, an output dir that is a file or cannot be written."""
    probe = output_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        where = "" if probe == output_dir else f" ({probe} is a file)"
        raise ValueError(f"EVALUATION.output_dir={output_dir} is a file, not a directory{where}: pass a directory path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"EVALUATION.output_dir={output_dir} is not writable ({probe}: permission denied): "
                         "pass a directory you can write to")


@contextlib.contextmanager
def locked(output_dir: Path) -> Iterator[None]:
    """Hold the output dir's exclusive lock, with who holds it written in the lock file."""
    output_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(output_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that has not said who it is"
            raise OutputDirBusy(
                f"EVALUATION.output_dir={output_dir} is in use by another evaluation ({holder}): wait for it to "
                "finish, or use another EVALUATION.output_dir"
            ) from None
        since = datetime.datetime.now().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # not held any more: name nobody
    finally:
        os.close(fd)  # releases the lock


# ----------------------------------------------------------------- what a run is
def file_fingerprint(path: Path) -> str:
    """A content hash of a safetensors file read at a few places: its header (names, shapes,
    dtypes) and 64 samples spread over the data. Stable under copies and moves, unlike mtimes."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        h.update(f.read(min(header_len, 1 << 20)))
        for i in range(_SAMPLES):
            f.seek(size * i // _SAMPLES)
            h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def checkpoint_fingerprint(ckpt: Path) -> str:
    """Its wam_config.json and every weights file (LoRA adapters included)."""
    h = hashlib.sha256((ckpt / "wam_config.json").read_bytes())
    for path in sorted(ckpt.rglob("*.safetensors")):
        h.update(path.relative_to(ckpt).as_posix().encode())
        h.update(file_fingerprint(path).encode())
    return h.hexdigest()


def run_identity(config, env_kwargs: dict[str, Any], ckpt: Path | None, stats: Path | None) -> dict[str, Any]:
    """The settings that decide an episode's outcome, keyed by the names users type."""
    ev = config.EVALUATION
    identity: dict[str, Any] = {
        "EVALUATION.agent": ev.agent,
        "EVALUATION.seed": ev.seed,
        "EVALUATION.max_episode_steps": ev.max_episode_steps,
        "env_kwargs": env_kwargs,
    }
    if ev.agent == "wam":
        identity["ckpt"] = {"path": str(ckpt), "fingerprint": checkpoint_fingerprint(ckpt)}
        identity["EVALUATION.dataset_stats_path"] = {
            "path": str(stats), "fingerprint": hashlib.sha256(stats.read_bytes()).hexdigest()}
        identity.update({f"EVALUATION.{name}": getattr(ev, name) for name in INFERENCE_FIELDS})
    elif ev.agent == "python":
        identity["EVALUATION.policy"] = ev.policy
    elif ev.agent == "remote":  # not the url: a server moves, and the url never said which model it serves
        identity.update({"EVALUATION.remote_protocol": ev.remote_protocol, "EVALUATION.remote_keys": ev.remote_keys})
    return json.loads(json.dumps(identity, sort_keys=True, default=str))  # as it reads back from the file


def _key(value: Any) -> Any:
    """What is compared: content fingerprints, not paths (a moved checkpoint is the same one)."""
    return value["fingerprint"] if isinstance(value, dict) and "fingerprint" in value else value


def _show(value: Any) -> str:
    if isinstance(value, dict) and "fingerprint" in value:
        return f"{value['path']} (content {value['fingerprint'][:12]})"
    return json.dumps(value)


def differences(recorded: dict[str, Any], identity: dict[str, Any]) -> list[dict[str, Any]]:
    fields = list(identity) + [k for k in recorded if k not in identity]
    return [{"field": k, "recorded": recorded.get(k), "now": identity.get(k)}
            for k in fields if _key(recorded.get(k)) != _key(identity.get(k))]


def check_resume(output_dir: Path, identity: dict[str, Any], has_episodes: bool, allow: bool) -> list[dict[str, Any]]:
    """Compare with the identity on disk; write it when there is none. Returns the differences
    allowed by ``EVALUATION.allow_resume_mismatch`` (empty when the settings match)."""
    path = output_dir / IDENTITY_FILE
    if not path.is_file() or not has_episodes:  # nothing on disk to credit to the wrong run
        if has_episodes:
            logger.warning("%s has episodes but no %s (an older wam_gym wrote them): taking this run's settings "
                           "as theirs", output_dir, IDENTITY_FILE)
        with space_checked(path):
            atomic_write_text(path, json.dumps(identity, indent=2, sort_keys=True) + "\n")
        return []
    try:
        recorded = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not readable JSON ({exc}): use a new EVALUATION.output_dir, or delete the file "
                         "if its episodes are this run's") from None
    diffs = differences(recorded, identity)
    if diffs and not allow:
        first = diffs[0]
        more = f" (and {', '.join(d['field'] for d in diffs[1:])})" if len(diffs) > 1 else ""
        raise ResumeMismatch(
            f"EVALUATION.output_dir={output_dir} holds episodes run with other settings: {first['field']} was "
            f"{_show(first['recorded'])}, now {_show(first['now'])}{more}. Resuming would count them as this run's: "
            "use a new EVALUATION.output_dir, or set EVALUATION.allow_resume_mismatch=true to resume anyway "
            "(recorded in results.json)"
        )
    for d in diffs:
        logger.warning("resuming despite %s: was %s, now %s (EVALUATION.allow_resume_mismatch=true)",
                       d["field"], _show(d["recorded"]), _show(d["now"]))
    return diffs
