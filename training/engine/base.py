"""The interface the training loop uses; :func:`~training.engine.make_engine` returns one of its
two back ends (:class:`~training.engine.torch_engine.TorchEngine`,
:class:`~training.engine.deepspeed_engine.DeepSpeedEngine`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.engine.config import EngineConfig


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (requires_grad=True)")
    return params


class Engine:
    """Forward, backward, optimizer step, checkpoint: the same calls on either back end."""

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
        """bf16 autocast when mixed precision is bf16 and the weights are fp32; otherwise a no-op.

        So the torch back end (fp32 weights) runs the forward under autocast, while under DeepSpeed
        bf16 (bf16 weights) this is a no-op and inputs should be given in :attr:`dtype`
        (``x.to(engine.dtype)`` is right for both back ends)."""
        if self._autocast:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _check_boundary(self, micro_step: int) -> None:
        if micro_step % self.config.gradient_accumulation_steps:
            raise RuntimeError("save() in the middle of gradient accumulation: accumulated gradients are not "
                               "checkpointed, so resume would not be exact; save right after step() returns True")
