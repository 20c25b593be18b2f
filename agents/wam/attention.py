"""Attention-kernel selection: EasyWAM's ``model.backbone.attention_backend`` knob.

``resolve_attention_backend`` turns the configured name (``auto|fa4|fa3|fa2|sdpa``) into a
concrete kernel once, at model build time, so a missing or unusable FlashAttention fails
early with a message saying how to fix it. ``attention`` then runs one call with that
kernel, dropping to PyTorch SDPA for calls the kernel cannot take (CPU tensors, fp32, an
odd head dim, an explicit mask); each such fallback is counted in ``FALLBACKS`` and logged
once, so a silently slow run is visible.

Tensors use the flash-attn layout: q ``(B, Lq, H, D)``, k/v ``(B, Lk, H, D)``.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

logger = logging.getLogger("agents.wam.attention")

BACKENDS = ("auto", "fa4", "fa3", "fa2", "sdpa")

# Fallback reasons: stable keys of FALLBACKS (the log line carries the details).
NOT_CUDA, DTYPE, HEAD_DIM, ATTN_MASK = "not_cuda", "dtype", "head_dim", "attn_mask"

FALLBACKS: Counter[str] = Counter()
"""How many ``attention`` calls fell back to SDPA, keyed by reason."""

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_logged: set[tuple[str, ...]] = set()


class AttentionBackendError(RuntimeError):
    """The requested attention backend cannot run here; the message says what to do."""


@dataclass(frozen=True)
class _Flash:
    """How to import one FlashAttention generation and what it can run."""

    module: str
    install: str
    min_capability: tuple[int, int]
    max_head_dim: int = 256
    head_dim_multiple: int = 8


# Head-dim limits are the kernels' own checks: FA2 csrc/flash_attn/flash_api.cpp and FA3
# hopper/ (D <= 256, D % 8 == 0); FA4 flash_attn/cute/interface.py (D <= 256, D aligned to
# 16 bytes = 8 fp16/bf16 elements). FA4 targets Hopper/Blackwell only, and FA2's CUDA
# kernels start at Ampere; an older GPU would pass the import and then fail on every call.
_FLASH: dict[str, _Flash] = {
    "fa4": _Flash("flash_attn.cute", "pip install flash-attn-4", (9, 0)),
    "fa3": _Flash(
        "flash_attn_interface",
        "build the flash_attn_3 package from flash-attention/hopper "
        "(cd hopper && python setup.py install)",
        (8, 0),
    ),
    "fa2": _Flash("flash_attn", "pip install flash-attn --no-build-isolation", (8, 0)),
}
_AUTO_ORDER = ("fa4", "fa3", "fa2")


@functools.cache
def _load_kernel(backend: str) -> tuple[Callable[..., object] | None, str]:
    """Import ``flash_attn_func`` for ``backend`` once; return (func, error text)."""
    try:
        module = importlib.import_module(_FLASH[backend].module)
        return module.flash_attn_func, ""
    # A broken optional install raises more than ImportError (missing CUDA libraries,
    # CuTe DSL setup errors, an old version lacking the name); `auto` must survive all.
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"


def _cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of ``device``, or None when it is not a usable CUDA device."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def _log_once(key: tuple[str, ...], message: str) -> None:
    # Resolution and fallbacks repeat every layer and step; one line each is enough.
    if key not in _logged:
        _logged.add(key)
        logger.info(message)


def _gpu_problem(backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run on ``device``, or None when it can."""
    capability = _cuda_capability(device)
    if capability is None:
        return f"{backend} is a GPU-only backend and {device} is not an available CUDA device"
    need = _FLASH[backend].min_capability
    if capability < need:
        return f"{backend} needs compute capability >= {need[0]}.{need[1]}, got {capability}"
    return None


def _import_problem(backend: str) -> str | None:
    spec = _FLASH[backend]
    func, error = _load_kernel(backend)
    if func is None:
        return f"{spec.module}.flash_attn_func is not importable ({error}); fix: {spec.install}"
    return None


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _resolve_auto(device: torch.device) -> tuple[str, str]:
    """First usable kernel in FA4 > FA3 > FA2 order, else SDPA; returns (backend, reason)."""
    if _cuda_capability(device) is None:
        return "sdpa", f"{device} is not a CUDA device"
    skipped = []
    for backend in _AUTO_ORDER:
        if _load_kernel(backend)[0] is None:
            skipped.append(f"{backend} not installed")
        elif problem := _gpu_problem(backend, device):
            skipped.append(problem)
        else:
            return backend, ", ".join([*skipped, f"{backend} usable on {device}"])
    return "sdpa", ", ".join(skipped)


def _require(backend: str, device: torch.device) -> None:
    """Raise AttentionBackendError naming every fix when ``backend`` cannot run."""
    problems = [p for p in (_import_problem(backend), _gpu_problem(backend, device)) if p]
    if problems:
        raise AttentionBackendError(
            f"attention_backend={backend} cannot run: {'; '.join(problems)}. "
            "attention_backend=sdpa or auto works without FlashAttention, and on CPU."
        )


def resolve_attention_backend(name: str, device: torch.device | str | None = None) -> str:
    """Return the concrete backend (``fa4|fa3|fa2|sdpa``) that ``name`` means on ``device``.

    ``device`` defaults to CUDA when available, else CPU. ``auto`` never fails; an explicit
    FlashAttention name raises AttentionBackendError when it cannot run, and an unknown
    name raises ValueError.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown attention_backend {name!r}; choose one of {', '.join(BACKENDS)}")
    dev = _default_device() if device is None else torch.device(device)
    if name == "auto":
        selected, reason = _resolve_auto(dev)
    elif name == "sdpa":
        selected, reason = "sdpa", "requested"
    else:
        _require(name, dev)
        selected, reason = name, f"usable on {dev}"
    _log_once(
        ("resolve", name, selected, str(dev)),
        f"attention backend: requested={name} selected={selected} ({reason})",
    )
    return selected


class ResolvedBackends:
    """A model's attention backend per device type, each resolved on first use: resolving probes the
    kernels, so a forward pass asks here instead."""

    def __init__(self) -> None:
        self._by_type: dict[str, str] = {}

    def on(self, name: str, device: torch.device) -> str:
        """The concrete backend ``name`` means on ``device`` (:func:`resolve_attention_backend`, once per type)."""
        if device.type not in self._by_type:
            self._by_type[device.type] = resolve_attention_backend(name, device)
        return self._by_type[device.type]


def _tensor_on_cuda(t: torch.Tensor) -> bool:
    return t.is_cuda


def _fallback_reason(
    backend: str, q: torch.Tensor, attn_mask: torch.Tensor | None
) -> tuple[str, str] | None:
    """(reason key, detail) when this call cannot use ``backend``'s kernel, else None."""
    spec, d = _FLASH[backend], q.shape[-1]
    if not _tensor_on_cuda(q):
        return NOT_CUDA, f"tensors on {q.device}"
    if q.dtype not in _FLASH_DTYPES:
        return DTYPE, f"{q.dtype} is not fp16/bf16"
    if d > spec.max_head_dim or d % spec.head_dim_multiple:
        rule = f"<= {spec.max_head_dim} and a multiple of {spec.head_dim_multiple}"
        return HEAD_DIM, f"head dim {d} (needs {rule})"
    if attn_mask is not None:
        return ATTN_MASK, "flash_attn_func takes no arbitrary mask"
    return None


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None
) -> torch.Tensor:
    # SDPA wants (B, H, L, D); the transposes are views, SDPA handles the strides.
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask
    )
    return out.transpose(1, 2)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    backend: str,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention, scale 1/sqrt(D), no dropout, non-causal.

    q ``(B, Lq, H, D)``, k/v ``(B, Lk, H, D)``; returns ``(B, Lq, H, D)`` in q's dtype.
    ``backend`` is a name returned by ``resolve_attention_backend``. ``attn_mask`` uses
    SDPA's convention: broadcastable to ``(B, H, Lq, Lk)``, bool True = attend, or a float
    bias added to the scores; any mask forces the SDPA path.
    """
    if backend not in _FLASH and backend != "sdpa":
        raise ValueError(
            f"backend {backend!r} is not resolved; call resolve_attention_backend first"
        )
    if backend == "sdpa":
        return _sdpa(q, k, v, attn_mask).to(q.dtype)
    reason = _fallback_reason(backend, q, attn_mask)
    if reason is not None:
        key, detail = reason
        FALLBACKS[key] += 1
        _log_once(("fallback", backend, key), f"attention: {backend} -> sdpa ({key}: {detail})")
        return _sdpa(q, k, v, attn_mask).to(q.dtype)
    func, error = _load_kernel(backend)
    if func is None:
        raise AttentionBackendError(f"{backend} kernel unavailable ({error})")
    out = func(q, k, v)
    # FA3 (some versions) and FA4 return (out, softmax_lse).
    if isinstance(out, tuple):
        out = out[0]
    return out.to(q.dtype)


def _reset() -> None:
    """Forget cached imports, counters and logged lines (for tests)."""
    _load_kernel.cache_clear()
    FALLBACKS.clear()
    _logged.clear()
