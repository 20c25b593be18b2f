"""DeepSpeed checkpoints read with ``torch.load(weights_only=True)``, never full unpickling.

DeepSpeed's own loader (``TorchCheckpointEngine.load``, DeepSpeed 0.19) calls
``torch.load(weights_only=False)`` on ``<ckpt>/ds/*.pt``, so a pickle planted there would run in
the next resume. :func:`load_weights_only` replaces the engine's ``load``: tensors, containers
and an allowlist of the plain DeepSpeed classes ZeRO-1/2 (with or without CPU offload) write
into those files. Building any of them runs no code of the file's choosing.
"""

from __future__ import annotations

import pickle
import re

import torch


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A DeepSpeed checkpoint file holds a Python object outside the allowlist."""


def safe_globals() -> list[type]:
    """The non-tensor Python objects DeepSpeed's ZeRO checkpoints hold (seen with 0.19)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_weights_only(path: str, map_location=None):
    """``CheckpointEngine.load`` with ``weights_only=True`` and the DeepSpeed allowlist."""
    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        names = sorted(set(re.findall(r"GLOBAL (\S+)", str(exc)))) or ["an object torch refuses"]
        raise UnsafeCheckpointError(
            f"{path} holds {', '.join(names)}, which is not unpickled here (weights_only=True): resume only from "
            "checkpoints python -m training wrote; if a newer DeepSpeed wrote it and you trust the file, add the "
            "class to training/deepspeed_checkpoint.py:safe_globals"
        ) from None


def restrict_to_weights_only(ds_engine) -> None:
    """Make ``ds_engine.load_checkpoint`` read its files with :func:`load_weights_only`."""
    ds_engine.checkpoint_engine.load = load_weights_only
