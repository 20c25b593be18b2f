"""The plain torch back end: one process, AdamW over the trainable parameters, a LambdaLR
schedule (linear warmup, then constant or cosine), gradient clipping and accumulation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from training.engine import checkpoint as ckpt
from training.engine.base import Engine
from training.engine.config import EngineConfig, lr_lambda, resolve_mixed_precision


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
        clip = self.config.grad_clip if self.config.grad_clip and self.config.grad_clip > 0 else float("inf")
        self._grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, clip))  # inf: measured, not clipped
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
        encoded = ckpt.encode(client_state or {})  # fail before writing anything
        staging = ckpt.fresh_staging(final)
        trainable = [name for name, p in self.module.named_parameters() if p.requires_grad]
        save_model(self.module, str(staging / ckpt.MODEL_FILE),
                   metadata={"format": "pt", "trainable": json.dumps(trainable)})
        torch.save(self.optimizer.state_dict(), staging / ckpt.OPTIMIZER_FILE)
        torch.save(self.scheduler.state_dict(), staging / ckpt.SCHEDULER_FILE)
        ckpt.write_json(staging / ckpt.TRAINER_STATE, ckpt.trainer_state(
            backend=self.backend, global_step=self._global_step, micro_step=self._micro_step, world_size=1,
            mixed_precision=self.precision, client_state=encoded))
        ckpt.publish(staging, final)
        return final

    def load(self, directory) -> dict:
        from safetensors.torch import load_model

        directory = Path(directory)
        state = ckpt.read_trainer_state(directory, self.backend)
        load_model(self.module, str(directory / ckpt.MODEL_FILE), strict=True, device=str(self.device))
        self.optimizer.load_state_dict(ckpt.load_tensors(directory / ckpt.OPTIMIZER_FILE))
        self.scheduler.load_state_dict(ckpt.load_tensors(directory / ckpt.SCHEDULER_FILE))
        self._global_step = int(state["global_step"])
        self._micro_step = int(state["micro_step"])
        self._grad_norm = None
        return ckpt.decode(state["client_state"])
