import copy

import pytest
import torch
from torch import nn

from agents.wam.precision import (
    MODES,
    PrecisionConfig,
    apply_precision,
    module_dtype,
    precision_scope,
    run_in_precision,
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    return net.eval()  # eval: BatchNorm uses (and keeps) its running-stat buffers


def test_config_defaults_uniform_and_items():
    assert list(PrecisionConfig().items()) == [
        ("backbone", "fp32"),
        ("projectors", "fp32"),
        ("text_encoder", "fp32"),
        ("vae", "fp32"),
    ]
    cfg = PrecisionConfig.uniform("bf16_full")
    assert {mode for _, mode in cfg.items()} == {"bf16_full"}
    assert PrecisionConfig(vae="autocast").vae == "autocast"


def test_config_rejects_bad_mode_naming_field_and_modes():
    with pytest.raises(ValueError, match="text_encoder") as err:
        PrecisionConfig(text_encoder="fp16")
    for mode in MODES:
        assert mode in str(err.value)
    with pytest.raises(ValueError):
        PrecisionConfig.uniform("half")


@pytest.mark.parametrize(
    "call",
    [
        lambda: module_dtype("bf16"),
        lambda: apply_precision(nn.Linear(2, 2), "bf16"),
        lambda: precision_scope("bf16", "cpu"),
        lambda: run_in_precision("bf16", "cpu", lambda x: x, torch.ones(1)),
    ],
)
def test_invalid_mode_raises(call):
    with pytest.raises(ValueError, match="bf16_full"):
        call()


def test_module_dtype():
    assert module_dtype("fp32") is torch.float32
    assert module_dtype("autocast") is torch.float32
    assert module_dtype("bf16_full") is torch.bfloat16


def test_bf16_full_casts_params_and_float_buffers_only():
    net = apply_precision(_net(), "bf16_full")
    assert all(p.dtype is torch.bfloat16 for p in net.parameters())
    bn = net[1]
    assert bn.running_mean.dtype is torch.bfloat16
    assert bn.running_var.dtype is torch.bfloat16
    assert bn.num_batches_tracked.dtype is torch.int64
    # fp32 upcasts again: a policy pins the dtype whatever the weights were loaded as.
    apply_precision(net, "fp32")
    assert all(p.dtype is torch.float32 for p in net.parameters())
    assert bn.running_mean.dtype is torch.float32


@pytest.mark.parametrize("mode", ["fp32", "autocast"])
def test_fp32_weights_modes_are_exact_noops(mode):
    net = _net()
    ref = copy.deepcopy(net)
    x = torch.randn(5, 4)
    out = apply_precision(net, mode)
    assert out is net
    for p, q in zip(net.parameters(), ref.parameters()):
        assert p.dtype is torch.float32 and torch.equal(p, q)
    assert torch.equal(net(x), ref(x))


def test_precision_scope_autocast_runs_linear_in_bf16_with_fp32_weights():
    net = apply_precision(_net(), "autocast")
    x = torch.randn(5, 4)
    with precision_scope("autocast", torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
        y = net(x)
    assert y.dtype is torch.bfloat16
    assert net[0].weight.dtype is torch.float32
    assert not torch.is_autocast_enabled("cpu")
    torch.testing.assert_close(y.float(), _net()(x), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("mode", ["fp32", "bf16_full"])
def test_precision_scope_is_noop_outside_autocast(mode):
    with precision_scope(mode, "cpu"):
        assert not torch.is_autocast_enabled("cpu")
        assert nn.Linear(2, 2)(torch.ones(1, 2)).dtype is torch.float32


def test_bf16_full_forward_is_bf16():
    net = apply_precision(_net(), "bf16_full")
    with precision_scope("bf16_full", "cpu"):
        y = net(torch.randn(5, 4, dtype=torch.bfloat16))
    assert y.dtype is torch.bfloat16


def test_run_in_precision_casts_inputs_and_outputs():
    x = torch.randn(5, 4)
    ref = _net()(x)
    net = apply_precision(_net(), "bf16_full")
    y = run_in_precision("bf16_full", "cpu", net, x)  # fp32 input into a bf16 module
    assert y.dtype is torch.float32
    torch.testing.assert_close(y, ref, atol=5e-2, rtol=5e-2)
    assert torch.equal(run_in_precision("fp32", "cpu", _net(), x), ref)


def test_run_in_precision_structured_outputs_and_non_float_inputs():
    seen = {}

    def fn(x, idx, scale=1.0):
        seen["x"], seen["idx"] = x.dtype, idx.dtype
        h = nn.functional.linear(x, torch.ones(3, x.shape[-1], dtype=x.dtype)) * scale
        return {"h": h, "pair": (h, idx)}

    x, idx = torch.randn(2, 3), torch.arange(2)
    out = run_in_precision("autocast", "cpu", fn, x, idx, scale=2.0)
    assert seen == {"x": torch.float32, "idx": torch.int64}
    assert out["h"].dtype is torch.float32  # bf16 under autocast, cast back
    assert out["pair"][0].dtype is torch.float32 and out["pair"][1].dtype is torch.int64
    want = 2 * x.sum(-1, keepdim=True).expand(2, 3)
    torch.testing.assert_close(out["h"], want, atol=0.1, rtol=0.02)

    run_in_precision("bf16_full", "cpu", fn, x, idx)
    assert seen == {"x": torch.bfloat16, "idx": torch.int64}
