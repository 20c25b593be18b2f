"""Start ``python -m wam_gym.serve`` as a child process and stop it cleanly: for scripts, benchmarks
and tests that need a server next to them (possibly from another virtualenv's python).

    with launched(["ckpt=outputs/demo/train/checkpoint"], log=Path("serve.log")) as server:
        url = f"ws://127.0.0.1:{server.port}"

Standard library only, so any venv with wam_gym installed can launch a server from another.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


class ServerStartError(RuntimeError):
    """The server exited, or was not ready in time; the message ends with its log."""


@dataclass
class Launched:
    port: int  # the bound port (SERVE.port=0 picks a free one)
    process: subprocess.Popen  # the server; SIGTERM stops it cleanly
    log: Path  # its stdout and stderr


@contextlib.contextmanager
def launched(overrides: Sequence[str], *, python: str = sys.executable, env: dict | None = None,
             log: Path | None = None, cwd: Path | None = None, ready_timeout_s: float = 600.0,
             stop_timeout_s: float = 120.0) -> Iterator[Launched]:
    """A server on a free port with ``overrides``, ready (every model worker loaded) when this yields;
    SIGTERMed and waited for on exit (killed after ``stop_timeout_s``)."""
    with tempfile.TemporaryDirectory(prefix="wam-serve-") as tmp:
        port_file, log = Path(tmp) / "port", log or Path(tmp) / "serve.log"
        command = [python, "-m", "wam_gym.serve", "SERVE.port=0", f"SERVE.port_file={port_file}", *overrides]
        with open(log, "w") as out:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield Launched(_wait_for_port(process, port_file, log, ready_timeout_s), process, log)
        finally:
            stop(process, stop_timeout_s)


def _wait_for_port(process: subprocess.Popen, port_file: Path, log: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None:
            raise ServerStartError(f"wam_gym.serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise ServerStartError(f"wam_gym.serve was not ready within {timeout_s:g} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    return int(port_file.read_text())


def stop(process: subprocess.Popen, timeout_s: float = 120.0) -> int:
    """SIGTERM (the server drains and exits), then SIGKILL after ``timeout_s``; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
