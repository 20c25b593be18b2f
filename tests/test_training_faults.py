"""Training under SIGKILL: a run killed at a random point and rerun is the uninterrupted run,
step for step (step counter, the batches it draws, weights, Adam moments, LR schedule); and a
checkpoint save killed at any point never leaves ``latest_checkpoint()`` an incomplete
directory, and the next process resumes from it exactly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_training import overrides, run  # helpers only: no tests are imported

from training import loop
from training.engine import latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 300

pytestmark = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="needs wam_gym[metaworld]")


def env() -> dict[str, str]:
    drop = ("WAM_LATENT_CACHE", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    # The threads of this process: the in-process reference and the subprocesses add up alike.
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "MUJOCO_GL": "egl",
            "OMP_NUM_THREADS": str(torch.get_num_threads())}


# python -m training, logging every micro-step's (micro_step, global_step, sample indices) to
# $WAM_TEST_BATCH_LOG before it runs (flushed: a SIGKILL loses nothing logged). With
# $WAM_TEST_HOLD_AT set it stops before that micro-step and waits to be killed, so a kill the
# test times from outside always lands before the run could finish, however fast the machine.
LOGGING_TRAIN = r"""
import json, os, runpy, sys, time
from training import loop
log, real = open(os.environ["WAM_TEST_BATCH_LOG"], "a"), loop._micro_step
hold_at = int(os.environ.get("WAM_TEST_HOLD_AT", "-1"))
def logged(cfg, engine, model, batch, *rest):
    while rest[-1] == hold_at:
        time.sleep(1)
    log.write(json.dumps({"pid": os.getpid(), "micro_step": rest[-1], "global_step": engine.global_step,
                          "index": batch["index"].tolist()}) + "\n")
    log.flush()
    return real(cfg, engine, model, batch, *rest)
loop._micro_step = logged
sys.argv = ["training", *sys.argv[1:]]
runpy.run_module("training", run_name="__main__", alter_sys=True)
"""


def batch_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def checkpoint(out: Path, step: int) -> dict:
    """Everything a checkpoint holds, loaded for comparison."""
    directory = out / "checkpoints" / f"step-{step:08d}"
    state = json.loads((directory / "trainer_state.json").read_text())
    return {
        "trainer_state": state,
        "model": load_file(str(directory / "model.safetensors")),
        "optimizer": torch.load(directory / "optimizer.pt", weights_only=True),
        "scheduler": torch.load(directory / "scheduler.pt", weights_only=True),
    }


def assert_same_checkpoint(a: dict, b: dict) -> None:
    assert a["trainer_state"] == b["trainer_state"]  # step, micro-step, data position
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]  # lr, betas, ...
    moments = a["optimizer"]["state"]
    assert moments.keys() == b["optimizer"]["state"].keys() and moments
    for key, state in moments.items():
        other = b["optimizer"]["state"][key]
        assert torch.equal(state["step"], other["step"])
        assert torch.equal(state["exp_avg"], other["exp_avg"]) and torch.equal(state["exp_avg_sq"], other["exp_avg_sq"])
    assert a["scheduler"] == b["scheduler"]


def train_logging_batches(args: list[str]) -> list[dict]:
    """test_training.run, returning what LOGGING_TRAIN would log (without the pid)."""
    logged = []
    real = loop._micro_step

    def log(cfg, engine, model, batch, *rest):
        logged.append({"micro_step": rest[-1], "global_step": engine.global_step, "index": batch["index"].tolist()})
        return real(cfg, engine, model, batch, *rest)

    loop._micro_step = log
    try:
        run(args)
    finally:
        loop._micro_step = real
    return logged


@pytest.fixture(scope="module")
def uninterrupted(small_dataset, tmp_path_factory) -> tuple[Path, list[dict]]:
    """8 steps (3 batches per epoch, so 3 epochs), a checkpoint every 2, all kept; its batch log."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    logged = train_logging_batches(overrides(small_dataset, out, "max_steps=8", "save_every=2", "keep_checkpoints=10"))
    assert [e["micro_step"] for e in logged] == list(range(8))
    return out, logged


def test_sigkill_at_a_random_step_then_rerun_continues_exactly(small_dataset, uninterrupted, tmp_path):
    reference, reference_log = uninterrupted
    out, log_path = tmp_path / "run", tmp_path / "batches.jsonl"
    args = overrides(small_dataset, out, "max_steps=8", "save_every=2", "keep_checkpoints=10")
    rng = random.Random(4)
    # Killed once micro-step kill_at has begun, + a delay: at a random point of the next steps and
    # their checkpoint saves, but before micro-step kill_at + 2, where the child holds.
    kill_at, delay = rng.randint(3, 5), rng.uniform(0.0, 0.2)
    first = subprocess.Popen([sys.executable, "-c", LOGGING_TRAIN, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env={**env(), "WAM_TEST_BATCH_LOG": str(log_path),
                                                             "WAM_TEST_HOLD_AT": str(kill_at + 2)})
    try:
        deadline = time.monotonic() + WAIT_S
        while first.poll() is None and len(batch_log(log_path)) <= kill_at and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    killed = batch_log(log_path)
    assert killed == [{"pid": first.pid, **e} for e in reference_log[: len(killed)]]  # the same run, up to the kill
    resumed_from = latest_checkpoint(out / "checkpoints")
    step = int(resumed_from.name.removeprefix("step-"))
    assert step in (2, 4, 6) and not (out / "checkpoint").exists()
    assert_same_checkpoint(checkpoint(out, step), checkpoint(reference, step))

    resumed = train_logging_batches(args)  # the same command again (in this process: no second start-up)
    # It goes on from the checkpoint's step with the very batches the uninterrupted run drew there.
    assert resumed == reference_log[step:]
    for later in range(step, 9, 2):
        assert_same_checkpoint(checkpoint(out, later), checkpoint(reference, later))
    assert sorted(p.name for p in out.rglob(".*")) == []  # no staging or .old directory left behind
    assert (out / "checkpoint" / "wam_config.json").is_file()


# Trains a small torch model with the real TorchEngine and loop._checkpoint (save, then keep the
# newest 2) in forked children, each resuming from latest_checkpoint(); the parent SIGKILLs each
# at a random moment, or the child dies at a chosen point, and then loads what latest_checkpoint()
# returns. Prints one JSON line per death.
KILL_DURING_SAVES = r"""
import hashlib, json, os, random, signal, sys, time, types
from pathlib import Path
import torch
torch.set_num_threads(1)
from training import loop
from training.engine import EngineConfig, TorchEngine, checkpoint as checkpoint_module, latest_checkpoint
from wam_gym.utils import publish

out, seed, plan = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
root = out / "checkpoints"

def make_engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.Linear(512, 128))
    return TorchEngine(model, EngineConfig(lr=1e-3, warmup_steps=50, max_steps=10**6), "cpu")

def train_step(engine):
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(engine.global_step))
    engine.backward(engine(x).pow(2).mean())
    engine.step()

def fingerprint(engine):
    h = hashlib.sha256()
    for p in engine.module.parameters():
        h.update(p.detach().numpy().tobytes())
    for s in engine.optimizer.state.values():
        h.update(s["exp_avg"].numpy().tobytes() + s["exp_avg_sq"].numpy().tobytes() + s["step"].numpy().tobytes())
    h.update(json.dumps(engine.scheduler.state_dict(), sort_keys=True, default=str).encode())
    return h.hexdigest()

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def half_rmtree(path, ignore_errors=False):
    (Path(path) / "model.safetensors").unlink(missing_ok=True)  # what a kill in the middle of removing it leaves
    die()

def half_remove_dir(path):
    publish.shutil = types.SimpleNamespace(rmtree=half_rmtree)  # remove_dir renames, then dies deleting
    publish.remove_dir(path)

def child(mode, ready):
    engine, state = make_engine(), {"micro_step": 0}
    if (ckpt := latest_checkpoint(root)) is not None:
        state = engine.load(ckpt)
    if mode == "before_rename":
        checkpoint_module.publish = die  # the staging directory is complete, never renamed
    if mode == "mid_cleanup":
        loop.remove_dir = half_remove_dir  # dies while _checkpoint deletes the oldest
    os.write(ready, b"x")
    for _ in range(3 if mode == "finish" else 10**9):
        train_step(engine)
        state["micro_step"] += 1
        loop._checkpoint(engine, out, state, keep=2)

reference = make_engine()
fingerprints = [fingerprint(reference)]
def expected(step):
    while len(fingerprints) <= step:
        train_step(reference)
        fingerprints.append(fingerprint(reference))
    return fingerprints[step]

rng = random.Random(seed)
for mode in plan:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            child(mode, w)
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    if mode == "random":
        time.sleep(rng.uniform(0.0, 0.1))
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    latest = latest_checkpoint(root)
    entry = {"mode": mode, "killed": os.WIFSIGNALED(status), "latest": latest and latest.name,
             "dirs": {p.name: sorted(f.name for f in p.iterdir()) for p in root.iterdir()} if root.is_dir() else {}}
    if latest is not None:
        entry["files"] = sorted(p.name for p in latest.iterdir())
        engine = make_engine()
        state = engine.load(latest)  # raises on anything incomplete
        entry.update(step=engine.global_step, micro_step=state["micro_step"],
                     exact=fingerprint(engine) == expected(engine.global_step))
    print(json.dumps(entry), flush=True)
"""


def test_checkpoint_saves_killed_anywhere_leave_a_complete_latest_and_resume_exactly(tmp_path):
    plan = ["random"] * 12 + ["before_rename", "mid_cleanup"] + ["random"] * 12 + ["finish"]
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_SAVES, str(tmp_path), "5", ",".join(plan)], cwd=ROOT,
                          capture_output=True, text=True, env=env(), timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    deaths = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [d["mode"] for d in deaths] == plan
    assert all(d["killed"] for d in deaths if d["mode"] != "finish")

    for d in deaths:
        if d["latest"] is not None:  # complete, loadable and exactly the uninterrupted state at its step
            assert d["files"] == ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"]
            assert d["latest"] == f"step-{d['step']:08d}" and d["micro_step"] == d["step"]
            assert d["exact"], d
    # A random kill just before may also have left a half-deleted ``.deleting-step-*`` (cleaned by the
    # next save that completes), so look for the directories each mode leaves by name.
    before_rename = deaths[plan.index("before_rename")]
    staging = f".step-{before_rename.get('step', 0) + 1:08d}.staging"  # complete inside, never published
    assert [n for n in before_rename["dirs"] if n.endswith(".staging")] == [staging]
    assert before_rename["dirs"][staging] == ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"]
    mid_cleanup = deaths[plan.index("mid_cleanup")]
    doomed = [n for n in mid_cleanup["dirs"] if n.startswith(".deleting-step-")]
    # half deleted, but renamed out of the way first
    assert any("model.safetensors" not in mid_cleanup["dirs"][n] for n in doomed), mid_cleanup["dirs"]
    published = sorted(n for n in mid_cleanup["dirs"] if n.startswith("step-"))
    assert all(mid_cleanup["dirs"][n] == before_rename["dirs"][staging] for n in published)  # every step-* is whole
    assert mid_cleanup["latest"] == published[-1]

    finish = deaths[-1]
    assert not finish["killed"] and finish["exact"]
    assert finish["step"] == deaths[-2].get("step", 0) + 3
    assert sorted(finish["dirs"]) == [f"step-{finish['step'] - 1:08d}", f"step-{finish['step']:08d}"]  # keep=2; the
    # half-deleted and every staging directory are gone
