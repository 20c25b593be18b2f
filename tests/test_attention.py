"""agents.wam.attention: backend resolution, per-call SDPA fallback, numerical equivalence.

No GPU or flash-attn here: FlashAttention packages are faked in sys.modules and the CUDA
checks are monkeypatched, so the selection and dispatch logic runs on CPU.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import sys
import types

import pytest
import torch

from agents.wam import attention as attn


def reference(q, k, v, mask=None):
    """softmax(QK^T / sqrt(d)) V in float64, flash-attn layout (B, L, H, D)."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def qkv(b=2, lq=5, lk=7, h=3, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(b, n, h, d, generator=g, dtype=dtype) for n in (lq, lk, lk))


class FakeKernel:
    """Stands in for flash_attn_func: reference attention, records calls."""

    def __init__(self, returns_lse: bool = False):
        self.calls = 0
        self.returns_lse = returns_lse

    def __call__(self, q, k, v, **kwargs):
        self.calls += 1
        out = reference(q, k, v).to(q.dtype)
        return (out, torch.zeros(1)) if self.returns_lse else out


@pytest.fixture(autouse=True)
def fresh_state():
    attn._reset()
    yield
    attn._reset()


@pytest.fixture
def fakes(monkeypatch):
    """install(name) puts a fake package for fa2/fa3/fa4 in sys.modules; returns its kernel."""

    def install(backend: str) -> FakeKernel:
        kernel = FakeKernel(returns_lse=backend in ("fa3", "fa4"))
        if backend == "fa3":
            fake = _module("flash_attn_interface", kernel)
            monkeypatch.setitem(sys.modules, "flash_attn_interface", fake)
            return kernel
        parent = sys.modules.get("flash_attn")
        if not getattr(parent, "is_fake", False):  # shadow a real install, never mutate it
            parent = _module("flash_attn", None)
            parent.__path__ = []  # a package, so flash_attn.cute can be its submodule
            parent.is_fake = True
            monkeypatch.setitem(sys.modules, "flash_attn", parent)
        if backend == "fa2":
            monkeypatch.setattr(parent, "flash_attn_func", kernel, raising=False)
        else:
            monkeypatch.setitem(sys.modules, "flash_attn.cute", _module("flash_attn.cute", kernel))
        attn._load_kernel.cache_clear()
        return kernel

    return install


def _module(name: str, kernel: FakeKernel | None) -> types.ModuleType:
    module = types.ModuleType(name)
    if kernel is not None:
        module.flash_attn_func = kernel
    return module


@pytest.fixture
def gpu(monkeypatch):
    """Pretend the device is a CUDA GPU of the given compute capability."""

    def pretend(capability=(9, 0)):
        monkeypatch.setattr(attn, "_cuda_capability", lambda device: capability)

    return pretend


# On a machine with real FlashAttention installed, "not installed" cases cannot be set up.
no_flash_installed = pytest.mark.skipif(
    any(importlib.util.find_spec(m) for m in ("flash_attn", "flash_attn_interface")),
    reason="a real FlashAttention package is installed",
)


# ---- resolution -----------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), None])
def test_auto_on_cpu_is_sdpa(device):
    if device is None and torch.cuda.is_available():
        pytest.skip("default device is CUDA here")
    assert attn.resolve_attention_backend("auto", device) == "sdpa"


def test_sdpa_always_resolves():
    assert attn.resolve_attention_backend("sdpa", "cpu") == "sdpa"


@pytest.mark.parametrize(
    ("backend", "fix"),
    [
        ("fa2", "pip install flash-attn"),
        ("fa3", "flash_attn_3"),
        ("fa4", "pip install flash-attn-4"),
    ],
)
@no_flash_installed
def test_explicit_flash_without_package_names_fix(backend, fix):
    with pytest.raises(attn.AttentionBackendError) as err:
        attn.resolve_attention_backend(backend, "cpu")
    message = str(err.value)
    assert fix in message
    assert "attention_backend=sdpa" in message and "auto" in message
    assert "GPU-only" in message


@pytest.mark.parametrize("backend", ["fa2", "fa3", "fa4"])
def test_explicit_flash_installed_but_on_cpu_says_gpu_only(fakes, backend):
    fakes(backend)
    with pytest.raises(attn.AttentionBackendError, match="GPU-only") as err:
        attn.resolve_attention_backend(backend, "cpu")
    assert "not importable" not in str(err.value)
    assert "attention_backend=sdpa or auto" in str(err.value)


@no_flash_installed
def test_explicit_flash_on_gpu_without_package_says_install(gpu):
    gpu((9, 0))
    with pytest.raises(attn.AttentionBackendError) as err:
        attn.resolve_attention_backend("fa2", "cuda")
    assert "pip install flash-attn" in str(err.value)
    assert "GPU-only" not in str(err.value)


def test_unknown_backend_lists_choices():
    with pytest.raises(ValueError) as err:
        attn.resolve_attention_backend("flash", "cpu")
    for choice in attn.BACKENDS:
        assert choice in str(err.value)


def test_fa2_with_fake_package_on_gpu(fakes, gpu):
    fakes("fa2")
    gpu((8, 0))
    assert attn.resolve_attention_backend("fa2", "cuda") == "fa2"


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        (["fa2"], "fa2"),
        (["fa3"], "fa3"),
        (["fa2", "fa3"], "fa3"),
        (["fa2", "fa4"], "fa4"),
        (["fa2", "fa3", "fa4"], "fa4"),
    ],
)
def test_auto_prefers_newest_available(fakes, gpu, installed, expected):
    for backend in installed:
        fakes(backend)
    gpu((9, 0))
    assert attn.resolve_attention_backend("auto", "cuda") == expected


def test_auto_skips_fa4_below_hopper(fakes, gpu):
    fakes("fa2")
    fakes("fa4")
    gpu((8, 0))
    assert attn.resolve_attention_backend("auto", "cuda") == "fa2"
    with pytest.raises(attn.AttentionBackendError, match="compute capability"):
        attn.resolve_attention_backend("fa4", "cuda")


@no_flash_installed
def test_auto_on_gpu_without_packages_is_sdpa(gpu):
    gpu((9, 0))
    assert attn.resolve_attention_backend("auto", "cuda") == "sdpa"


def test_fake_on_cpu_still_resolves_sdpa_under_auto(fakes):
    fakes("fa2")
    assert attn.resolve_attention_backend("auto", "cpu") == "sdpa"


def test_selection_is_logged_once(caplog):
    caplog.set_level(logging.INFO, logger="agents.wam.attention")
    attn.resolve_attention_backend("auto", "cpu")
    attn.resolve_attention_backend("auto", "cpu")
    lines = [r.getMessage() for r in caplog.records if r.name == "agents.wam.attention"]
    assert len(lines) == 1
    assert lines[0].startswith("attention backend: requested=auto selected=sdpa (")


def test_explicit_selection_is_logged(fakes, gpu, caplog):
    fakes("fa3")
    gpu((9, 0))
    caplog.set_level(logging.INFO, logger="agents.wam.attention")
    attn.resolve_attention_backend("fa3", "cuda")
    assert "requested=fa3 selected=fa3" in caplog.text


# ---- per-call dispatch ----------------------------------------------------------------


def test_cpu_fp32_call_falls_back_to_sdpa(fakes, gpu, caplog):
    kernel = fakes("fa2")
    gpu((8, 0))
    backend = attn.resolve_attention_backend("fa2", "cuda")
    caplog.set_level(logging.INFO, logger="agents.wam.attention")
    q, k, v = qkv()
    out = attn.attention(q, k, v, backend)
    attn.attention(q, k, v, backend)
    assert kernel.calls == 0
    assert attn.FALLBACKS[attn.NOT_CUDA] == 2
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=1e-5, rtol=1e-5)
    fallback_lines = [r for r in caplog.records if "-> sdpa" in r.getMessage()]
    assert len(fallback_lines) == 1  # logged once per (backend, reason)
    assert "not_cuda" in fallback_lines[0].getMessage()


@pytest.fixture
def cuda_tensors(monkeypatch):
    """Treat CPU tensors as CUDA ones so the FlashAttention path is taken."""
    monkeypatch.setattr(attn, "_tensor_on_cuda", lambda t: True)


@pytest.mark.parametrize("backend", ["fa2", "fa3", "fa4"])
def test_eligible_call_uses_kernel_and_unwraps_lse(fakes, cuda_tensors, backend):
    kernel = fakes(backend)
    q, k, v = qkv(dtype=torch.float16)
    out = attn.attention(q, k, v, backend)
    assert kernel.calls == 1
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == torch.float16
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=2e-3, rtol=2e-3)
    assert not attn.FALLBACKS


@pytest.mark.parametrize(
    ("kwargs", "mask", "reason"),
    [
        ({"dtype": torch.float32}, False, attn.DTYPE),
        ({"dtype": torch.float16, "d": 12}, False, attn.HEAD_DIM),
        ({"dtype": torch.float16, "d": 264}, False, attn.HEAD_DIM),
        ({"dtype": torch.float16}, True, attn.ATTN_MASK),
    ],
)
def test_ineligible_call_falls_back(fakes, cuda_tensors, kwargs, mask, reason):
    kernel = fakes("fa2")
    q, k, v = qkv(**kwargs)
    attn_mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool) if mask else None
    out = attn.attention(q, k, v, "fa2", attn_mask=attn_mask)
    assert kernel.calls == 0
    assert attn.FALLBACKS == {reason: 1}
    assert out.shape == q.shape and out.dtype == q.dtype


def test_unresolved_backend_name_is_rejected():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="resolve_attention_backend"):
        attn.attention(q, k, v, "auto")


# ---- SDPA numerics --------------------------------------------------------------------


@pytest.mark.parametrize(("lq", "lk"), [(5, 5), (4, 11), (9, 1)])
def test_sdpa_matches_reference_cross_attention(lq, lk):
    q, k, v = qkv(lq=lq, lk=lk, d=32)
    out = attn.attention(q, k, v, "sdpa")
    assert out.shape == (2, lq, 3, 32)
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=1e-5, rtol=1e-5)
    assert not attn.FALLBACKS


def test_sdpa_matches_reference_with_bool_mask():
    q, k, v = qkv(lq=6, lk=9)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(2, 1, 6, 9, generator=g) > 0.4  # (B, 1, Lq, Lk), broadcast over heads
    mask[..., 0] = True  # no fully masked row: its softmax is undefined
    out = attn.attention(q, k, v, "sdpa", attn_mask=mask)
    torch.testing.assert_close(out.double(), reference(q, k, v, mask), atol=1e-5, rtol=1e-5)
    unmasked = attn.attention(q, k, v, "sdpa")
    assert not torch.allclose(out, unmasked)
