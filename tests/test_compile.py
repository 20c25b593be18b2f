import pytest
import torch
from torch import nn

from agents.wam.compile import CompileConfig, CompileConfigMismatch, compile_module, compiled_config


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.body[0](x)


@pytest.fixture
def spy(monkeypatch):
    """Replace torch.compile with a recorder whose "compiled" function just calls the original."""
    calls = []

    def fake_compile(fn, **kwargs):
        calls.append((fn, kwargs))

        def compiled(*a, **kw):
            return fn(*a, **kw)

        compiled.wrapped = fn
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    return calls


def test_defaults_reach_torch_compile(spy):
    """Off by default; switched on, the defaults are what torch.compile receives (None options = {})."""
    net = _Net()
    assert compile_module(net, CompileConfig()) is net and spy == []
    compile_module(net, CompileConfig(enabled=True, options=None))
    [(_, kwargs)] = spy
    assert kwargs == {"mode": "reduce-overhead", "backend": "inductor", "fullgraph": False, "dynamic": None,
                      "options": None}
    assert compiled_config(net) == CompileConfig(enabled=True)  # options=None and {} are one setting


def test_forwards_every_knob_exactly(spy):
    net = _Net()
    cfg = CompileConfig(
        enabled=True, mode="max-autotune", backend="inductor", fullgraph=True, dynamic=False
    )
    assert compile_module(net, cfg) is net
    [(fn, kwargs)] = spy
    assert kwargs == {
        "mode": "max-autotune",
        "backend": "inductor",
        "fullgraph": True,
        "dynamic": False,
        "options": None,
    }
    # The bound original forward is what gets compiled, and the instance now uses the result.
    assert fn.__self__ is net and fn.__func__ is _Net.forward
    assert net.__dict__["forward"].wrapped is fn
    assert compiled_config(net) == cfg
    x = torch.randn(3, 4)
    assert torch.equal(net(x), net.body(x))


def test_options_override_mode(spy):
    opts = {"triton.cudagraphs": False}
    cfg = CompileConfig(enabled=True, mode="reduce-overhead", options=opts, dynamic=True)
    compile_module(_Net(), cfg)
    [(_, kwargs)] = spy
    assert kwargs == {
        "mode": None,
        "backend": "inductor",
        "fullgraph": False,
        "dynamic": True,
        "options": opts,
    }


def test_disabled_is_noop(spy):
    net = _Net()
    assert compile_module(net, CompileConfig()) is net
    assert spy == [] and "forward" not in net.__dict__ and compiled_config(net) is None
    compile_module(net, CompileConfig(enabled=True))  # a disabled call records nothing
    assert len(spy) == 1


def test_equal_config_again_is_noop(spy):
    net = _Net()
    compile_module(net, CompileConfig(enabled=True, backend="eager"))
    compiled = net.forward
    assert compile_module(net, CompileConfig(enabled=True, backend="eager")) is net
    assert len(spy) == 1 and net.forward is compiled


@pytest.mark.parametrize(
    "second",
    [
        CompileConfig(),
        CompileConfig(enabled=True, backend="aot_eager"),
        CompileConfig(enabled=True, backend="eager", dynamic=True),
    ],
)
def test_different_config_raises(spy, second):
    net = _Net()
    first = CompileConfig(enabled=True, backend="eager")
    compile_module(net, first)
    msg = "restart the worker to change compile settings"
    with pytest.raises(CompileConfigMismatch, match=msg) as err:
        compile_module(net, second)
    assert repr(first) in str(err.value) and repr(second) in str(err.value)
    assert isinstance(err.value, RuntimeError)
    assert len(spy) == 1 and compiled_config(net) == first


def test_other_attr_is_independent(spy):
    net = _Net()
    compile_module(net, CompileConfig(enabled=True))
    compile_module(net, CompileConfig(enabled=True, backend="eager"), attr="encode")
    assert len(spy) == 2 and spy[1][0].__func__ is _Net.encode
    assert compiled_config(net, "encode").backend == "eager"
    assert compiled_config(net).backend == "inductor"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_real_compile_matches_uncompiled(backend):
    torch._dynamo.reset()
    ref, net = _Net(), _Net()
    compile_module(net, CompileConfig(enabled=True, backend=backend, mode=None))
    x = torch.randn(3, 4)
    assert torch.equal(net(x), ref(x))
    assert "forward" in net.__dict__
    torch._dynamo.reset()
