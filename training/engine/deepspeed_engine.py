"""The DeepSpeed back end: ``deepspeed.initialize`` with a ZeRO JSON from ``training/configs``.

The batch / accumulation / clipping / bf16 keys are filled from :class:`EngineConfig`
(:data:`ENGINE_OWNED_KEYS`); the JSON files hold only the ZeRO-specific parts. They carry no
``"scheduler"`` block (the engine always passes its own LambdaLR, so both back ends share one
schedule) and an ``"optimizer"`` block only where DeepSpeed must pick the optimizer:
``zero2_offload`` asks for ``AdamW``, which DeepSpeed maps to its CPU Adam (``DeepSpeedCPUAdam``,
a compiled op) for the offloaded fp32 partitions. Without an ``"optimizer"`` block the engine
passes a ``torch.optim.AdamW`` (no op build). lr / betas / weight_decay always come from EngineConfig.

Save and load are collective: every rank must call :meth:`Engine.save` / :meth:`Engine.load`, and
the checkpoint root must be a filesystem shared by all ranks (layout: training/engine/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from training.engine import checkpoint as ckpt
from training.engine.base import Engine, trainable_parameters
from training.engine.config import EngineConfig, lr_lambda, resolve_mixed_precision

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEEPSPEED_CONFIGS = ("zero1", "zero2", "zero2_offload")
# Keys the engine writes into the DeepSpeed config from EngineConfig (the JSON files must not).
ENGINE_OWNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                     "gradient_clipping", "bf16", "fp16", "scheduler")
# DeepSpeed's ops compile in 1-3 min on 2 cores; a build lock older than this was left by a killed build.
STALE_BUILD_LOCK_S = 15 * 60


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
        raise ValueError("deepspeed is null: the torch back end uses no DeepSpeed config")
    path = resolve_deepspeed_config(config.deepspeed)
    ds = json.loads(path.read_text())
    if "scheduler" in ds:
        raise ValueError(f"{path}: drop the 'scheduler' block; the LR schedule comes from the engine knobs "
                         "(warmup_steps, lr_schedule, max_steps) for both back ends")
    if ds.get("fp16", {}).get("enabled", False):
        raise ValueError(f"{path}: fp16 is not supported; set mixed_precision=bf16 or fp32")
    ds.pop("fp16", None)
    ds.pop("train_batch_size", None)  # DeepSpeed derives it: micro * accumulation * world size
    precision = resolve_mixed_precision(config.mixed_precision, device)
    ds["train_micro_batch_size_per_gpu"] = config.batch_size
    ds["gradient_accumulation_steps"] = config.gradient_accumulation_steps
    ds["gradient_clipping"] = max(0.0, float(config.grad_clip or 0.0))
    ds["bf16"] = {**ds.get("bf16", {}), "enabled": precision == "bf16"}
    if "optimizer" in ds:
        opt = dict(ds["optimizer"])
        opt["params"] = {**opt.get("params", {}), "lr": config.lr, "betas": list(config.betas),
                         "weight_decay": config.weight_decay}
        ds["optimizer"] = opt
    return ds


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


def warn_stale_build_locks(now: float | None = None) -> list[Path]:
    """Name the build locks a killed compile left: torch's extension builder waits on one forever,
    silently, the next time DeepSpeed builds that op (its shm comm op, CPU Adam)."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    now = time.time() if now is None else now
    ages = {}
    for lock in root.glob("**/lock"):
        with contextlib.suppress(FileNotFoundError):  # a build on another rank just finished and removed it
            ages[lock] = now - lock.stat().st_mtime
    stale = sorted(lock for lock, age in ages.items() if age > STALE_BUILD_LOCK_S)
    for lock in stale:
        log.warning("%s is %.0f min old: a DeepSpeed op build killed mid-way left it, and the next build of that op "
                    "waits on it forever. If no other process is compiling, delete it", lock, ages[lock] / 60)
    return stale


class DeepSpeedEngine(Engine):
    backend = "deepspeed"

    def __init__(self, model: nn.Module, config: EngineConfig, device):
        import deepspeed

        self.config = config
        self.precision = resolve_mixed_precision(config.mixed_precision, torch.device(device))
        ds_config = deepspeed_config_dict(config, device)
        warn_stale_build_locks()
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
        ckpt.restrict_to_weights_only(self._ds)  # DeepSpeed's own loader would fully unpickle ds/*.pt
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
        encoded = ckpt.encode(client_state or {})
        staging = ckpt.staging_path(final)
        if self.is_main_process:
            ckpt.fresh_staging(final)
        dist.barrier()
        self._ds.save_checkpoint(str(staging), tag=ckpt.DS_TAG, client_state={}, save_latest=False)
        ckpt.write_json(staging / "client_state" / f"rank-{self.rank:05d}.json", encoded)
        dist.barrier()
        if self.is_main_process:
            ckpt.write_json(staging / ckpt.TRAINER_STATE, ckpt.trainer_state(
                backend=self.backend, global_step=self.global_step, micro_step=int(self._ds.micro_steps),
                world_size=self.world_size, mixed_precision=self.precision,
                zero_stage=self._ds.zero_optimization_stage(), client_state=encoded))
            ckpt.publish(staging, final)
        dist.barrier()
        return final

    def load(self, directory) -> dict:
        """Collective: every rank calls it; returns this rank's client_state."""
        directory = Path(directory)
        state = ckpt.read_trainer_state(directory, self.backend)
        path, _ = self._ds.load_checkpoint(str(directory), tag=ckpt.DS_TAG, load_optimizer_states=True,
                                           load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint under {directory / ckpt.DS_TAG}")
        own = directory / "client_state" / f"rank-{self.rank:05d}.json"
        if int(state["world_size"]) == self.world_size and own.is_file():
            return ckpt.decode(json.loads(own.read_text()))
        if self.world_size > 1 or int(state["world_size"]) > 1:
            log.warning("resuming a %s-rank checkpoint on %d ranks: every rank gets rank 0's client_state",
                        state["world_size"], self.world_size)
        return ckpt.decode(state["client_state"])
