"""training/engine/: one interface over plain torch and DeepSpeed (CPU, gloo, no GPU needed).

DeepSpeed builds its shared-memory all-reduce op (``deepspeed_shm_comm``, 65-150 s of C++ on a
2-core box, cached afterwards under ~/.cache/torch_extensions) whenever its comm backend starts on
CPU. That kernel only serves ``inference_all_reduce``, which training never calls, so the fast tests
stub the build out (``no_shm_build``); the one test that runs DeepSpeed untouched, in a fresh
interpreter and with no launcher, is the ``slow`` zero2_offload one (it also builds ``cpu_adam``).
"""

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from training import engine as engine_mod
from training.engine import (
    ENGINE_OWNED_KEYS,
    EngineConfig,
    checkpoint_dir,
    deepspeed_config_dict,
    latest_checkpoint,
    lr_lambda,
    make_engine,
    resolve_deepspeed_config,
    resolve_mixed_precision,
    rng_state,
    set_rng_state,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / "scripts" / f"train_{name}.sh" for name in ("zero1", "zero2", "zero2_offload")]

# Shared with the torchrun worker script below, so both sides build the very same model.
MODEL_SRC = '''
import torch
from torch import nn


class TinyNet(nn.Module):
    """A frozen input layer, a buffer, and a trainable two-layer head (optional dropout)."""

    def __init__(self, seed=0, dropout=0.0):
        super().__init__()
        torch.manual_seed(seed)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.body = nn.Linear(6, 16)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(16, 2)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return self.head(self.drop(torch.tanh(self.body(self.frozen(x) * self.scale))))
'''
_ns: dict = {}
exec(MODEL_SRC, _ns)
TinyNet = _ns["TinyNet"]

_g = torch.Generator().manual_seed(1234)
X = torch.randn(32, 6, generator=_g)
Y = torch.randn(32, 2, generator=_g)


def micro_batch(i: int, size: int = 4):
    start = (i * size) % X.shape[0]
    return X[start:start + size], Y[start:start + size]


def train(engine, optimizer_steps: int, size: int = 4, start: int = 0) -> list[float]:
    """Run until ``optimizer_steps`` optimizer steps have happened; micro-batches cycle over X."""
    losses, i = [], start * engine.config.gradient_accumulation_steps
    while engine.global_step < optimizer_steps:
        x, y = micro_batch(i, size)
        with engine.autocast():
            out = engine(x.to(engine.dtype))
        loss = ((out.float() - y) ** 2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        i += 1
    return losses


def params(engine) -> list[torch.Tensor]:
    return [p.detach().float().clone() for p in engine.module.parameters()]


def torch_opt_tensors(engine) -> list[torch.Tensor]:
    out = []
    for p in engine._params:
        st = engine.optimizer.state[p]
        out += [st["exp_avg"], st["exp_avg_sq"], torch.as_tensor(st["step"])]
    return [t.detach().clone() for t in out]


def ds_opt_tensors(engine) -> list[torch.Tensor]:
    """fp32 master partitions and their Adam moments inside DeepSpeed's ZeRO-1/2 optimizer."""
    zero = engine.optimizer
    out = []
    for part in zero.single_partition_of_fp32_groups:
        st = zero.optimizer.state[part]
        out += [part, st["exp_avg"], st["exp_avg_sq"], torch.as_tensor(st["step"])]
    return [t.detach().clone() for t in out]


def assert_all_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max()


def assert_all_close(a, b, atol=1e-6):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


# ---------------------------------------------------------------------------------------------
# Plain torch back end


def test_plain_loss_decreases():
    engine = make_engine(TinyNet(), EngineConfig(lr=3e-2), "cpu")
    assert engine.backend == "torch" and engine.precision == "fp32"
    assert (engine.rank, engine.world_size, engine.is_main_process) == (0, 1, True)
    losses = []
    for _ in range(60):
        with engine.autocast():
            loss = ((engine(X) - Y) ** 2).mean()
        engine.backward(loss)
        assert engine.step()
        losses.append(loss.item())
    assert engine.global_step == 60
    assert losses[-1] < 0.8 * losses[0]
    assert engine.grad_norm is not None


@pytest.mark.parametrize("grad_clip", [0.0, 1e-3])
def test_grad_norm_is_the_norm_before_clipping_with_or_without_clipping(grad_clip):
    engine = make_engine(TinyNet(), EngineConfig(lr=1e-2, grad_clip=grad_clip), "cpu")
    assert engine.grad_norm is None  # no step yet
    engine.backward(((engine(X) - Y) ** 2).mean())
    grads = [p.grad.detach().clone() for p in engine.module.parameters() if p.requires_grad]
    norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])).item()
    assert norm > 1e-3  # so 1e-3 clips
    assert engine.step()
    assert engine.grad_norm == pytest.approx(norm, rel=1e-5)


def test_only_trainable_params_are_optimized():
    model = TinyNet()
    frozen = model.frozen.weight.detach().clone()
    engine = make_engine(model, EngineConfig(lr=1e-2), "cpu")
    ids = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert ids == {id(p) for p in model.parameters() if p.requires_grad}
    train(engine, 3)
    assert torch.equal(model.frozen.weight, frozen)


def test_accumulation_equals_one_big_batch():
    cfg = dict(lr=1e-2, weight_decay=0.1, grad_clip=0.5, warmup_steps=1, lr_schedule="cosine", max_steps=5)
    acc = make_engine(TinyNet(), EngineConfig(gradient_accumulation_steps=4, batch_size=4, **cfg), "cpu")
    big = make_engine(TinyNet(), EngineConfig(gradient_accumulation_steps=1, batch_size=16, **cfg), "cpu")
    flags = []
    for step in range(3):
        for j in range(4):
            x, y = micro_batch(4 * step + j)
            acc.backward(((acc(x) - y) ** 2).mean())
            flags.append(acc.step())
        xb, yb = X[16 * step % 32:][:16], Y[16 * step % 32:][:16]
        big.backward(((big(xb) - yb) ** 2).mean())
        assert big.step()
    assert flags == [False, False, False, True] * 3
    assert acc.global_step == big.global_step == 3
    assert acc.lr == big.lr
    assert_all_close(params(acc), params(big))
    assert_all_close(torch_opt_tensors(acc), torch_opt_tensors(big))


def test_lr_schedule_warmup_and_cosine():
    cfg = EngineConfig(lr=1.0, warmup_steps=2, lr_schedule="cosine", max_steps=6)
    factor = lr_lambda(cfg)
    assert [factor(s) for s in range(2)] == [0.5, 1.0]
    assert factor(4) == pytest.approx(0.5) and factor(6) == pytest.approx(0.0) and factor(99) == pytest.approx(0.0)
    assert lr_lambda(EngineConfig(lr_schedule="constant", warmup_steps=0))(500) == 1.0
    engine = make_engine(TinyNet(), cfg, "cpu")
    seen = [engine.lr]
    for _ in range(6):
        engine.backward(engine(X).pow(2).mean())
        engine.step()
        seen.append(engine.lr)
    assert seen == pytest.approx([factor(s) for s in range(7)])


def test_resume_is_exact(tmp_path):
    """save -> load -> continue == uninterrupted, bitwise (fp32), dropout RNG included."""
    cfg = EngineConfig(lr=1e-2, weight_decay=0.1, warmup_steps=2, lr_schedule="cosine", max_steps=6,
                       gradient_accumulation_steps=2)
    torch.manual_seed(7)
    full = make_engine(TinyNet(dropout=0.2), cfg, "cpu")
    train(full, 6)

    torch.manual_seed(7)
    first = make_engine(TinyNet(dropout=0.2), cfg, "cpu")
    train(first, 3)
    saved = first.save(checkpoint_dir(tmp_path, first.global_step), {"rng": rng_state(), "position": 6})
    assert saved == tmp_path / "step-00000003" and latest_checkpoint(tmp_path) == saved
    assert {p.name for p in saved.iterdir()} == {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"}
    meta = json.loads((saved / "trainer_state.json").read_text())
    assert meta["global_step"] == 3 and meta["backend"] == "torch"
    del first
    torch.manual_seed(999)  # a different init and RNG: load must overwrite both

    resumed = make_engine(TinyNet(seed=5, dropout=0.2), cfg, "cpu")
    state = resumed.load(latest_checkpoint(tmp_path))
    set_rng_state(state["rng"])
    assert state["position"] == 6 and resumed.global_step == 3
    train(resumed, 6, start=3)

    assert resumed.global_step == full.global_step == 6
    assert resumed.lr == full.lr
    assert resumed.scheduler.state_dict() == full.scheduler.state_dict()
    assert_all_equal(params(resumed), params(full))
    assert_all_equal(torch_opt_tensors(resumed), torch_opt_tensors(full))
    assert_all_equal(list(resumed.module.buffers()), list(full.module.buffers()))


def test_load_uses_weights_only(tmp_path, monkeypatch):
    engine = make_engine(TinyNet(), EngineConfig(lr=1e-2), "cpu")
    train(engine, 2)
    path = engine.save(checkpoint_dir(tmp_path, 2), {})
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    make_engine(TinyNet(seed=3), EngineConfig(lr=1e-2), "cpu").load(path)
    assert calls == [True, True]  # optimizer.pt and scheduler.pt, nothing unpickled


def test_staging_dir_is_never_latest(tmp_path, monkeypatch):
    engine = make_engine(TinyNet(), EngineConfig(lr=1e-2), "cpu")
    assert latest_checkpoint(tmp_path / "missing") is None and latest_checkpoint(tmp_path) is None
    train(engine, 2)
    good = engine.save(checkpoint_dir(tmp_path, 2), {"n": 2})

    # Decoys: a staging dir that even holds trainer_state.json, an incomplete step dir, odd names.
    staging = tmp_path / ".step-00000009.staging"
    staging.mkdir()
    (staging / "trainer_state.json").write_text("{}")
    (tmp_path / "step-00000008").mkdir()
    (tmp_path / "step-123").mkdir()
    (tmp_path / "step-00000007").write_text("a file")
    assert latest_checkpoint(tmp_path) == good

    # A save that dies half-way leaves only its staging dir behind, which is ignored.
    train(engine, 4)
    real_save = torch.save

    def dies_on_scheduler(obj, f, *args, **kwargs):
        if str(f).endswith("scheduler.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dies_on_scheduler)
    with pytest.raises(OSError, match="disk full"):
        engine.save(checkpoint_dir(tmp_path, 4), {"n": 4})
    assert (tmp_path / ".step-00000004.staging" / "optimizer.pt").is_file()
    assert not (tmp_path / "step-00000004").exists()
    assert latest_checkpoint(tmp_path) == good

    monkeypatch.setattr(torch, "save", real_save)
    done = engine.save(checkpoint_dir(tmp_path, 4), {"n": 4})
    assert latest_checkpoint(tmp_path) == done and not (tmp_path / ".step-00000004.staging").exists()
    again = engine.save(checkpoint_dir(tmp_path, 4), {"n": 5})  # re-saving a step replaces it whole
    assert json.loads((again / "trainer_state.json").read_text())["client_state"] == {"n": 5}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".step-00000004")) == []


def test_save_mid_accumulation_is_refused(tmp_path):
    engine = make_engine(TinyNet(), EngineConfig(gradient_accumulation_steps=2), "cpu")
    engine.backward(engine(X).pow(2).mean())
    assert not engine.step()
    with pytest.raises(RuntimeError, match="gradient accumulation"):
        engine.save(checkpoint_dir(tmp_path, 0), {})
    assert latest_checkpoint(tmp_path) is None


def test_client_state_round_trip(tmp_path):
    engine = make_engine(TinyNet(), EngineConfig(), "cpu")
    state = {"tensor": torch.arange(6, dtype=torch.int64).reshape(2, 3), "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
             "array": np.arange(4, dtype=np.uint32), "tuple": (1, "a"), "nested": {"x": [1.0, None, True]},
             "np_scalar": np.float32(2.5), "rng": rng_state()}
    loaded = engine.load(engine.save(checkpoint_dir(tmp_path, 0), state))
    assert torch.equal(loaded["tensor"], state["tensor"]) and loaded["bf16"].dtype == torch.bfloat16
    assert torch.equal(loaded["bf16"], state["bf16"])
    assert loaded["array"].dtype == np.uint32 and (loaded["array"] == state["array"]).all()
    assert loaded["tuple"] == [1, "a"] and loaded["nested"] == {"x": [1.0, None, True]} and loaded["np_scalar"] == 2.5

    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(3), expected[0]) and (np.random.rand(3) == expected[1]).all()
    assert random.random() == expected[2]

    with pytest.raises(TypeError, match="client_state"):
        engine.save(checkpoint_dir(tmp_path, 0), {"bad": object()})


def test_mixed_precision_resolution_and_autocast(monkeypatch):
    assert resolve_mixed_precision("auto", "cpu") == "fp32"
    assert resolve_mixed_precision("bf16", "cpu") == "bf16"
    assert resolve_mixed_precision("fp32", "cpu") == "fp32"
    with pytest.raises(ValueError):
        EngineConfig(mixed_precision="fp16")

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    with pytest.raises(ValueError, match="no bf16 support"):
        resolve_mixed_precision("bf16", "cuda")
    assert resolve_mixed_precision("auto", "cuda") == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_mixed_precision("auto", "cuda") == "bf16"

    bf16 = make_engine(TinyNet(), EngineConfig(mixed_precision="bf16"), "cpu")
    assert bf16.precision == "bf16" and bf16.dtype == torch.float32  # fp32 weights, bf16 compute
    with bf16.autocast():
        assert bf16(X).dtype == torch.bfloat16
    fp32 = make_engine(TinyNet(), EngineConfig(mixed_precision="fp32"), "cpu")
    with fp32.autocast():
        assert fp32(X).dtype == torch.float32


def test_torch_backend_refuses_multiple_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="single process"):
        make_engine(TinyNet(), EngineConfig(), "cpu")


# ---------------------------------------------------------------------------------------------
# DeepSpeed configs and scripts


@pytest.mark.parametrize("name,stage,offload", [("zero1", 1, False), ("zero2", 2, False), ("zero2_offload", 2, True)])
def test_deepspeed_json_validates(name, stage, offload):
    from deepspeed.runtime.config import DeepSpeedConfig

    path = resolve_deepspeed_config(name)
    raw = json.loads(path.read_text())
    assert not set(raw) & set(ENGINE_OWNED_KEYS), "the JSON holds only ZeRO parts; EngineConfig owns the rest"
    merged = deepspeed_config_dict(EngineConfig(deepspeed=name, batch_size=3, gradient_accumulation_steps=2,
                                                grad_clip=0.7, mixed_precision="bf16", lr=3e-4), "cpu")
    ds = DeepSpeedConfig(merged)
    assert ds.zero_optimization_stage == stage
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps, ds.gradient_clipping) == (3, 2, 0.7)
    assert ds.bfloat16_config.enabled
    if offload:
        assert ds.zero_config.offload_optimizer.device == "cpu" and ds.zero_config.offload_optimizer.pin_memory
        assert ds.optimizer_name == "adamw" and ds.optimizer_params["lr"] == 3e-4  # -> DeepSpeedCPUAdam
    else:
        assert ds.zero_config.offload_optimizer is None and ds.optimizer_name is None  # torch AdamW passed in


def test_deepspeed_config_rejects_scheduler_block(tmp_path):
    bad = tmp_path / "z.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 1}, "scheduler": {"type": "WarmupLR"}}))
    with pytest.raises(ValueError, match="scheduler"):
        deepspeed_config_dict(EngineConfig(deepspeed=str(bad)))
    with pytest.raises(FileNotFoundError, match="zero1"):
        resolve_deepspeed_config("zero9")


def test_a_build_lock_a_killed_compile_left_is_named_with_the_fix(tmp_path, monkeypatch, caplog):
    """torch waits forever on the lock of a DeepSpeed op build that was SIGKILLed; a fresh lock
    (another process compiling now) is not named."""
    from training.engine.deepspeed_engine import STALE_BUILD_LOCK_S, warn_stale_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, fresh = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "cpu_adam" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir()
        lock.touch()
    now = fresh.stat().st_mtime + 1
    os.utime(stale, (now - STALE_BUILD_LOCK_S - 60, now - STALE_BUILD_LOCK_S - 60))

    assert warn_stale_build_locks(now) == [stale]
    [record] = caplog.records
    assert str(stale) in record.getMessage() and "16 min old" in record.getMessage()
    assert "If no other process is compiling, delete it" in record.getMessage()
    stale.unlink()
    assert warn_stale_build_locks(now) == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_syntax_help_and_command(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "set -euo pipefail" in script.read_text()
    name = script.stem.removeprefix("train_")
    out = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "NPROC_PER_NODE" in out.stdout and f"deepspeed={name}" in out.stdout
    env = {**os.environ, "TORCHRUN": "echo", "NPROC_PER_NODE": "2", "MASTER_PORT": "29123"}
    out = subprocess.run(["bash", str(script), "task=x", "mixed_precision=bf16"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--nproc_per_node", "2", "--master_port", "29123", "-m", "training",
                                  f"deepspeed={name}", "task=x", "mixed_precision=bf16"]
    env.pop("MASTER_PORT")
    env["NPROC_PER_NODE"] = "two"
    assert subprocess.run(["bash", str(script)], capture_output=True, env=env).returncode != 0


# ---------------------------------------------------------------------------------------------
# DeepSpeed engine, single process (no launcher), in this interpreter


def ds_config(name: str, **overrides) -> EngineConfig:
    base = dict(deepspeed=name, lr=1e-2, weight_decay=0.1, warmup_steps=2, lr_schedule="cosine", max_steps=6,
                gradient_accumulation_steps=2, batch_size=4, mixed_precision="fp32")
    return EngineConfig(**{**base, **overrides})


def offload_torch_adam_json(tmp_path) -> str:
    """zero2_offload.json with DeepSpeed's torch_adam switch: offload without compiling cpu_adam."""
    cfg = json.loads(resolve_deepspeed_config("zero2_offload").read_text())
    cfg["optimizer"]["params"]["torch_adam"] = True
    path = tmp_path / "zero2_offload_torch_adam.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero2_offload_torch_adam"])
def test_deepspeed_steps_match_torch(name, tmp_path, no_shm_build):
    """Real DeepSpeed engine steps (gloo, CPU accelerator) == the plain torch engine."""
    if name == "zero2_offload_torch_adam":
        name = offload_torch_adam_json(tmp_path)
    ds = make_engine(TinyNet(), ds_config(name), "cpu")
    assert ds.backend == "deepspeed" and (ds.rank, ds.world_size, ds.is_main_process) == (0, 1, True)
    assert type(ds.optimizer).__name__ == "DeepSpeedZeroOptimizer"
    assert ds.optimizer.cpu_offload == ("offload" in name)
    assert type(ds.optimizer.optimizer) is torch.optim.AdamW
    ref = make_engine(TinyNet(), ds_config(None), "cpu")
    ds_losses, ref_losses = train(ds, 6), train(ref, 6)
    assert ds.global_step == ref.global_step == 6 and ds.lr == pytest.approx(ref.lr)
    assert ds_losses == pytest.approx(ref_losses, abs=1e-5)
    assert ds_losses[-1] < ds_losses[0]
    assert_all_close(params(ds), params(ref), atol=1e-5)
    assert ds.grad_norm == pytest.approx(ref.grad_norm, rel=1e-4)


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero2_offload_torch_adam"])
def test_deepspeed_resume_is_exact(name, tmp_path, no_shm_build):
    if name == "zero2_offload_torch_adam":
        name = offload_torch_adam_json(tmp_path)
    cfg = ds_config(name)
    full = make_engine(TinyNet(), cfg, "cpu")
    train(full, 6)

    first = make_engine(TinyNet(), cfg, "cpu")
    train(first, 3)
    saved = first.save(checkpoint_dir(tmp_path / "ckpt", 3), {"position": 6, "t": torch.arange(3)})
    assert latest_checkpoint(tmp_path / "ckpt") == saved
    assert (saved / "ds").is_dir() and (saved / "client_state" / "rank-00000.json").is_file()
    assert not any(p.name.startswith(".") for p in (tmp_path / "ckpt").iterdir())

    resumed = make_engine(TinyNet(seed=5), cfg, "cpu")
    state = resumed.load(saved)
    assert state["position"] == 6 and torch.equal(state["t"], torch.arange(3))
    assert resumed.global_step == 3 and resumed.lr == first.lr
    train(resumed, 6, start=3)
    assert resumed.global_step == 6 and resumed.lr == full.lr
    assert_all_equal(params(resumed), params(full))
    assert_all_equal(ds_opt_tensors(resumed), ds_opt_tensors(full))


def test_deepspeed_bf16_step(tmp_path, no_shm_build):
    """DeepSpeed bf16: the module itself is cast to bf16, autocast() is a no-op, fp32 masters step."""
    engine = make_engine(TinyNet(), ds_config("zero2", mixed_precision="bf16"), "cpu")
    assert engine.precision == "bf16" and engine.dtype == torch.bfloat16
    assert engine.ds_config["bf16"] == {"enabled": True}
    before = params(engine)
    with engine.autocast():
        assert not torch.is_autocast_enabled("cpu")
    losses = train(engine, 3)
    assert all(np.isfinite(losses)) and engine.global_step == 3
    assert engine.optimizer.single_partition_of_fp32_groups[0].dtype == torch.float32
    assert any(not torch.equal(a, b) for a, b in zip(before, params(engine)))
    # bf16 ZeRO writes its own optimizer file (bf16_zero_pp_rank_*): it loads weights-only too.
    saved = engine.save(checkpoint_dir(tmp_path, 3), {})
    assert any(p.name.startswith("bf16_zero_pp_rank_") for p in (saved / "ds").iterdir())
    resumed = make_engine(TinyNet(seed=5), ds_config("zero2", mixed_precision="bf16"), "cpu")
    resumed.load(saved)
    assert resumed.global_step == 3 and all(torch.equal(a, b) for a, b in zip(params(resumed), params(engine)))


def test_backends_refuse_each_others_checkpoints(tmp_path, no_shm_build):
    plain = make_engine(TinyNet(), EngineConfig(), "cpu")
    path = plain.save(checkpoint_dir(tmp_path, 0), {})
    ds = make_engine(TinyNet(), ds_config("zero1"), "cpu")
    with pytest.raises(ValueError, match="back end"):
        ds.load(path)


# ---------------------------------------------------------------------------------------------
# DeepSpeed in fresh processes: the real zero2_offload (CPU Adam) and two ranks under torchrun

OFFLOAD_SCRIPT = MODEL_SRC + '''
import json, sys, tempfile, time
t0 = time.time()
sys.path.insert(0, sys.argv[1])
from training.engine import EngineConfig, checkpoint_dir, make_engine

X = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
cfg = EngineConfig(deepspeed="zero2_offload", lr=1e-2, gradient_accumulation_steps=2, batch_size=4,
                   mixed_precision="fp32")


def run(engine, until):
    while engine.global_step < until:
        i = engine.global_step * 2 + (engine.ds_engine.micro_steps % 2)
        x = X[(i * 4) % 16:][:4]
        engine.backward(engine(x).pow(2).mean())
        engine.step()


full = make_engine(TinyNet(), cfg, "cpu")
t_init = time.time() - t0
run(full, 4)
first = make_engine(TinyNet(), cfg, "cpu")
run(first, 2)
root = tempfile.mkdtemp()
first.save(checkpoint_dir(root, 2), {"k": 1})
resumed = make_engine(TinyNet(seed=3), cfg, "cpu")
state = resumed.load(checkpoint_dir(root, 2))
run(resumed, 4)
diff = max((a - b).abs().max().item() for a, b in zip(full.module.parameters(), resumed.module.parameters()))
print("RESULT " + json.dumps({"optimizer": type(full.optimizer.optimizer).__name__, "offload": full.optimizer.cpu_offload,
                              "init_s": t_init, "total_s": time.time() - t0, "max_diff": diff, "state": state,
                              "steps": resumed.global_step}))
'''


@pytest.mark.slow
def test_zero2_offload_cpu_adam_real_config(tmp_path):
    """The shipped zero2_offload.json, unpatched, no launcher: DeepSpeedCPUAdam on the offloaded
    fp32 partitions. The first run compiles the shm comm op and cpu_adam (about 1-3 min on 2 cores)."""
    script = tmp_path / "offload.py"
    script.write_text(OFFLOAD_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True, env=env,
                          timeout=580, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    print(f"zero2_offload (cpu_adam): {time.time() - t0:.1f}s wall, {result}")
    assert result["optimizer"] == "DeepSpeedCPUAdam" and result["offload"] is True
    assert result["steps"] == 4 and result["state"] == {"k": 1}
    # CPU Adam keeps its bias-correction powers in C++ and rebuilds them on load: equal to float
    # rounding, not bitwise (the torch-AdamW offload variant above is bitwise).
    assert result["max_diff"] < 1e-6


TWO_RANKS_SCRIPT = MODEL_SRC + '''
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import importlib

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # see tests/test_engine.py docstring
from training.engine import EngineConfig, checkpoint_dir, make_engine

out = Path(sys.argv[2])
engine = make_engine(TinyNet(), EngineConfig(deepspeed="zero2", lr=1e-2, batch_size=4, mixed_precision="fp32"), "cpu")
g = torch.Generator().manual_seed(100 + engine.rank)  # each rank its own data
for _ in range(2):
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
    engine.backward(((engine(x) - y) ** 2).mean())
    assert engine.step()
flat = torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])
torch.save(flat, out / f"rank{engine.rank}.pt")
engine.save(checkpoint_dir(out / "ckpt", engine.global_step), {"rank": engine.rank})
print("RESULT " + json.dumps({"rank": engine.rank, "world": engine.world_size, "step": engine.global_step}))
'''


def test_torchrun_two_ranks_zero2(tmp_path):
    torchrun = ROOT / ".venv" / "bin" / "torchrun"
    if not torchrun.exists():
        torchrun = shutil.which("torchrun")
        if torchrun is None:
            pytest.skip("no torchrun (neither .venv/bin/torchrun nor on PATH)")
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", str(port), str(script), str(ROOT),
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Both ranks print to one pipe, so two RESULT records can share a line: decode each in turn.
    decoder = json.JSONDecoder()
    results = sorted(decoder.raw_decode(chunk)[0]["rank"] for chunk in proc.stdout.split("RESULT ")[1:])
    assert results == [0, 1]

    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert torch.equal(rank0, rank1), "ranks disagree on parameters"
    # Data parallel == one process on both ranks' batches concatenated (gradients averaged).
    ref = make_engine(TinyNet(), EngineConfig(lr=1e-2, batch_size=8), "cpu")
    gens = [torch.Generator().manual_seed(100 + r) for r in (0, 1)]
    for _ in range(2):
        pairs = [(torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)) for g in gens]
        x, y = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
        ref.backward(((ref(x) - y) ** 2).mean())
        ref.step()
    torch.testing.assert_close(rank0, torch.cat([p.detach().reshape(-1) for p in ref.module.parameters()]), atol=1e-6, rtol=0)

    ckpt = latest_checkpoint(tmp_path / "ckpt")
    assert ckpt is not None and ckpt.name == "step-00000002"
    for r in (0, 1):
        assert json.loads((ckpt / "client_state" / f"rank-{r:05d}.json").read_text()) == {"rank": r}
    assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2


def test_engine_module_exports():
    assert set(engine_mod.__all__) <= set(dir(engine_mod))
