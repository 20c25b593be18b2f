"""The engine group of the training config: optimizer, LR schedule, batch, precision, back end.

:class:`EngineConfig` is the one owner of these knobs. ``TrainConfig`` (training/config.py)
takes them as its own top-level fields (it subclasses EngineConfig), so users keep typing
``lr=``, ``batch_size=``, ``mixed_precision=``, ``deepspeed=``, ... and the training config is
handed to :func:`~training.engine.make_engine` as it is: nothing is copied field by field.

Mixed precision. ``"auto"`` means bf16 on CUDA (when the GPU supports it) and fp32 elsewhere.
With bf16 the torch back end keeps fp32 weights, fp32 gradients and fp32 optimizer state and runs
the forward under ``torch.autocast(bfloat16)``; DeepSpeed's bf16 mode instead casts the module to
bf16 itself (fp32 master weights live in the ZeRO optimizer). See :meth:`Engine.autocast`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

MIXED_PRECISION = ("auto", "bf16", "fp32")
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class EngineConfig:
    """Top-level knobs of ``python -m training`` that the engine reads (EasyWAM's names)."""

    deepspeed: str | None = None  # zero1 | zero2 | zero2_offload | a ZeRO JSON path; null: plain torch, one process
    mixed_precision: str = "auto"  # auto (bf16 on a GPU that has it, else fp32) | bf16 | fp32
    batch_size: int = 8  # per process and micro-step (DeepSpeed's train_micro_batch_size_per_gpu)
    gradient_accumulation_steps: int = 1  # micro-steps per optimizer step
    max_steps: int = 1000  # optimizer steps; the cosine schedule reaches 0 here
    lr: float = 1e-4  # peak learning rate of AdamW
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's moment decay rates
    grad_clip: float = 1.0  # max global gradient norm; <= 0: no clipping (the norm is still logged)
    warmup_steps: int = 0  # linear warmup from lr / warmup_steps to lr
    lr_schedule: str = "constant"  # after warmup: constant | cosine (down to 0 at max_steps)

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # Hydra hands over a list
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers, got {self.betas}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be auto, bf16 or fp32, got {self.mixed_precision!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}")
        for name, low in (("batch_size", 1), ("gradient_accumulation_steps", 1), ("max_steps", 1), ("warmup_steps", 0)):
            require_int(name, getattr(self, name), low, EngineConfig.__dataclass_fields__[name].default)
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr={self.lr} must be a positive finite number (the peak AdamW learning rate), e.g. lr=1e-4")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0 (0 turns it off)")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas={list(self.betas)} must each be in [0, 1), e.g. betas=[0.9,0.999]")
        if self.deepspeed in ("", "none", "None", "null"):
            self.deepspeed = None


def require_int(name: str, value, low: int, example: int | None = None) -> None:
    """``name`` must be an int >= ``low``: refused when the config is built, not steps into a run
    (``save_every=0`` used to be a ZeroDivisionError after the model was built). ``example``: a
    value to suggest (the knob's default)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        fix = example if isinstance(example, int) and example >= low else low
        raise ValueError(f"{name}={value!r} must be an integer >= {low}: set {name}={fix} (or another integer >= {low})")


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
