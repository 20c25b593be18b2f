"""SIGTERM as Ctrl-C: a command stopped by a signal ends through its ``finally`` blocks and one line.

A batch scheduler ends a job at its time limit with SIGTERM (then SIGKILL a little later); Python's default
for SIGTERM is to die where it stands, with no word and nothing cleaned up. :func:`stop_on_signals` makes
SIGINT and SIGTERM raise :class:`Stopped`, a ``KeyboardInterrupt``, so code that already cleans up after
Ctrl-C (``python -m wam_gym.eval`` writes results.json that says how to resume) does the same after
SIGTERM. A second SIGTERM while stopping is ignored: the scheduler's SIGKILL follows anyway, and an
interrupted cleanup would lose what it was writing. A command's entry point catches :class:`Stopped` and
calls :func:`exit_stopped`: one ``error: ...`` line on stderr, exit status 128 + the signal's number (130, 143), as a
shell reports a process the signal ended.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM asked this process to stop; ``message`` says what became of its work (None: not yet said)."""

    def __init__(self, signum: int = signal.SIGINT, message: str | None = None):
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")
        self.signum, self.message = signum, message

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @classmethod
    def of(cls, interrupt: KeyboardInterrupt) -> Stopped:
        """``interrupt`` as a Stopped (a plain KeyboardInterrupt: Ctrl-C where the handlers are not installed)."""
        return interrupt if isinstance(interrupt, Stopped) else cls(signal.SIGINT)


def stop_on_signals() -> None:
    """From now on, SIGINT and SIGTERM raise :class:`Stopped` in this process's main thread."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)


def ignore_stop_signals() -> None:
    """For a child process its parent stops (an evaluation's actors): a terminal's Ctrl-C, or a scheduler's
    SIGTERM to every process of the job, reaches it too, but its parent decides when it ends."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _raise_stopped(signum: int, frame) -> None:
    if signum == signal.SIGTERM:
        signal.signal(signum, signal.SIG_IGN)  # stopping already: let the cleanup finish
    raise Stopped(signum)


def exit_stopped(stopped: KeyboardInterrupt, message: str | None = None) -> NoReturn:
    """Print one line (``message``, else the Stopped's own) and exit 128 + the signal's number."""
    stopped = Stopped.of(stopped)
    print(f"error: {message or stopped}", file=sys.stderr)
    sys.exit(128 + stopped.signum)
