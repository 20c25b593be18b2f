"""One training-engine interface over two back ends, so the training loop never branches.

``make_engine(model, EngineConfig(...), device)`` returns an :class:`Engine`:

* **torch** (``EngineConfig.deepspeed is None``, one process): AdamW over the trainable
  parameters, a LambdaLR schedule (linear warmup, then constant or cosine), gradient clipping and
  gradient accumulation.
* **deepspeed** (``EngineConfig.deepspeed`` names a ZeRO JSON): ``deepspeed.initialize`` with the
  batch / accumulation / clipping / bf16 keys filled from :class:`EngineConfig`; the JSON files in
  ``training/configs`` hold only the ZeRO-specific parts. They carry no ``"scheduler"`` block (the
  engine always passes its own LambdaLR, so both back ends share one schedule) and an
  ``"optimizer"`` block only where DeepSpeed must pick the optimizer: ``zero2_offload`` asks for
  ``AdamW``, which DeepSpeed maps to its CPU Adam (``DeepSpeedCPUAdam``, a compiled op) for the
  offloaded fp32 partitions. Without an ``"optimizer"`` block the engine passes a
  ``torch.optim.AdamW`` (no op build). lr / betas / weight_decay always come from EngineConfig.

The loop::

    engine = make_engine(model, cfg, device)
    if (ckpt := latest_checkpoint(root)) is not None:
        state = engine.load(ckpt)                    # client_state: data position, RNG, ...
    for batch in loader:
        with engine.autocast():
            loss = engine(batch)                     # forward through the back end
        engine.backward(loss)
        if engine.step():                            # True only at accumulation boundaries
            if engine.global_step % save_every == 0:
                engine.save(checkpoint_dir(root, engine.global_step), {"rng": rng_state(), ...})

Mixed precision. ``"auto"`` means bf16 on CUDA (when the GPU supports it) and fp32 elsewhere.
With bf16 the torch back end keeps fp32 weights, fp32 gradients and fp32 optimizer state and runs
the forward under ``torch.autocast(bfloat16)``: :meth:`Engine.autocast` turns autocast on exactly
when mixed precision is bf16 *and* the trainable weights are fp32. DeepSpeed's bf16 mode instead
casts the module to bf16 itself (fp32 master weights live in the ZeRO optimizer), so there
:meth:`Engine.autocast` is a no-op and inputs should be given in :attr:`Engine.dtype`
(``x.to(engine.dtype)`` is right for both back ends).

Checkpoints are directories ``step-XXXXXXXX`` (:func:`checkpoint_dir`) written atomically: every
file goes into a hidden staging directory next to the target, which is renamed into place only
once complete (``trainer_state.json`` is the last file written), so :func:`latest_checkpoint`
never picks up a half-written one. Save only at accumulation boundaries (gradients are not
saved). Torch back end layout::

    model.safetensors    full state_dict (all parameters and buffers, safetensors); metadata
                         "trainable" lists the trainable parameter names
    optimizer.pt         optimizer.state_dict()   } torch.save, read back ONLY with
    scheduler.pt         scheduler.state_dict()   } torch.load(weights_only=True): tensors and
                                                    plain containers, never unpickled objects
    trainer_state.json   backend, global step, micro step, world size, client_state (JSON)

DeepSpeed back end: ``engine.save_checkpoint`` / ``load_checkpoint`` (collective: every rank must
call :meth:`Engine.save` / :meth:`Engine.load`; the checkpoint root must be a filesystem shared by
all ranks) under tag ``ds/``, plus ``trainer_state.json`` and one ``client_state/rank-XXXXX.json``
per rank (RNG states differ per rank). DeepSpeed's loader reads its ``ds/*.pt`` files through
``training.deepspeed_checkpoint``: ``weights_only=True`` with an allowlist of DeepSpeed's plain classes.

``client_state`` must be JSON-like (dict / list / str / int / float / bool / None); torch tensors
and numpy arrays are allowed too (stored as tagged lists and rebuilt on load); tuples come back as
lists. :func:`rng_state` / :func:`set_rng_state` capture and restore every RNG in that form.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from wam_gym.utils.publish import publish_dir

__all__ = [
    "CONFIG_DIR",
    "DEEPSPEED_CONFIGS",
    "DeepSpeedEngine",
    "Engine",
    "EngineConfig",
    "TorchEngine",
    "checkpoint_dir",
    "deepspeed_config_dict",
    "latest_checkpoint",
    "lr_lambda",
    "make_engine",
    "resolve_deepspeed_config",
    "resolve_mixed_precision",
    "rng_state",
    "set_rng_state",
]

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEEPSPEED_CONFIGS = ("zero1", "zero2", "zero2_offload")
TRAINER_STATE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
DS_TAG = "ds"
FORMAT_VERSION = 1
_CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")
# Keys the engine writes into the DeepSpeed config from EngineConfig (the JSON files must not).
ENGINE_OWNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                     "gradient_clipping", "bf16", "fp16", "scheduler")


@dataclass
class EngineConfig:
    deepspeed: str | None = None  # ZeRO JSON path, or zero1 | zero2 | zero2_offload; None = plain torch
    mixed_precision: str = "auto"  # auto (bf16 on CUDA, fp32 elsewhere) | bf16 | fp32
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping
    warmup_steps: int = 0
    lr_schedule: str = "constant"  # constant | cosine (after warmup, down to 0 at max_steps)
    max_steps: int = 1000
    gradient_accumulation_steps: int = 1
    micro_batch_size: int = 1

    def __post_init__(self):
        self.betas = tuple(float(b) for b in self.betas)  # Hydra hands over a ListConfig
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers, got {self.betas}")
        if self.mixed_precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"mixed_precision must be auto, bf16 or fp32, got {self.mixed_precision!r}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}")
        if self.gradient_accumulation_steps < 1 or self.micro_batch_size < 1:
            raise ValueError("gradient_accumulation_steps and micro_batch_size must be >= 1")
        if self.warmup_steps < 0 or self.max_steps < 1:
            raise ValueError("warmup_steps must be >= 0 and max_steps >= 1")
        if self.deepspeed in ("", "none", "None", "null"):
            self.deepspeed = None


# ----------------------------------------------------------------------------------------------
# Config helpers


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # older torch without the keyword
            return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return True  # torch has bf16 kernels on every CPU (slow without AVX512-BF16 / AMX, but correct)
    try:
        x = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        (x @ x).sum().item()
        return True
    except Exception:  # any failure means "not supported here"
        return False


def resolve_mixed_precision(mixed_precision: str, device) -> str:
    """``"bf16"`` or ``"fp32"`` for ``device``; a clear error when bf16 is asked where it cannot run."""
    device = torch.device(device)
    if mixed_precision == "auto":
        return "bf16" if device.type == "cuda" and _bf16_supported(device) else "fp32"
    if mixed_precision == "fp32":
        return "fp32"
    if mixed_precision == "bf16":
        if not _bf16_supported(device):
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
            raise ValueError(f"mixed_precision=bf16 but {device} ({name}) has no bf16 support; "
                             "use mixed_precision=fp32 (or auto)")
        return "bf16"
    raise ValueError(f"mixed_precision must be auto, bf16 or fp32, got {mixed_precision!r}")


def lr_lambda(config: EngineConfig) -> Callable[[int], float]:
    """LR multiplier for optimizer step ``s`` (0-based): ``(s+1)/warmup`` during warmup, then 1
    (constant) or a half cosine from 1 at the end of warmup to 0 at ``max_steps``.

    A plain function on purpose: LambdaLR then keeps nothing of it in its state_dict, so on resume
    the current config (not the checkpoint) defines the schedule's shape."""
    warmup, max_steps, schedule = config.warmup_steps, config.max_steps, config.lr_schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, max_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def resolve_deepspeed_config(name_or_path: str) -> Path:
    """``zero1`` | ``zero2`` | ``zero2_offload`` -> ``training/configs/<name>.json``; else a JSON path."""
    if name_or_path in DEEPSPEED_CONFIGS:
        return CONFIG_DIR / f"{name_or_path}.json"
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"deepspeed={name_or_path!r}: not one of {', '.join(DEEPSPEED_CONFIGS)} "
                                "and no such JSON file")
    return path


def deepspeed_config_dict(config: EngineConfig, device="cpu") -> dict:
    """The dict handed to ``deepspeed.initialize``: the ZeRO JSON plus the keys EngineConfig owns."""
    if config.deepspeed is None:
        raise ValueError("EngineConfig.deepspeed is None: the torch back end uses no DeepSpeed config")
    path = resolve_deepspeed_config(config.deepspeed)
    ds = json.loads(path.read_text())
    if "scheduler" in ds:
        raise ValueError(f"{path}: drop the 'scheduler' block; the LR schedule comes from EngineConfig "
                         "(warmup_steps, lr_schedule, max_steps) for both back ends")
    if ds.get("fp16", {}).get("enabled", False):
        raise ValueError(f"{path}: fp16 is not supported; set mixed_precision=bf16 or fp32")
    ds.pop("fp16", None)
    ds.pop("train_batch_size", None)  # DeepSpeed derives it: micro * accumulation * world size
    precision = resolve_mixed_precision(config.mixed_precision, device)
    ds["train_micro_batch_size_per_gpu"] = config.micro_batch_size
    ds["gradient_accumulation_steps"] = config.gradient_accumulation_steps
    ds["gradient_clipping"] = max(0.0, float(config.grad_clip or 0.0))
    ds["bf16"] = {**ds.get("bf16", {}), "enabled": precision == "bf16"}
    if "optimizer" in ds:
        opt = dict(ds["optimizer"])
        opt["params"] = {**opt.get("params", {}), "lr": config.lr, "betas": list(config.betas),
                         "weight_decay": config.weight_decay}
        ds["optimizer"] = opt
    return ds


# ----------------------------------------------------------------------------------------------
# Checkpoint helpers


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


def _staging_path(final: Path) -> Path:
    return final.parent / f".{final.name}.staging"


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, allow_nan=True))


def _read_trainer_state(directory: Path, backend: str) -> dict:
    path = Path(directory) / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a complete checkpoint (no {TRAINER_STATE})")
    state = json.loads(path.read_text())
    if state.get("backend") != backend:
        raise ValueError(f"{directory} was written by the {state.get('backend')!r} back end; this engine is "
                         f"{backend!r} (use the same deepspeed= setting to resume)")
    return state


def _encode(obj: Any) -> Any:
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
            out[key] = _encode(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    raise TypeError(f"client_state holds a {type(obj).__name__}; only JSON types, tensors and numpy arrays "
                    "can be checkpointed")


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {"__tensor__"}:
        spec = obj["__tensor__"]
        return torch.tensor(spec["data"], dtype=getattr(torch, spec["dtype"])).reshape(spec["shape"])
    if set(obj) == {"__ndarray__"}:
        import numpy as np

        spec = obj["__ndarray__"]
        return np.asarray(spec["data"], dtype=spec["dtype"]).reshape(spec["shape"])
    return {k: _decode(v) for k, v in obj.items()}


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


# ----------------------------------------------------------------------------------------------
# Engines


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (requires_grad=True)")
    return params


class Engine:
    """The interface the loop uses; :func:`make_engine` returns one of the two subclasses."""

    backend: str
    config: EngineConfig
    precision: str  # "bf16" | "fp32", after resolving "auto"
    device: torch.device
    module: nn.Module  # the underlying model
    optimizer: Any
    scheduler: Any

    def _init_common(self) -> None:
        params = trainable_parameters(self.module)
        self._params = params
        self._autocast = self.precision == "bf16" and any(p.dtype == torch.float32 for p in params)

    def __call__(self, *args, **kwargs):
        """The forward pass, through the back end."""
        raise NotImplementedError

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def step(self) -> bool:
        """Count a micro-step; at an accumulation boundary clip, step the optimizer and the LR
        schedule and clear the gradients. Returns True when an optimizer step happened."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        raise NotImplementedError

    def save(self, directory, client_state: dict | None = None) -> Path:
        raise NotImplementedError

    def load(self, directory) -> dict:
        raise NotImplementedError

    @property
    def global_step(self) -> int:
        """Optimizer steps taken."""
        raise NotImplementedError

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        raise NotImplementedError

    @property
    def grad_norm(self) -> float | None:
        """Global gradient norm (before clipping) of the last optimizer step, if known."""
        raise NotImplementedError

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the trainable weights (fp32, or bf16 under DeepSpeed bf16): cast inputs to it."""
        return self._params[0].dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast when mixed precision is bf16 and the weights are fp32; otherwise a no-op."""
        if self._autocast:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _check_boundary(self, micro_step: int) -> None:
        if micro_step % self.config.gradient_accumulation_steps:
            raise RuntimeError("save() in the middle of gradient accumulation: accumulated gradients are not "
                               "checkpointed, so resume would not be exact; save right after step() returns True")


class TorchEngine(Engine):
    backend = "torch"

    def __init__(self, model: nn.Module, config: EngineConfig, device):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise RuntimeError("the torch back end runs in a single process; for several processes set "
                               "deepspeed=zero1|zero2|zero2_offload")
        self.config = config
        self.device = torch.device(device)
        self.precision = resolve_mixed_precision(config.mixed_precision, self.device)
        self.module = model.to(self.device)
        self._init_common()
        self.optimizer = torch.optim.AdamW(self._params, lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay)
        self.scheduler = LambdaLR(self.optimizer, lr_lambda(config))
        self._micro_step = 0
        self._global_step = 0
        self._grad_norm: float | None = None

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.config.gradient_accumulation_steps).backward()

    def step(self) -> bool:
        self._micro_step += 1
        if self._micro_step % self.config.gradient_accumulation_steps:
            return False
        if self.config.grad_clip and self.config.grad_clip > 0:
            self._grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, self.config.grad_clip))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._global_step += 1
        return True

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def global_step(self) -> int:
        return self._global_step

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def grad_norm(self) -> float | None:
        return self._grad_norm

    def save(self, directory, client_state: dict | None = None) -> Path:
        from safetensors.torch import save_model

        self._check_boundary(self._micro_step)
        final = Path(directory)
        encoded = _encode(client_state or {})  # fail before writing anything
        staging = _staging_path(final)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        trainable = [name for name, p in self.module.named_parameters() if p.requires_grad]
        save_model(self.module, str(staging / MODEL_FILE), metadata={"format": "pt", "trainable": json.dumps(trainable)})
        torch.save(self.optimizer.state_dict(), staging / OPTIMIZER_FILE)
        torch.save(self.scheduler.state_dict(), staging / SCHEDULER_FILE)
        _write_json(staging / TRAINER_STATE, {
            "format_version": FORMAT_VERSION, "backend": self.backend, "global_step": self._global_step,
            "micro_step": self._micro_step, "world_size": 1, "mixed_precision": self.precision,
            "client_state": encoded,
        })
        publish_dir(staging, final)
        return final

    def load(self, directory) -> dict:
        from safetensors.torch import load_model

        directory = Path(directory)
        state = _read_trainer_state(directory, self.backend)
        load_model(self.module, str(directory / MODEL_FILE), strict=True, device=str(self.device))
        # weights_only=True: tensors and plain containers only, never arbitrary unpickled objects.
        self.optimizer.load_state_dict(torch.load(directory / OPTIMIZER_FILE, map_location="cpu", weights_only=True))
        self.scheduler.load_state_dict(torch.load(directory / SCHEDULER_FILE, map_location="cpu", weights_only=True))
        self._global_step = int(state["global_step"])
        self._micro_step = int(state["micro_step"])
        self._grad_norm = None
        return _decode(state["client_state"])


def _ensure_single_process_env() -> None:
    """Without a launcher DeepSpeed goes looking for MPI; start a one-process world instead.

    Its store is a file (torch's TCPStore would listen on every interface, whatever
    MASTER_ADDR says) and gloo is pinned to the loopback device, so training alone on a machine
    opens no network port. Under torchrun / deepspeed / mpirun the launcher's world is used.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Someone set up the world already; DeepSpeed still insists on LOCAL_RANK.
        if "LOCAL_RANK" not in os.environ and torch.distributed.get_world_size() == 1:
            os.environ["LOCAL_RANK"] = "0"
        return
    if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        return  # torchrun / deepspeed / mpirun set up the world
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = Path(tempfile.mkdtemp(prefix="wam-dist-")) / "store"
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


class DeepSpeedEngine(Engine):
    backend = "deepspeed"

    def __init__(self, model: nn.Module, config: EngineConfig, device):
        import deepspeed

        from training.deepspeed_checkpoint import restrict_to_weights_only

        self.config = config
        self.precision = resolve_mixed_precision(config.mixed_precision, torch.device(device))
        ds_config = deepspeed_config_dict(config, device)
        _ensure_single_process_env()
        deepspeed.init_distributed()
        params = trainable_parameters(model)
        optimizer = None
        if "optimizer" not in ds_config:
            optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
        schedule = lr_lambda(config)
        self._ds, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=params, optimizer=optimizer, config=ds_config,
            lr_scheduler=lambda opt: LambdaLR(opt, schedule))
        restrict_to_weights_only(self._ds)  # DeepSpeed's own loader would fully unpickle ds/*.pt
        self.ds_config = ds_config
        self.module = self._ds.module
        self.optimizer = self._ds.optimizer
        self.scheduler = self._ds.lr_scheduler
        self.device = torch.device(self._ds.device)
        self._init_common()

    def __call__(self, *args, **kwargs):
        return self._ds(*args, **kwargs)

    @property
    def ds_engine(self):
        """The ``deepspeed.DeepSpeedEngine`` itself."""
        return self._ds

    def backward(self, loss: torch.Tensor) -> None:
        self._ds.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself

    def step(self) -> bool:
        boundary = self._ds.is_gradient_accumulation_boundary()
        self._ds.step()
        return bool(boundary)

    def zero_grad(self) -> None:
        self._ds.zero_grad()

    @property
    def global_step(self) -> int:
        return int(self._ds.global_steps)

    @property
    def lr(self) -> float:
        return float(self._ds.get_lr()[0])

    @property
    def grad_norm(self) -> float | None:
        norm = self._ds.get_global_grad_norm()
        return None if norm is None else float(norm)

    @property
    def rank(self) -> int:
        import deepspeed.comm as dist

        return dist.get_rank()

    @property
    def world_size(self) -> int:
        import deepspeed.comm as dist

        return dist.get_world_size()

    def save(self, directory, client_state: dict | None = None) -> Path:
        """Collective: every rank calls it (each with its own client_state)."""
        import deepspeed.comm as dist

        self._check_boundary(self._ds.micro_steps)
        final = Path(directory)
        encoded = _encode(client_state or {})
        staging = _staging_path(final)
        if self.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        dist.barrier()
        self._ds.save_checkpoint(str(staging), tag=DS_TAG, client_state={}, save_latest=False)
        _write_json(staging / "client_state" / f"rank-{self.rank:05d}.json", encoded)
        dist.barrier()
        if self.is_main_process:
            _write_json(staging / TRAINER_STATE, {
                "format_version": FORMAT_VERSION, "backend": self.backend, "global_step": self.global_step,
                "micro_step": int(self._ds.micro_steps), "world_size": self.world_size,
                "mixed_precision": self.precision, "zero_stage": self._ds.zero_optimization_stage(),
                "client_state": encoded,
            })
            publish_dir(staging, final)
        dist.barrier()
        return final

    def load(self, directory) -> dict:
        """Collective: every rank calls it; returns this rank's client_state."""
        directory = Path(directory)
        state = _read_trainer_state(directory, self.backend)
        path, _ = self._ds.load_checkpoint(str(directory), tag=DS_TAG, load_optimizer_states=True,
                                           load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint under {directory / DS_TAG}")
        own = directory / "client_state" / f"rank-{self.rank:05d}.json"
        if int(state["world_size"]) == self.world_size and own.is_file():
            return _decode(json.loads(own.read_text()))
        if self.world_size > 1 or int(state["world_size"]) > 1:
            log.warning("resuming a %s-rank checkpoint on %d ranks: every rank gets rank 0's client_state",
                        state["world_size"], self.world_size)
        return _decode(state["client_state"])


def make_engine(model: nn.Module, config: EngineConfig, device) -> Engine:
    """The DeepSpeed back end when ``config.deepspeed`` is set, else the plain torch one."""
    if config.deepspeed:
        return DeepSpeedEngine(model, config, device)
    return TorchEngine(model, config, device)

