"""Errors of ``python -m wam_gym.eval`` that stop a run; each message is one line naming its fix."""


class EvalError(RuntimeError):
    """The evaluation stopped; every episode finished before it is on disk."""


class OutputDirBusy(EvalError):
    """Another evaluation holds the output directory's lock."""


class ResumeMismatch(EvalError):
    """The output directory holds episodes run with other result-changing settings."""
