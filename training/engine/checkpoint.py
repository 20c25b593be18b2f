"""Checkpoint layout and resume, for both back ends; every read is weights-only.

Checkpoints are directories ``step-XXXXXXXX`` (:func:`checkpoint_dir`) written atomically: every
file goes into a hidden staging directory next to the target (:func:`staging_path`), which is
renamed into place only once complete (:func:`publish`; ``trainer_state.json`` is the last file
written), so :func:`latest_checkpoint` never picks up a half-written one. Save only at
accumulation boundaries (gradients are not saved). Torch back end layout::

    model.safetensors    full state_dict (all parameters and buffers, safetensors); metadata
                         "trainable" lists the trainable parameter names
    optimizer.pt         optimizer.state_dict()   } torch.save, read back ONLY with
    scheduler.pt         scheduler.state_dict()   } torch.load(weights_only=True) (load_tensors):
                                                    tensors and plain containers, never unpickled objects
    trainer_state.json   backend, global step, micro step, world size, client_state (JSON)

DeepSpeed back end: ``engine.save_checkpoint`` / ``load_checkpoint`` under tag ``ds/``, plus
``trainer_state.json`` and one ``client_state/rank-XXXXX.json`` per rank (RNG states differ per
rank). DeepSpeed's own loader (``TorchCheckpointEngine.load``, DeepSpeed 0.19) calls
``torch.load(weights_only=False)`` on ``<ckpt>/ds/*.pt``, so a pickle planted there would run in
the next resume: :func:`restrict_to_weights_only` replaces it with :func:`load_weights_only`
(tensors, containers and an allowlist of the plain DeepSpeed classes ZeRO-1/2 write, with or
without CPU offload; building any of them runs no code of the file's choosing).

``client_state`` must be JSON-like (dict / list / str / int / float / bool / None); torch tensors
and numpy arrays are allowed too (stored as tagged lists and rebuilt on load); tuples come back as
lists. :func:`rng_state` / :func:`set_rng_state` capture and restore every RNG in that form.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from wam_gym.utils.publish import publish_dir

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
DS_TAG = "ds"
FORMAT_VERSION = 1
_CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")


# ----------------------------------------------------------------------------------------------
# Layout


def checkpoint_dir(root, step: int) -> Path:
    """``root/step-XXXXXXXX``: the directory :meth:`Engine.save` should be given for ``step``."""
    return Path(root) / f"step-{int(step):08d}"


def latest_checkpoint(root) -> Path | None:
    """The complete checkpoint with the highest step under ``root`` (``None`` if there is none).

    Only directories named exactly ``step-XXXXXXXX`` that hold ``trainer_state.json`` count; the
    hidden staging directories a save writes into never match."""
    root = Path(root)
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for path in root.iterdir():
        match = _CHECKPOINT_RE.match(path.name)
        if match and path.is_dir() and (path / TRAINER_STATE).is_file():
            step = int(match.group(1))
            if best is None or step > best[0]:
                best = (step, path)
    return None if best is None else best[1]


def staging_path(final: Path) -> Path:
    """The hidden directory a save of ``final`` writes into."""
    return final.parent / f".{final.name}.staging"


def fresh_staging(final: Path) -> Path:
    """An empty :func:`staging_path` (what a killed save left there is dropped)."""
    staging = staging_path(final)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def publish(staging: Path, final: Path) -> None:
    """Rename the complete ``staging`` directory into place as ``final``."""
    publish_dir(staging, final)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, allow_nan=True))


def trainer_state(*, backend: str, global_step: int, micro_step: int, world_size: int, mixed_precision: str,
                  client_state: Any, **extra: Any) -> dict:
    """What ``trainer_state.json`` holds (``client_state`` already :func:`encode`\\ d)."""
    return {"format_version": FORMAT_VERSION, "backend": backend, "global_step": global_step, "micro_step": micro_step,
            "world_size": world_size, "mixed_precision": mixed_precision, **extra, "client_state": client_state}


def read_trainer_state(directory: Path, backend: str) -> dict:
    path = Path(directory) / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a complete checkpoint (no {TRAINER_STATE})")
    state = json.loads(path.read_text())
    if state.get("backend") != backend:
        raise ValueError(f"{directory} was written by the {state.get('backend')!r} back end; this engine is "
                         f"{backend!r} (use the same deepspeed= setting to resume)")
    return state


# ----------------------------------------------------------------------------------------------
# Weights-only reads


def load_tensors(path) -> Any:
    """A ``torch.save``\\ d state dict (optimizer.pt, scheduler.pt): tensors and plain containers only."""
    return torch.load(path, map_location="cpu", weights_only=True)


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
            "class to training/engine/checkpoint.py:safe_globals"
        ) from None


def restrict_to_weights_only(ds_engine) -> None:
    """Make ``ds_engine.load_checkpoint`` read its files with :func:`load_weights_only`."""
    ds_engine.checkpoint_engine.load = load_weights_only


# ----------------------------------------------------------------------------------------------
# client_state and RNG


def encode(obj: Any) -> Any:
    """client_state -> JSON-native; tensors and numpy arrays become tagged flat lists."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return {"__tensor__": {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                               "data": t.reshape(-1).tolist()}}
    if type(obj).__module__ == "numpy":
        import numpy as np

        if isinstance(obj, np.ndarray):
            return {"__ndarray__": {"dtype": str(obj.dtype), "shape": list(obj.shape), "data": obj.reshape(-1).tolist()}}
        if isinstance(obj, np.generic):
            return obj.item()
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"client_state keys must be str, got {key!r}")
            out[key] = encode(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    raise TypeError(f"client_state holds a {type(obj).__name__}; only JSON types, tensors and numpy arrays "
                    "can be checkpointed")


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {"__tensor__"}:
        spec = obj["__tensor__"]
        return torch.tensor(spec["data"], dtype=getattr(torch, spec["dtype"])).reshape(spec["shape"])
    if set(obj) == {"__ndarray__"}:
        import numpy as np

        spec = obj["__ndarray__"]
        return np.asarray(spec["data"], dtype=spec["dtype"]).reshape(spec["shape"])
    return {k: decode(v) for k, v in obj.items()}


def rng_state() -> dict:
    """Python, numpy, torch (and CUDA, when initialised) RNG states, ready for ``client_state``."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {"name": name, "keys": keys, "pos": int(pos), "has_gauss": int(has_gauss),
                          "cached_gaussian": float(cached)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured (after a round trip through a checkpoint)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8))
    if "numpy" in state:
        import numpy as np

        s = state["numpy"]
        np.random.set_state((s["name"], np.asarray(s["keys"], dtype=np.uint32), s["pos"], s["has_gauss"],
                             s["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [torch.as_tensor(s, dtype=torch.uint8) for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning("CUDA RNG state for %d devices, %d visible: not restored", len(cuda), torch.cuda.device_count())
