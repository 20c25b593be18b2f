"""Errors of ``python -m wam_gym.eval`` that stop a run; each message is one line naming its fix."""

from wam_gym.utils import run_dir


class EvalError(RuntimeError):
    """The evaluation stopped; every episode finished before it is on disk."""


class OutputDirBusy(EvalError, run_dir.OutputDirBusy):
    """Another evaluation holds the output directory's lock (wam_gym.utils.run_dir.locked)."""


class ResumeMismatch(EvalError, run_dir.ResumeMismatchError):
    """The output directory holds episodes run with other result-changing settings."""
