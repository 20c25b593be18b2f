"""Per-module precision policy, after UnifoLM-WMA's ``--encoder_mode``.

Three modes, chosen per model part (:class:`PrecisionConfig`):

* ``fp32``      -- fp32 weights, fp32 activations.
* ``autocast``  -- fp32 weights, matmuls/convs run in bf16 under ``torch.autocast``.
* ``bf16_full`` -- weights, buffers and activations all in bf16 (half the memory).

A part needs two things: its weights cast once (:func:`apply_precision`) and its forward
run in the right scope (:func:`precision_scope`, or :func:`run_in_precision` which also casts
inputs and outputs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

MODES = ("fp32", "autocast", "bf16_full")


def _check_mode(mode: str, name: str = "mode") -> None:
    if mode not in MODES:
        raise ValueError(f"{name}={mode!r} is not a precision mode; expected one of {MODES} "
                         "(bf16 weights: bf16_full; fp32 weights with bf16 matmuls: autocast)")


@dataclass
class PrecisionConfig:
    """Precision mode of each model part; every field is one of :data:`MODES`."""

    backbone: str = "fp32"  # both experts' transformer blocks
    projectors: str = "fp32"  # patch embedding, time/text projections and output heads
    text_encoder: str = "fp32"  # the UMT5 instruction encoder
    vae: str = "fp32"  # the VAE (the image encoder/decoder); bf16 here costs reconstruction PSNR

    def __post_init__(self) -> None:
        for name, mode in self.items():
            _check_mode(mode, f"encoder_mode.{name}")

    @classmethod
    def uniform(cls, mode: str) -> PrecisionConfig:
        """The same mode for every part."""
        _check_mode(mode)
        return cls(**{f.name: mode for f in fields(cls)})

    def items(self) -> Iterator[tuple[str, str]]:
        """``(part, mode)`` pairs in field order."""
        for f in fields(self):
            yield f.name, getattr(self, f.name)


def module_dtype(mode: str) -> torch.dtype:
    """Dtype a module's weights (and its inputs) have under ``mode``."""
    _check_mode(mode)
    return torch.bfloat16 if mode == "bf16_full" else torch.float32


def apply_precision(module: nn.Module, mode: str) -> nn.Module:
    """Cast ``module`` in place to ``module_dtype(mode)`` and return it.

    ``fp32``/``autocast`` also cast *to* fp32, so weights loaded as bf16 from a checkpoint are
    upcast and applying a policy is idempotent. ``nn.Module.to(dtype)`` only touches floating
    parameters and buffers, so integer buffers (e.g. BatchNorm's ``num_batches_tracked``) stay.
    """
    dtype = module_dtype(mode)
    tensors = [*module.parameters(), *module.buffers()]
    if all(t.dtype == dtype for t in tensors if t.is_floating_point()):
        return module  # already there: skip the cast (diffusers warns on every .to(dtype))
    return module.to(dtype=dtype)


def precision_scope(
    mode: str, device: torch.device | str
) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast(bf16)`` on ``device``'s type for ``autocast``; a no-op otherwise.

    ``bf16_full`` needs no autocast: its weights already are bf16, and autocast would only
    add casts (and upcast the ops it keeps in fp32, e.g. softmax, layer_norm).
    """
    _check_mode(mode)
    if mode != "autocast":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def _cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """Cast floating tensors in ``value`` (a tensor, tuple, list or dict) to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_cast_floating(v, dtype) for v in value)
    if isinstance(value, list):
        return [_cast_floating(v, dtype) for v in value]
    if isinstance(value, dict):
        return {k: _cast_floating(v, dtype) for k, v in value.items()}
    return value


def run_in_precision(
    mode: str,
    module_device: torch.device | str,
    fn: Callable[..., Any],
    *tensors: Any,
    **kw: Any,
) -> Any:
    """Call ``fn(*tensors, **kw)`` the way a part in ``mode`` on ``module_device`` expects.

    Floating positional tensors are cast to ``module_dtype(mode)`` (a bf16 module would
    otherwise fail on fp32 inputs); ``kw`` passes through untouched. The call runs inside
    :func:`precision_scope`, and floating tensors in the output (tensor, tuple, list or
    dict) come back as fp32 so callers never see bf16 leak out of a part.
    """
    dtype = module_dtype(mode)
    args = tuple(_cast_floating(t, dtype) for t in tensors)
    with precision_scope(mode, module_device):
        out = fn(*args, **kw)
    return _cast_floating(out, torch.float32)
