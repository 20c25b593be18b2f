"""Security claims, a test for each.

(a) Checkpoints load only through safetensors or ``torch.load(weights_only=True)``: a static scan
    of the repo's own source for unpickling calls, and pickle payloads (a ``__reduce__`` that would
    create a marker file) planted in checkpoints, which fail to load without running.
    DeepSpeed's own loader would call ``torch.load(weights_only=False)`` on ``<ckpt>/ds/*.pt``;
    ``training.engine.checkpoint`` swaps it for ``weights_only=True`` with an allowlist of the
    plain DeepSpeed classes those files hold, and a planted payload there is refused too.
(b) No pickle crosses a network socket: the local broker's queues are pipes; its process tree
    opens no AF_INET/AF_INET6 socket at all.
(c) Every listener binds loopback or a Unix socket: a static scan of bind/listen/servers/ray.init/
    torch.distributed calls, and the listeners Ray and torch.distributed really open (those tests
    xfail, naming the ports, where the library binds all interfaces despite a loopback setting).
"""

from __future__ import annotations

import ast
import io
import ipaddress
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("wam_gym", "agents", "envs", "training", "scripts", "bench")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def source_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


# ----------------------------------------------------------------- an AST view of calls
def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it was imported as (``np`` -> ``numpy``, ``loads`` -> ``pickle.loads``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(func: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return "." + ".".join(reversed(parts)) if parts else None  # a method of an expression: ".load"
    return ".".join([aliases.get(func.id, func.id), *reversed(parts)])


def calls(source: str) -> list[tuple[str, ast.Call]]:
    """Every call in ``source`` with its resolved dotted name."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = [(name, node) for node in ast.walk(tree) if isinstance(node, ast.Call)
             if (name := _dotted(node.func, aliases)) is not None]
    return sorted(found, key=lambda pair: (pair[1].lineno, pair[1].col_offset))


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_const(node: ast.AST | None, *values) -> bool:
    return isinstance(node, ast.Constant) and node.value in values


# ----------------------------------------------------------------- (a) unpickling calls
UNPICKLERS = {f"{m}.{f}" for m in ("pickle", "_pickle", "cPickle", "dill", "cloudpickle", "ray.cloudpickle", "marshal")
              for f in ("load", "loads", "Unpickler")} | {"shelve.open", "joblib.load", "pandas.read_pickle",
                                                          "yaml.unsafe_load", "yaml.full_load", "yaml.full_load_all"}
SAFE_YAML_LOADERS = ("SafeLoader", "CSafeLoader", "BaseLoader")


def unsafe_loads(source: str) -> list[str]:
    """Calls that can unpickle (or run) what they read, as ``line: reason``."""
    found = []
    for name, call in calls(source):
        where = f"line {call.lineno}: {name}"
        if name in UNPICKLERS:
            found.append(f"{where} unpickles")
        elif name == "torch.load" and not _is_const(_kw(call, "weights_only"), True):
            found.append(f"{where} without weights_only=True")
        elif name == "numpy.load" and _kw(call, "allow_pickle") is not None and not _is_const(_kw(call, "allow_pickle"), False):
            found.append(f"{where} with allow_pickle")
        elif name in ("yaml.load", "yaml.load_all"):
            loader = _kw(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
            if not (isinstance(loader, ast.Attribute) and loader.attr in SAFE_YAML_LOADERS):
                found.append(f"{where} without a safe Loader")
        elif name in ("eval", "exec", "builtins.eval", "builtins.exec"):
            found.append(f"{where} runs a string as code")
    return found


def test_the_unpickling_scan_catches_every_form():
    imports = "import pickle, dill, yaml, torch, numpy as np, joblib\nfrom pickle import loads as l\n" \
              "from ray import cloudpickle\n"
    bad = ["pickle.load(f)", "l(b)", "dill.loads(b)", "cloudpickle.loads(b)", "joblib.load(p)", "pickle.Unpickler(f).load()",
           "torch.load(p)", "torch.load(p, weights_only=False)", "np.load(p, allow_pickle=True)", "yaml.load(s)",
           "yaml.load(s, Loader=yaml.FullLoader)", "yaml.unsafe_load(s)", "eval(text)", "exec(open(p).read())"]
    good = ["torch.load(p, map_location='cpu', weights_only=True)", "np.load(p)", "np.load(p, allow_pickle=False)",
            "yaml.safe_load(s)", "yaml.load(s, Loader=yaml.SafeLoader)", "json.loads(s)", "model.eval()", "engine.load(d)"]
    assert [len(unsafe_loads(imports + line)) for line in bad] == [1] * len(bad)
    assert [unsafe_loads(imports + line) for line in good] == [[]] * len(good)


# The broker's own messages between its own processes (anonymous pipes and queues, the bytes that
# multiprocess would unpickle anyway): one pickle.loads, in wam_gym.broker.model_worker.decode.
INTERNAL_IPC = "wam_gym/broker/model_worker.py"


def test_the_source_never_unpickles_what_it_reads():
    found = {str(p.relative_to(ROOT)): hits for p in source_files() if (hits := unsafe_loads(p.read_text()))}
    ipc = found.pop(INTERNAL_IPC, [])
    assert found == {}, f"unpickling calls (load safetensors, or torch.load(..., weights_only=True)): {found}"
    source = (ROOT / INTERNAL_IPC).read_text().splitlines()
    assert len(ipc) == 1 and "return pickle.loads(data)" in source[int(ipc[0].split()[1].rstrip(":")) - 1], ipc
    torch_loads = sorted(str(p.relative_to(ROOT)) for p in source_files() for n, _ in calls(p.read_text())
                         if n == "torch.load")
    # optimizer.pt and scheduler.pt, and DeepSpeed's ds/*.pt; FastWAM's released .pt and Wan's .pth (one reader,
    # wan_original.read_torch_file): all weights_only=True (above)
    assert torch_loads == ["agents/wam/fastwam/wan_original.py", *["training/engine/checkpoint.py"] * 2]


# ----------------------------------------------------------------- (a) pickle payloads in checkpoints
class WriteMarker:
    """Unpickling this creates ``path``: the file shows whether a payload ran."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def payload(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(WriteMarker(marker), buffer)  # a real torch checkpoint file, as a .bin/.pt would be
    return buffer.getvalue()


def test_the_payload_runs_when_unpickled(tmp_path):
    marker = tmp_path / "marker"
    torch.load(io.BytesIO(payload(marker)), weights_only=False)
    assert marker.exists()  # so a missing marker below means the payload never ran


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A plain and a LoRA tiny checkpoint, as save_pretrained writes them."""
    from agents.wam import build_model, preset, save_pretrained
    from agents.wam.lora import LoraSettings, add_lora

    root = tmp_path_factory.mktemp("ckpts")
    save_pretrained(build_model(preset("tiny")), root / "plain")
    model = build_model(preset("tiny"))
    add_lora(model, LoraSettings(rank=2))
    save_pretrained(model, root / "lora")
    return root


def _replace(path: Path, new_name: str, data: bytes) -> None:
    path.unlink()
    (path.parent / new_name).write_bytes(data)


def _index_to(path: Path, shard: str, data: bytes) -> None:
    """Swap a safetensors file for a safetensors index whose only shard is ``shard``."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        keys = list(f.keys())
    path.unlink()
    (path.parent / f"{path.name}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(keys, shard)}))
    (path.parent / shard).write_bytes(data)


TRANSFORMER, TEXT_ENCODER = "transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"
# (checkpoint, file, how it is tampered with, the error load_pretrained raises or None: it loads)
PLANTS = {
    "weights-overwritten": ("plain", TRANSFORMER, lambda p, d: p.write_bytes(d), ("MissingCheckpointError", "cannot be loaded")),
    "weights-as-bin": ("plain", TRANSFORMER, lambda p, d: _replace(p, "diffusion_pytorch_model.bin", d),
                       ("MissingCheckpointError", r"transformer/ lacks \*\.safetensors")),
    "text-encoder-as-bin": ("plain", TEXT_ENCODER, lambda p, d: _replace(p, "pytorch_model.bin", d),
                            ("MissingCheckpointError", r"text_encoder/ lacks \*\.safetensors")),
    "bin-beside-safetensors": ("plain", "vae/diffusion_pytorch_model.safetensors",
                               lambda p, d: (p.parent / "diffusion_pytorch_model.bin").write_bytes(d), None),
    # A safetensors index may name a .bin shard, which diffusers/transformers would torch.load
    # (with weights_only=True); load_pretrained refuses the index before any shard is read.
    "index-to-bin-shard": ("plain", TRANSFORMER, lambda p, d: _index_to(p, "diffusion_pytorch_model-00001-of-00001.bin", d),
                           ("MissingCheckpointError", "names non-safetensors shards")),
    "text-encoder-index-to-bin": ("plain", TEXT_ENCODER, lambda p, d: _index_to(p, "pytorch_model-00001-of-00001.bin", d),
                                  ("MissingCheckpointError", "names non-safetensors shards")),
    "lora-overwritten": ("lora", "lora/video/adapter_model.safetensors", lambda p, d: p.write_bytes(d),
                         ("ValueError", r"LoRA weights \S+ are truncated or corrupt")),
    "lora-as-bin": ("lora", "lora/video/adapter_model.safetensors", lambda p, d: _replace(p, "adapter_model.bin", d),
                    ("FileNotFoundError", r"lacks video/adapter_model\.safetensors")),
}


@pytest.mark.parametrize("plant", PLANTS)
def test_a_pickle_payload_in_a_checkpoint_never_runs(plant, checkpoints, tmp_path):
    from agents.wam import load_pretrained

    kind, relative, tamper, error = PLANTS[plant]
    ckpt, marker = tmp_path / "ckpt", tmp_path / "marker"
    shutil.copytree(checkpoints / kind, ckpt)
    tamper(ckpt / relative, payload(marker))
    if error is None:
        load_pretrained(ckpt)  # the safetensors file is what loads; the .bin beside it is never read
    else:
        with pytest.raises(Exception, match=error[1]) as caught:
            load_pretrained(ckpt)
        assert type(caught.value).__name__ == error[0]
    assert not marker.exists()


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt"])
def test_a_pickle_payload_in_training_state_is_refused(name, tmp_path):
    from training.engine import EngineConfig, TorchEngine

    def engine():
        return TorchEngine(torch.nn.Linear(2, 2), EngineConfig(), "cpu")

    trained = engine()
    trained.module(torch.ones(1, 2)).sum().backward()
    trained.step()
    saved = trained.save(tmp_path / "step-00000001")
    marker = tmp_path / "marker"
    (saved / name).write_bytes(payload(marker))
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        engine().load(saved)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"])
def test_a_pickle_payload_in_deepspeed_state_is_refused(name, tmp_path, no_shm_build):
    from training.engine import EngineConfig, UnsafeCheckpointError, make_engine

    def engine():
        return make_engine(torch.nn.Linear(2, 2), EngineConfig(deepspeed="zero2", batch_size=1), "cpu")

    trained = engine()
    trained.backward(trained(torch.ones(1, 2)).sum())
    trained.step()
    saved = trained.save(tmp_path / "step-00000001")
    fresh = engine()
    fresh.load(saved)  # what DeepSpeed wrote loads through the allowlist
    marker = tmp_path / "marker"
    (saved / "ds" / name).write_bytes(payload(marker))
    with pytest.raises(UnsafeCheckpointError, match=r"holds io\.open, which is not unpickled here"):
        engine().load(saved)
    assert not marker.exists()


# ----------------------------------------------------------------- sockets of a process tree
def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def tree_pids(root: int | None = None) -> list[int]:
    import psutil

    me = psutil.Process(root)
    return [me.pid, *(p.pid for p in me.children(recursive=True))]


def inet_sockets(pid: int) -> list[tuple]:
    import psutil

    try:
        return [(c.laddr, c.raddr, c.status) for c in psutil.Process(pid).net_connections(kind="inet")]
    except psutil.NoSuchProcess:
        return []


def fd_targets(pid: int) -> list[str]:
    targets = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    except OSError:  # the process (or that fd) is gone
        pass
    return targets


# ----------------------------------------------------------------- (b) the local broker
def test_the_local_broker_opens_no_network_socket():
    """Requests, batches and replies go through pipes in the process tree; no AF_INET(6) socket anywhere."""
    import psutil

    from bench.soak import EchoFactory
    from wam_gym.broker import BrokerConfig, InferenceBroker

    before_pids, before_inet = set(tree_pids()), set(inet_sockets(os.getpid()))
    seen: dict[int, list] = {}
    pipes: dict[int, int] = {}
    with InferenceBroker(EchoFactory(0.002), BrokerConfig(workers_per_gpu=2, inference_batch_size=4)) as broker:
        clients = [broker.client(i) for i in range(4)]
        answers: dict[int, list[float]] = {}

        def ask(i):
            answers[i] = [float(clients[i].predict(
                {"state": np.full((1, 3), i * 100 + k, np.float32), "instruction": ("x",)}).actions[0, -1, 0])
                for k in range(20)]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        while True:  # look while requests are in flight, and at least once whatever the timing
            for pid in set(tree_pids()) - before_pids:
                seen.setdefault(pid, []).extend(inet_sockets(pid))
                pipes[pid] = max(pipes.get(pid, 0), sum(t.startswith("pipe:") for t in fd_targets(pid)))
            seen.setdefault(os.getpid(), []).extend(s for s in inet_sockets(os.getpid()) if s not in before_inet)
            if not any(t.is_alive() for t in threads):
                break
            threads[0].join(timeout=0.2)
        worker_pids = {broker.pool.pid(i) for i in range(2)}
    assert answers == {i: [i * 100 + k for k in range(20)] for i in range(4)}
    assert worker_pids <= set(seen), "the model workers were not inspected"
    assert all(pipes[pid] >= 2 for pid in worker_pids)  # their queues are pipes
    assert {pid: s for pid, s in seen.items() if s} == {}, "a network socket in the broker's process tree"
    assert not any(psutil.pid_exists(pid) for pid in worker_pids)  # close() ended them


# ----------------------------------------------------------------- (c) listeners in the source
LISTENER_NAMES = {"bind", "listen", "create_server", "start_server", "HTTPServer", "ThreadingHTTPServer", "TCPServer",
                  "ThreadingTCPServer", "UDPServer", "Listener", "TCPStore", "init_process_group", "init_distributed",
                  "run_simple"}
LISTENER_CALLS = {"ray.init", "ray.serve.start", "ray.serve.run", "serve.start", "serve.run", "uvicorn.run"}


def _loopback_or_unix(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Tuple) and node.elts:
        return _is_const(node.elts[0], *LOOPBACK)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(("/", "\0"))


def _sets_loopback_master(source: str) -> bool:
    """``os.environ.setdefault("MASTER_ADDR", "127.0.0.1")`` (or a plain assignment of it) in the module."""
    for name, call in calls(source):
        if name.endswith("environ.setdefault") and len(call.args) == 2 and _is_const(call.args[0], "MASTER_ADDR"):
            return _is_const(call.args[1], *LOOPBACK)
    return False


def _file_store(call: ast.Call) -> bool:
    """``init_method="file://..."``, a literal or an f-string."""
    method = _kw(call, "init_method")
    if isinstance(method, ast.JoinedStr) and method.values:
        method = method.values[0]
    return isinstance(method, ast.Constant) and str(method.value).startswith("file://")


def listeners(source: str) -> list[tuple[str, bool]]:
    """Each call that may open a listening socket, as (``line: call``, whether it is loopback / Unix)."""
    found = []
    binds_ok = all(_loopback_or_unix(c.args[0] if c.args else None) for n, c in calls(source) if n.endswith(".bind"))
    for name, call in calls(source):
        short = name.rsplit(".", 1)[-1]
        if short not in LISTENER_NAMES and name not in LISTENER_CALLS:
            continue
        if short == "listen":
            ok = binds_ok  # the host was chosen by the module's bind calls
        elif short in ("init_process_group", "init_distributed", "TCPStore"):
            # A file store opens no port; init_distributed joins a world the module started that way.
            ok = _file_store(call) or _sets_loopback_master(source) or (short == "init_distributed" and any(
                n.endswith("init_process_group") and _file_store(c) for n, c in calls(source)))
        elif name == "ray.init":
            # _node_ip_address: a local cluster; address=: joining the user's own cluster (`ray start --head`).
            ok = _is_const(_kw(call, "_node_ip_address"), *LOOPBACK) or _kw(call, "address") is not None
        else:
            host = _kw(call, "host") or _kw(call, "address") or (call.args[0] if call.args else None)
            ok = _loopback_or_unix(host) or _is_const(host, *LOOPBACK)
        found.append((f"line {call.lineno}: {ast.unparse(call)[:100]}", ok))
    return found


def test_the_listener_scan_tells_loopback_from_all_interfaces():
    source = """
import socket, os, ray, http.server, torch.distributed as dist
s.bind(("127.0.0.1", 0)); s.bind("/tmp/x.sock"); t.bind(("0.0.0.0", 80)); s.listen()
http.server.HTTPServer(("", 8000), H); socket.create_server(("localhost", 9)); ray.init(); ray.init(_node_ip_address="127.0.0.1")
dist.init_process_group("gloo", init_method="file:///tmp/store"); dist.init_process_group("gloo", init_method=f"file://{d}")
dist.init_process_group("gloo")
"""
    assert [ok for _, ok in listeners(source)] == [True, True, False, False, False, True, False, True, True, True, False]


def test_every_listener_in_the_source_binds_loopback():
    found = {str(p.relative_to(ROOT)): hits for p in source_files() if (hits := listeners(p.read_text()))}
    assert {f: [h for h, ok in hits if not ok] for f, hits in found.items()} == {f: [] for f in found}
    # What the scan sees today: the one-process world (its file store, DeepSpeed joining it), the two ray.init
    # calls and the cluster bench joining the loopback cluster it started.
    assert sorted((f, len(h)) for f, h in found.items()) == [("bench/cluster.py", 1),
                                                             ("training/engine/deepspeed_engine.py", 2),
                                                             ("wam_gym/broker/ray_pool.py", 2)]


# ----------------------------------------------------------------- (c) listeners the libraries really open
LISTENERS_SNIPPET = """
import ipaddress, json, psutil
def listeners():
    me, out = psutil.Process(), []
    for p in [me, *me.children(recursive=True)]:
        try:
            name, conns = (p.cmdline() or [p.name()])[0].rsplit("/", 1)[-1][:40], p.net_connections(kind="inet")
        except psutil.Error:
            continue
        out += [{"pid": p.pid, "name": name, "ip": c.laddr.ip, "port": c.laddr.port} for c in conns if c.status == "LISTEN"]
    return out
"""

RAY_BACKEND = LISTENERS_SNIPPET + """
import ray
from wam_gym.broker import BrokerConfig, InferenceBroker

class Stub:
    action_horizon = 1

def factory(device):
    return Stub()

with InferenceBroker(factory, BrokerConfig(backend="ray", startup_timeout_s=120)) as broker:
    node_ip = ray._private.worker.global_worker.node.node_ip_address
    print(json.dumps({"node_ip": node_ip, "listeners": listeners(), "horizon": broker.action_horizon}))
"""

TORCH_RENDEZVOUS = LISTENERS_SNIPPET + """
import deepspeed
import torch.distributed as dist
from training.engine.deepspeed_engine import _ensure_single_process_env

_ensure_single_process_env()  # what DeepSpeedEngine does without a launcher, then:
deepspeed.init_distributed()
print(json.dumps({"listeners": listeners(), "world": dist.get_world_size()}))
dist.destroy_process_group()
"""


def run_listing(code: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                            env={**clean, "OMP_NUM_THREADS": "1", **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def open_to_the_network(listening: list[dict]) -> list[str]:
    return sorted(f"{s['name']} {s['ip']}:{s['port']}" for s in listening if not is_loopback(s["ip"]))


def test_ray_backend_listeners_are_loopback():
    """The local Ray backend as wam_gym starts it: every Ray server (GCS, raylet, workers,
    agents) binds 127.0.0.1, and there is no dashboard."""
    pytest.importorskip("ray")
    out = run_listing(RAY_BACKEND)
    assert out["horizon"] == 1 and out["node_ip"] == "127.0.0.1"
    assert {s["name"] for s in out["listeners"]} >= {"gcs_server", "raylet"}
    assert not any(s["port"] == 8265 or "dashboard.py" in s["name"] for s in out["listeners"]), "the dashboard is off"
    assert open_to_the_network(out["listeners"]) == []


def test_deepspeed_single_process_world_is_loopback_only():
    """The one-process world DeepSpeedEngine starts without a launcher: a FileStore instead of
    torch's TCPStore (which binds every interface), gloo on the loopback device."""
    out = run_listing(TORCH_RENDEZVOUS)
    assert out["world"] == 1
    assert open_to_the_network(out["listeners"]) == []
