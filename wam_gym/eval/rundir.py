"""The output directory of an evaluation: one run at a time (what it may be resumed by is
``protocol.json``'s business: wam_gym/eval/run_protocol.py).

Two runs writing one directory would each run every missing episode; an exclusive lock on
``output_dir/eval.lock`` (``fcntl.flock``, released by the kernel when its holder dies, so a killed
run leaves no stale lock) refuses the second. The file is not hidden: a hidden name reads as the
temp file of an interrupted write, which an output dir must not keep, and a killed holder cannot
remove it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from wam_gym.eval.errors import OutputDirBusy
from wam_gym.utils.publish import TargetBusyError, writer_lock

logger = logging.getLogger(__name__)

LOCK_FILE = "eval.lock"  # who holds it while it is held; empty after a clean exit


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
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(writer_lock(output_dir, lock=output_dir / LOCK_FILE))
        except TargetBusyError as busy:
            raise OutputDirBusy(f"EVALUATION.output_dir={output_dir} is in use by another evaluation ({busy.holder}): "
                                "wait for it to finish, or use another EVALUATION.output_dir") from None
        yield
