"""The bad-input catalogue: each way to hold wam_gym wrong, and the one-line error that names the fix.

One table (``CASES``: this module's ``cases()``, then each area's in tests/bad_inputs/), the one
source of the catalogue: docs/reference/bad-inputs.md is generated from it (scripts/gen_docs.py;
tests/test_docs.py fails while the page is stale). A case is triggered in-process where possible;
the four ``python -m`` cases run as real subprocesses, all at once (each pays seconds of imports),
and must end stderr with one ``error: ...`` line and no traceback. For every case the message's
FIRST line must match the case's regex, and the regex includes the fix.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import io
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.bad_inputs import Case, Ctx, Shared

ROOT = Path(__file__).resolve().parents[1]
MW = "wam_gym/MetaWorld-pick-place-v3"
LIBERO = "wam_gym/LIBERO-Spatial-v0:0"
CLI_TIMEOUT_S = 300


# ----------------------------------------------------------------------------- triggers
def make_env(env_id: str = MW, **kwargs):
    import envs

    return envs.make(env_id, **kwargs)


def step_env(action) -> Callable[[Ctx], object]:
    def trigger(ctx: Ctx):
        env = make_env(image_size=16)
        try:
            env.unwrapped.step(action)  # the contract checks the action before the simulator sees it
        finally:
            env.close()

    return trigger


def no_libero_assets(ctx: Ctx):
    from envs.libero.env import _check_assets

    _check_assets(lambda key: str(ctx.tmp))


def no_robocasa_assets(ctx: Ctx):
    from envs.robocasa.env import _check_assets

    (ctx.tmp / "models" / "assets" / "textures").mkdir(parents=True)  # a checkout before the download
    _check_assets(ctx.tmp)


def robotwin_unset(ctx: Ctx):
    ctx.monkeypatch.delenv("ROBOTWIN_ROOT", raising=False)
    make_env("wam_gym/RoboTwin-beat_block_hammer-v0")


def no_vulkan(ctx: Ctx):
    from envs.maniskill.env import _make_sim

    ctx.monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    _make_sim("PickCube", 64, 64, "rgb")


def no_gl_library(ctx: Ctx):
    from envs.rendering import select_gl_backend

    ctx.monkeypatch.delenv("MUJOCO_GL", raising=False)
    ctx.monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    select_gl_backend()


def forked_with_gl(ctx: Ctx):
    from envs.rendering import _check_not_forked_with_gl, _GLState

    ctx.monkeypatch.setattr(_GLState, "forked_with_gl", True)
    _check_not_forked_with_gl()


def libero_init_state(ctx: Ctx):
    from envs.libero.env import LiberoEnv

    LiberoEnv._choose_init_state(SimpleNamespace(n_init_states=50), None, {"init_state_id": 50})


def autoreset_vector_env(ctx: Ctx):
    from gymnasium.vector import AutoresetMode

    from wam_gym.eval.rollout import run_episodes

    run_episodes(SimpleNamespace(metadata={"autoreset_mode": AutoresetMode.NEXT_STEP}), None, seeds=[0])


def recompile(ctx: Ctx):
    from agents.wam.compile import CompileConfig, compile_module

    module = torch.nn.Linear(2, 2)
    compile_module(module, CompileConfig(enabled=True, backend="eager", mode=None))  # lazy: nothing compiles
    compile_module(module, CompileConfig(enabled=True, backend="aot_eager", mode=None))


def wan_without_weights(ctx: Ctx):
    from agents.wam import build_model, preset

    build_model(preset("wan22_ti2v_5b"))  # no pretrained_path


def vae_path_missing(ctx: Ctx):
    from agents.wam import build_model, preset

    build_model(preset("tiny", vae_path=str(ctx.tmp / "no-vae")))


def predict(corrupt: Callable[[dict], object]) -> Callable[[Ctx], object]:
    def trigger(ctx: Ctx):
        from tests.test_wam_model import observation  # 2 rows, corner + gripperPOV at 64x64, 4-d state

        obs = observation()
        corrupt(obs)
        ctx.shared.policy.predict(obs)

    return trigger


def nan_output(ctx: Ctx):
    from tests.test_wam_model import observation

    weight = ctx.shared.policy.model.action_expert.proj_out.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.fill_(float("nan"))
    try:
        ctx.shared.policy.predict(observation())
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def checkpoint_copy(ctx: Ctx) -> Path:
    return Path(shutil.copytree(ctx.shared.ckpt, ctx.tmp / "ckpt"))


def load_without_weights(ctx: Ctx):
    from agents.wam import load_pretrained

    ckpt = checkpoint_copy(ctx)
    (ckpt / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    load_pretrained(ckpt)


def load_truncated_weights(ctx: Ctx):
    from agents.wam import load_pretrained

    ckpt = checkpoint_copy(ctx)
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # an interrupted copy
    load_pretrained(ckpt)


def load_truncated(name: str) -> Callable[[Ctx], object]:
    """A checkpoint one of whose files an interrupted copy cut short."""
    def trigger(ctx: Ctx):
        from agents.wam import load_pretrained

        ckpt = checkpoint_copy(ctx)
        (ckpt / name).write_bytes((ckpt / name).read_bytes()[:40])
        load_pretrained(ckpt)

    return trigger


def agent_chunk(actions: np.ndarray) -> Callable[[Ctx], object]:
    """A policy server answering a chunk the env (4-d actions) cannot take."""
    def trigger(ctx: Ctx):
        from gymnasium import spaces

        from agents.chunk_queue import ChunkQueueAgent
        from agents.policy import Prediction
        from agents.predictor import Predictor

        class Server(Predictor):
            action_horizon = None

            def __str__(self) -> str:
                return "the policy server at ws://127.0.0.1:8000"

            def predict(self, obs, noise_seeds=None):
                return Prediction(actions=actions)

        agent = ChunkQueueAgent(Server(), action_space=spaces.Box(-1, 1, (4,), np.float32))
        agent.act({"pixels": {}, "state": np.zeros((1, 4), np.float32), "instruction": ["reach"]})

    return trigger


def load_truncated_lora(ctx: Ctx):
    from agents.wam import LoraSettings, add_lora, build_model, load_pretrained, preset, save_pretrained

    model = build_model(preset("tiny"))  # not the shared one: LoRA layers would stay in it
    add_lora(model, LoraSettings(rank=2))
    ckpt = save_pretrained(model, ctx.tmp / "lora-ckpt")
    adapter = next((ckpt / "lora").rglob("*.safetensors"))
    adapter.write_bytes(adapter.read_bytes()[:50])  # an interrupted copy
    load_pretrained(ckpt)


def load_pickle_shards(ctx: Ctx):
    """A sharded index whose shards are .bin (pickle) files: refused before anything is read."""
    import json

    from agents.wam import load_pretrained

    ckpt = checkpoint_copy(ctx)
    index = {"metadata": {}, "weight_map": {"proj_in.weight": "diffusion_pytorch_model-00001-of-00001.bin"}}
    (ckpt / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    load_pretrained(ckpt)


def load_dir(name: str) -> Callable[[Ctx], object]:
    def trigger(ctx: Ctx):
        from agents.wam import load_pretrained

        (ctx.tmp / "empty").mkdir()
        load_pretrained(ctx.tmp / name)

    return trigger


def eval_config(ctx: Ctx, ckpt: str | None = None, agent: str = "expert", tasks=("wam_gym/MetaWorld-reach-v3",),
                env_kwargs: dict | None = None, protocol: str | None = None, remote: dict | None = None, **evaluation):
    """As the command line composes it: the protocol group's settings (if one is named), then these overrides."""
    from wam_gym.eval import protocols
    from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
    from wam_gym.remote.config import RemoteConfig

    preset = protocols.overlay(protocols.named(protocol))
    evaluation = {"output_dir": str(ctx.tmp / "out"), "tensorboard": False, **preset.get("EVALUATION", {}), **evaluation}
    return EvalConfig(ckpt=ckpt, protocol=protocol, env_kwargs={**preset.get("env_kwargs", {}), **(env_kwargs or {})},
                      EVALUATION=EvaluationConfig(agent=agent, **evaluation), MULTIRUN=MultirunConfig(task_sets=list(tasks)),
                      REMOTE=RemoteConfig(**(remote or {})))


def eval_manager(ckpt: str | None = None, agent: str = "expert", tasks=("wam_gym/MetaWorld-reach-v3",), **changes):
    """EvalManager refuses the config on construction, before it writes anything."""

    def trigger(ctx: Ctx):
        from wam_gym.eval.manager import EvalManager

        cfg = eval_config(ctx, ckpt and str(ctx.tmp / ckpt), agent, tasks, **changes)
        try:
            EvalManager(cfg)
        finally:
            out = Path(cfg.EVALUATION.output_dir)
            assert not out.exists() or out.is_file()

    return trigger


def serve_config(**evaluation) -> Callable[[Ctx], object]:
    """``python -m wam_gym.serve``'s checks, run before any model worker starts."""

    def trigger(ctx: Ctx):
        from wam_gym.model_call import ModelCallConfig
        from wam_gym.serve.__main__ import build_server
        from wam_gym.serve.config import ServeConfig

        build_server(ServeConfig(EVALUATION=ModelCallConfig(**evaluation)))

    return trigger


def served_frame(frame: dict, keys: dict | None = None, protocol: str = "openpi") -> Callable[[Ctx], object]:
    """What the server does with one client frame: decode it, then map it onto the model's inputs
    (a vla-eval observation's missing input also names the runner's --param that sends it)."""

    def trigger(ctx: Ctx):
        import msgpack

        from wam_gym.remote.keymap import key_map, to_contract
        from wam_gym.remote.wire import VLA_EVAL, unpack
        from wam_gym.serve.hello import runner_hints
        from wam_gym.serve.server import KNOBS

        cameras = ("corner", "gripperPOV")
        obs = unpack(msgpack.packb(frame, use_bin_type=True))
        return to_contract(obs, key_map(protocol, cameras, keys, KNOBS[protocol]), KNOBS[protocol],
                           runner_hints(cameras) if protocol == VLA_EVAL else None)

    return trigger


def identity_stats(path: Path, state_dim: int = 4, action_dim: int = 4) -> None:
    from agents.wam import Normalizer
    from agents.wam.normalization import unit_stats

    Normalizer.from_stats(unit_stats(state_dim, action_dim)).save(path)


def eval_wam(prepare: Callable[[Path, Ctx], object] | None = None, **changes) -> Callable[[Ctx], object]:
    """EvalManager of a copy of the tiny checkpoint with statistics, after ``prepare(ckpt, ctx)`` broke it."""

    def trigger(ctx: Ctx):
        ckpt = checkpoint_copy(ctx)
        identity_stats(ckpt / "dataset_stats.json")
        if prepare is not None:
            prepare(ckpt, ctx)
        eval_manager("ckpt", agent="wam", **changes)(ctx)

    return trigger


def edit_json(path: Path, **changes) -> None:
    import json

    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def eval_rerun(before: Callable[[Ctx, Path], object] | None = None, **changes) -> Callable[[Ctx], object]:
    """Rerun an expert evaluation whose episodes are all on disk (no process starts) with ``changes``;
    ``before(ctx, out)`` runs first (to hold the lock, fill the disk...)."""

    def trigger(ctx: Ctx):
        from wam_gym.eval.manager import EvalManager
        from wam_gym.eval.results import EpisodeRecord, ResultStore

        out = ctx.tmp / "out"
        EvalManager(eval_config(ctx, num_trials=2, seed=7)).plan.protocol.resume(has_episodes=False, allow=False)
        for trial in range(2):
            ResultStore(out).write(EpisodeRecord("wam_gym/MetaWorld-reach-v3", trial, 7 + trial, True, 10, 1.0))
        EvalManager(eval_config(ctx, num_trials=2, seed=7)).run()  # every episode on disk: nothing runs
        if before is not None:
            before(ctx, out)
        EvalManager(eval_config(ctx, num_trials=2, **{"seed": 7, **changes})).run()

    return trigger


def hold_lock(ctx: Ctx, out: Path) -> None:
    from wam_gym.utils.run_dir import EVAL_LOCK, locked

    ctx.held_lock = locked(out, EVAL_LOCK)
    ctx.held_lock.__enter__()  # as another evaluation would; released when ctx is dropped


def eval_disk_full(ctx: Ctx, out: Path) -> None:
    import errno

    import wam_gym.eval.results

    def no_space(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    ctx.monkeypatch.setattr(wam_gym.eval.results, "atomic_write_text", no_space)


def read_only(ctx: Ctx):
    """An output dir under a directory this user cannot write (os.access: the tests may run as root)."""
    parent = ctx.tmp / "ro"
    parent.mkdir()
    real_access = os.access
    ctx.monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and Path(p) != parent)
    eval_manager(output_dir=str(parent / "out"))(ctx)


def output_dir_is_file(ctx: Ctx):
    (ctx.tmp / "out").write_text("not a directory")
    eval_manager()(ctx)


def metaworld_init_state(ctx: Ctx):
    env = make_env(image_size=16)
    try:
        env.reset(seed=0, options={"init_state_id": 3})
    finally:
        env.close()


def train_build(*, dataset: bool = True, **changes) -> Callable[[Ctx], object]:
    """training.loop.build (model + data, before any step) for a TrainConfig with ``changes``."""

    def trigger(ctx: Ctx):
        from agents.wam.lora import LoraSettings
        from agents.wam.mot.config import MoTConfig
        from training.config import DatasetConfig, TrainConfig
        from training.loop import build

        model = MoTConfig(cameras=tuple(changes.pop("cameras", ("corner", "wrist"))), image_size=(32, 32))
        lora = LoraSettings(enabled=changes.pop("lora", False))
        root = str(ctx.shared.dataset) if dataset else None
        build(TrainConfig(model=model, dataset=DatasetConfig(root=root), lora=lora, **changes), torch.device("cpu"))

    return trigger


def augment_with_cache(ctx: Ctx):
    from training.config import DatasetConfig, InfraConfig, TrainConfig

    TrainConfig(dataset=DatasetConfig(deterministic=False), infra=InfraConfig(name="cache", latent_cache=True))


def dataset_without_stats(ctx: Ctx):
    from training.data import LeRobotDataset

    root = Path(shutil.copytree(ctx.shared.dataset, ctx.tmp / "ds"))
    (root / "meta" / "stats.json").unlink()
    LeRobotDataset(root)


def cache_with(fingerprint: dict | None) -> Callable[[Ctx], object]:
    """A LatentCache over a directory holding ``fingerprint`` (None: no cache) read by a 32x32 run."""

    def trigger(ctx: Ctx):
        import json

        from training.caches import LatentCache

        if fingerprint is not None:
            (ctx.tmp / "cache_meta.json").write_text(json.dumps({"fingerprint": fingerprint, "video_samples": 0}))
        LatentCache(ctx.tmp, {"image_size": [32, 32]})

    return trigger


def no_cache_dir(ctx: Ctx):
    from training.caches import cache_dir

    ctx.monkeypatch.delenv("WAM_LATENT_CACHE", raising=False)
    cache_dir()


def write_video(frames) -> Callable[[Ctx], object]:
    def trigger(ctx: Ctx):
        from wam_gym.utils.video import write_mp4

        write_mp4(ctx.tmp / "v.mp4", frames)

    return trigger


def read_video(content: bytes | None) -> Callable[[Ctx], object]:
    def trigger(ctx: Ctx):
        from wam_gym.utils.video import read_mp4

        path = ctx.tmp / "v.mp4"
        if content is not None:
            path.write_bytes(content)
        read_mp4(path)

    return trigger


def compared_runs(b_protocol: dict) -> Callable[[Ctx], object]:
    """python -m wam_gym.compare on two runs of one episode each, B's protocol changed by ``b_protocol``."""

    def trigger(ctx: Ctx):
        import json

        from wam_gym.compare import compare
        from wam_gym.eval.results import EpisodeRecord, ResultStore

        for name, changes in (("A", {}), ("B", b_protocol)):
            run = ctx.tmp / name
            run.mkdir()
            protocol = {"protocol": {"EVALUATION.seed": 0, **changes}, "observed": {}, "agent": {}}
            (run / "protocol.json").write_text(json.dumps(protocol))
            ResultStore(run).write(EpisodeRecord("wam_gym/MetaWorld-reach-v3", 0, 0, True, 1, 0.0))
        return compare(ctx.tmp / "A", ctx.tmp / "B")

    return trigger


def call(target: str, *args, **kwargs) -> Callable[[Ctx], object]:
    """Call ``module:function`` (imported when the case runs) with fixed arguments."""

    def trigger(ctx: Ctx):
        module, name = target.split(":")
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj(*args, **kwargs)

    return trigger


def resume_mismatch(ctx: Ctx):
    """A rerun into an output_dir whose train_config.json has batch_size=8, now with batch_size=4."""
    import json

    from training.config import TrainConfig
    from training.run_dir import check_resume, describe

    (ctx.tmp / "train_config.json").write_text(json.dumps(describe(TrainConfig(batch_size=8), None, "fp32")))
    check_resume(ctx.tmp, describe(TrainConfig(batch_size=4), None, "fp32"), allow_mismatch=False)


def train_disk_full(ctx: Ctx):
    """A step checkpoint written to a full disk (torch.save raising ENOSPC)."""
    import errno

    from training.engine import EngineConfig, TorchEngine
    from training.loop import _checkpoint

    engine = TorchEngine(torch.nn.Linear(2, 2), EngineConfig(), "cpu")
    ctx.monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    _checkpoint(engine, ctx.tmp / "run", {}, keep=2)


def dataset_with_fps(video_rate: float | None = None, info_rate: float | None = None) -> Callable[[Ctx], object]:
    """The shared dataset (20 fps) with meta/info.json's fps, or one camera's mp4, at another rate."""

    def trigger(ctx: Ctx):
        import json

        from training.data import LeRobotDataset
        from wam_gym.utils.video import read_mp4, write_mp4

        root = Path(shutil.copytree(ctx.shared.dataset, ctx.tmp / "ds"))
        if info_rate is not None:
            info = json.loads((root / "meta/info.json").read_text())
            (root / "meta/info.json").write_text(json.dumps({**info, "fps": info_rate}))
        if video_rate is not None:
            video = root / "videos/observation.images.wrist/chunk-000/file-000.mp4"
            write_mp4(video, read_mp4(video), fps=video_rate)
        LeRobotDataset(root)

    return trigger


def damaged_dataset(damage: Callable[[Path], None]) -> Callable[[Ctx], object]:
    """The shared dataset with ``damage`` done to a copy, then opened as training opens it."""

    def trigger(ctx: Ctx):
        from training.data import LeRobotDataset

        root = Path(shutil.copytree(ctx.shared.dataset, ctx.tmp / "ds"))
        damage(root)
        LeRobotDataset(root)

    return trigger


def _edit_column(path: Path, column: str, edit: Callable[[list], list]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    values = pa.array(edit(table.column(column).to_pylist()), table.schema.field(column).type)
    pq.write_table(table.set_column(table.column_names.index(column), column, values), path)


def _edit_info(root: Path, **changes) -> None:
    import json

    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, **changes}))


def _recorded_orientation(root: Path, orientation: str | None, robot_type: str) -> None:
    """Each camera's orientation record set (None: removed), as a dataset from a writer of ``robot_type``."""
    import json

    info = json.loads((root / "meta/info.json").read_text())
    for feature in info["features"].values():
        if "info" in feature:
            feature["info"].pop("orientation")
            feature["info"].update({"orientation": orientation} if orientation else {})
    (root / "meta/info.json").write_text(json.dumps({**info, "robot_type": robot_type}))


def dataset_of_unknown_orientation(ctx: Ctx):
    """The shared dataset as one from elsewhere that does not record its frames' orientation, opened for training."""
    from training.data import ClipDataset

    root = Path(shutil.copytree(ctx.shared.dataset, ctx.tmp / "ds"))
    _recorded_orientation(root, None, robot_type="so100")
    ClipDataset(root)


def convert_into_a_busy_destination(ctx: Ctx):
    """A second convert while another writer (held here, as another process would) publishes the destination."""
    from training.data.lerobot.convert import convert
    from wam_gym.utils.publish import writer_lock

    ctx.held_lock = writer_lock(ctx.tmp / "dst")
    ctx.held_lock.__enter__()
    convert(ctx.shared.dataset, ctx.tmp / "dst")


def drifting_dataset(ctx: Ctx):
    """The shared dataset (20 fps) with episode 1's frames of one camera 30 ms early: a timeline that drifts."""
    from tests.test_timeline import drift
    from training.data import LeRobotDataset

    root = Path(shutil.copytree(ctx.shared.dataset, ctx.tmp / "ds"))
    drift(root / "videos/observation.images.wrist/chunk-000/file-000.mp4", 4, 0.030, fps=20)
    LeRobotDataset(root).episode_frames(1, "wrist")


# ----------------------------------------------------------------------------- the catalogue
def cases() -> list[Case]:
    from agents.wam.attention import AttentionBackendError
    from agents.wam.checkpoint import MissingCheckpointError
    from agents.wam.compile import CompileConfigMismatch
    from agents.wam.policy import NonFiniteOutputError
    from envs.errors import MissingAssetsError, MissingSimulatorError, UnknownEnvError
    from envs.maniskill.env import VulkanUnavailableError
    from envs.rendering import GLBackendError
    from training.caches import CacheMismatchError
    from training.data import DatasetError
    from wam_gym.broker import BrokerConfig, BrokerError
    from wam_gym.eval.errors import EvalError, OutputDirBusy, ResumeMismatch
    from wam_gym.remote.keymap import ObservationError
    from wam_gym.remote.wire import WireError
    from wam_gym.utils.publish import TargetBusyError
    from wam_gym.utils.run_dir import DiskFullError, ResumeMismatchError

    f32 = np.float32
    pixel = {"__ndarray__": True, "data": bytes(3), "dtype": "|u1", "shape": [1, 1, 3]}  # a 1x1 image, as vla-eval packs it
    return [
        # --- command lines
        Case("eval-cli-unknown-key", ("wam_gym.eval", "EVALUATION.num_trails=2"), 1,
             r"^error: Could not override 'EVALUATION\.num_trails'.*Did you mean EVALUATION\.num_trials\?"),
        Case("eval-cli-bad-value", ("wam_gym.eval", "MULTIRUN.backend=foo"), 1,
             r"^error: MULTIRUN\.backend='foo': choose one of \('local', 'ray'\)"),
        Case("train-cli-unknown-key", ("training", "task=metaworld_tiny", "batch_szie=4"), 1,
             r"^error: Could not override 'batch_szie'.*Did you mean batch_size\?"),
        Case("train-cli-bad-precision", ("training", "task=metaworld_tiny", "model.encoder_mode.backbone=bf16"), 1,
             r"^error: encoder_mode\.backbone='bf16' is not a precision mode.*bf16 weights: bf16_full"),
        Case("envs-cli-unknown-id", ("wam_gym.envs", "check", "wam_gym/MetaWorld-door-opn-v3"), 2,
             r"^error: unknown env id .*Did you mean wam_gym/MetaWorld-door-open-v3\b.*python -m wam_gym\.envs list"),
        Case("envs-cli-missing-kwargs", ("wam_gym.envs", "check", "wam_gym/WorldModel-v0"), 2,
             r"^error: wam_gym/WorldModel-v0 needs checkpoint= .*dataset= .*here pass them as: python -m wam_gym\.envs "
             r"check wam_gym/WorldModel-v0 --kwarg KEY=VALUE"),
        # --- environments
        Case("env-unknown-id", lambda ctx: make_env("wam_gym/MetaWorld-pick-plase-v3"), UnknownEnvError,
             r"Did you mean wam_gym/MetaWorld-pick-place-v3\b.*python -m wam_gym\.envs list"),
        Case("env-suite-not-installed", lambda ctx: make_env("wam_gym/LIBERO-Spatial-v0"), MissingSimulatorError,
             r"LIBERO needs the 'libero' package.*pip install 'wam_gym\[libero\]'", absent="libero"),
        Case("env-libero-assets-missing", no_libero_assets, MissingAssetsError,
             r"LIBERO's scene assets are missing.*pip install 'wam_gym\[libero\]'"),
        Case("env-robocasa-assets-missing", no_robocasa_assets, MissingAssetsError,
             r"kitchen assets are missing.*python \S+/scripts/download_kitchen_assets\.py"),
        Case("env-robotwin-not-installed", robotwin_unset, MissingSimulatorError,
             r"ROBOTWIN_ROOT is not set.*git clone https://github\.com/RoboTwin-Platform/RoboTwin\.git"),
        Case("env-maniskill-no-vulkan", no_vulkan, VulkanUnavailableError,
             r"renders with Vulkan.*apt-get install -y -t bookworm-backports mesa-vulkan-drivers libvulkan1"),
        Case("env-no-gl-library", no_gl_library, GLBackendError,
             r"no offscreen GL library found \(EGL or OSMesa\): apt-get install libegl1"),
        Case("env-forked-with-gl", forked_with_gl, GLBackendError,
             r"forked from a parent that holds a GL context.*vector_kwargs=\{'context': 'forkserver'\}"),
        Case("env-bad-camera", lambda ctx: make_env(cameras=("front",)), ValueError,
             r"unknown Meta-World camera\(s\) \['front'\]; choose from \('corner'", needs="metaworld"),
        Case("env-bad-image-size", lambda ctx: make_env(image_size=(0, 3)), ValueError,
             r"image_size must be a positive int or \(height, width\), got \(0, 3\)", needs="metaworld"),
        Case("env-action-wrong-shape", step_env(np.zeros(3, f32)), ValueError,
             r"action must have shape \(4,\) \(got \(3,\)\); for a batch of envs use a VectorEnv", needs="metaworld"),
        Case("env-action-nan", step_env(np.array([0, np.nan, 0, 0], f32)), ValueError,
             r"action contains NaN or inf.*send finite actions", needs="metaworld"),
        Case("env-libero-init-state", libero_init_state, ValueError, r"init_state_id must be an int in 0\.\.49, got 50"),
        Case("env-libero-bad-settle-steps", call("envs.libero.env:LiberoEnv", settle_steps=-1), ValueError,
             r"LIBERO settle_steps must be an int >= 0 \(no-op steps after the init state is set; default 10\), got -1"),
        Case("env-metaworld-init-state", metaworld_init_state, ValueError,
             r"Meta-World has no init states \(reset got init_state_id=3\).*drop the option and pass reset\(seed=\.\.\.\)",
             needs="metaworld"),
        Case("rollout-autoreset-on", autoreset_vector_env, ValueError,
             r"run_episodes needs a vector env with autoreset disabled.*create it with envs\.make_vec"),
        # --- models and policies
        Case("model-unknown-preset", call("agents.wam.mot.config:preset", "huge"), ValueError,
             r"unknown model preset 'huge'; choose one of \['tiny', 'wan21_t2v_1_3b', 'wan22_ti2v_5b'\]"),
        Case("model-wan-without-weights", wan_without_weights, MissingCheckpointError,
             r"preset 'wan22_ti2v_5b' loads Wan weights.*set model\.pretrained_path="),
        Case("model-vae-path-missing", vae_path_missing, MissingCheckpointError,
             r"model\.vae_path \S+ is not a local directory; "
             r"pass the folder `python -m training\.fit_vae output_dir=\.\.\.` wrote"),
        Case("train-fit-vae-without-dataset", call("training.fit_vae:FitVAEConfig", output_dir="vae"), ValueError,
             r"dataset\.root is not set: collect demos with `python -m training\.collect \.\.\.` and pass the folder"),
        Case("model-bad-image-size", call("agents.wam.mot.config:preset", "tiny", image_size=(60, 64)), ValueError,
             r"image_size=\(60, 64\) must be divisible by 16"),
        Case("model-bad-precision", call("agents.wam.precision:PrecisionConfig", vae="bf16"), ValueError,
             r"encoder_mode\.vae='bf16' is not a precision mode; expected one of \('fp32', 'autocast', 'bf16_full'\)"),
        Case("model-unknown-sampler", call("wam_gym.eval.config:EvaluationConfig", sampler="euler"), ValueError,
             r"EVALUATION: unknown sampler 'euler'; choose one of flow_euler, unipc, dpmpp, ddim"),
        Case("model-unknown-future-video", call("wam_gym.eval.config:EvaluationConfig", future_video="mean"), ValueError,
             r"EVALUATION: future_video='mean': choose one of sample, expected"),
        Case("model-unknown-video-target", call("agents.wam.mot.config:preset", "tiny", video_target="delta"), ValueError,
             r"video_target='delta': choose one of \('latents', 'change'\)"),
        Case("model-future-frames-not-whole-groups", call("agents.wam.mot.config:preset", "tiny", num_future_frames=2),
             ValueError,
             r"num_future_frames=2 must be a multiple of 4: Wan's VAE encodes the frames after the first in groups of 4"),
        Case("model-flash-attention-on-cpu", call("agents.wam.attention:resolve_attention_backend", "fa3", "cpu"),
             AttentionBackendError, r"attention_backend=fa3 cannot run.*attention_backend=sdpa or auto works"),
        Case("model-recompile", recompile, CompileConfigMismatch, r"already compiled with .*restart the worker"),
        Case("obs-missing-camera", predict(lambda o: o["pixels"].pop("gripperPOV")), ValueError,
             r"observation lacks camera\(s\) \['gripperPOV'\].*make the env with those cameras"),
        Case("obs-pixels-wrong-dtype", predict(lambda o: o["pixels"].update(corner=o["pixels"]["corner"].astype(f32))),
             ValueError, r"pixels/corner is float32 .*the contract is uint8 \(B, H, W, 3\).*as wam_gym envs return"),
        Case("obs-pixels-wrong-shape", predict(lambda o: o["pixels"].update(corner=o["pixels"]["corner"][..., 0])),
             ValueError, r"pixels/corner is uint8 \(2, 64, 64\); the contract is uint8 \(B, H, W, 3\)"),
        Case("obs-state-wrong-size", predict(lambda o: o.update(state=o["state"][:, :3])), ValueError,
             r"state is float32 \(2, 3\); the model needs float \(B, 4\) with B=2"),
        Case("obs-state-not-finite", predict(lambda o: o["state"].__setitem__((1, 2), np.nan)), ValueError,
             r"the observation's state holds NaN/inf \(rows \[1\], dimensions \[2\]\), as the env or client sent it: "
             r"the model was not called"),
        Case("obs-pixels-empty", predict(lambda o: o["pixels"].update(corner=np.zeros((2, 0, 0, 3), np.uint8))),
             ValueError, r"pixels/corner is uint8 \(2, 0, 0, 3\); the contract is uint8 \(B, H, W, 3\) with B=2 and "
                         r"H, W >= 1"),
        Case("agent-chunk-wrong-width", agent_chunk(np.zeros((1, 4, 3), f32)), ValueError,
             r"the policy server at ws://127\.0\.0\.1:8000 answered actions of \(3,\) per step; the env takes \(4,\): "
             r"the policy was made for another env"),
        Case("agent-chunk-empty", agent_chunk(np.zeros((1, 0, 4), f32)), ValueError,
             r"the policy server at ws://127\.0\.0\.1:8000 answered a chunk of no actions \(\(0, 4\)\); every answer "
             r"needs at least one action"),
        Case("model-nan-output", nan_output, NonFiniteOutputError,
             r"non-finite action values \(NaN/inf\); no action was sent.*model\.encoder_mode\.\*=fp32"),
        # --- checkpoints
        Case("ckpt-missing-dir", load_dir("nope"), MissingCheckpointError,
             r"checkpoint \S+/nope is not a local directory; train one with `python -m training`"),
        Case("ckpt-not-a-checkpoint", load_dir("empty"), MissingCheckpointError,
             r"has no wam_config\.json: not a wam_gym checkpoint.*pass the directory `python -m training` wrote"),
        Case("ckpt-missing-weights", load_without_weights, MissingCheckpointError,
             r"transformer/ lacks \*\.safetensors.*re-save or re-download the checkpoint"),
        Case("ckpt-corrupt-weights", load_truncated_weights, MissingCheckpointError,
             r"transformer/ cannot be loaded .*truncated or corrupt: re-save the checkpoint"),
        Case("ckpt-pickle-shards", load_pickle_shards, MissingCheckpointError,
             r"names non-safetensors shards .*only safetensors weights are loaded \(convert the shards"),
        Case("ckpt-corrupt-lora", load_truncated_lora, ValueError,
             r"LoRA weights \S+ are truncated or corrupt .*; re-save the adapters"),
        Case("ckpt-corrupt-tokenizer", load_truncated("tokenizer/tokenizer_config.json"), MissingCheckpointError,
             r"tokenizer/ cannot be loaded \(.*\); its files are truncated or corrupt: re-save the checkpoint"),
        Case("ckpt-corrupt-text-encoder", load_truncated("text_encoder/model.safetensors"), MissingCheckpointError,
             r"text_encoder/ cannot be loaded \(.*\); its files are truncated or corrupt: re-save the checkpoint"),
        Case("ckpt-missing-stats", call("agents.wam.normalization:Normalizer.from_stats_file", "/nonexistent/stats.json"),
             FileNotFoundError, r"dataset stats \S+ not found; point EVALUATION\.dataset_stats_path at"),
        # --- evaluation
        Case("eval-wam-without-ckpt", eval_manager(agent="wam"), ValueError,
             r"EVALUATION\.agent=wam needs ckpt=<checkpoint dir> \(or EVALUATION\.agent=expert\|random\)"),
        Case("eval-ckpt-not-a-checkpoint", eval_manager(agent="wam", ckpt="nope"), MissingCheckpointError,
             r"ckpt=\S+/nope is not a checkpoint directory.*pass the directory python -m training saved"),
        Case("eval-unknown-task-set", eval_manager(tasks=("metaworld_mt11",)), ValueError,
             r"unknown task set 'metaworld_mt11'; known sets: .*'metaworld_mt10'.*\(or give env ids\)"),
        Case("eval-gpu-on-cpu", call("wam_gym.broker:worker_devices", BrokerConfig(num_gpus=1), available_gpus=0), BrokerError,
             r"MULTIRUN\.num_gpus=1 but no CUDA device is visible; set MULTIRUN\.num_gpus=0"),
        Case("eval-zero-actors", call("wam_gym.eval.config:MultirunConfig", env_num_per_worker=0), ValueError,
             r"MULTIRUN\.env_num_per_worker must be in \[1, \d+\] \(actors per model worker\), got 0"),
        Case("eval-zero-trials", call("wam_gym.eval.config:EvaluationConfig", num_trials=0), ValueError,
             r"EVALUATION\.num_trials must be in \[1, \d+\] \(episodes per task\), got 0"),
        Case("eval-zero-replan-steps", call("wam_gym.eval.config:EvaluationConfig", replan_steps=0), ValueError,
             r"EVALUATION\.replan_steps must be in \[1, \d+\] or null \(action_horizon\), got 0"),
        Case("eval-zero-episode-steps", call("wam_gym.eval.config:EvaluationConfig", max_episode_steps=0), ValueError,
             r"EVALUATION\.max_episode_steps must be in \[1, \d+\] or null \(the suite's limit\), got 0"),
        Case("eval-zero-video-fps", call("wam_gym.eval.config:EvaluationConfig", video_fps=0), ValueError,
             r"EVALUATION\.video_fps must be in \[1, \d+\], got 0"),
        Case("eval-unknown-render", call("wam_gym.eval.config:EvaluationConfig", render="some"), ValueError,
             r"EVALUATION\.render='some': choose one of needed, every_step"),
        Case("eval-realtime-without-model", call("wam_gym.eval.config:EvaluationConfig", agent="expert", realtime=True),
             ValueError, r"EVALUATION\.realtime=true runs a model's chunks while it thinks; EVALUATION\.agent=expert "
             r"calls no model: use one of wam, python, remote, or realtime=false"),
        Case("eval-latency-without-realtime", call("wam_gym.eval.config:EvaluationConfig", latency_ms=300.0), ValueError,
             r"EVALUATION\.latency_ms=300\.0 sets the latency of real-time mode: add EVALUATION\.realtime=true, or "
             r"drop it"),
        Case("eval-negative-seed", call("wam_gym.eval.config:EvaluationConfig", seed=-1), ValueError,
             r"EVALUATION\.seed must be in \[0, \d+\] \(trial k uses seed \+ k\), got -1"),
        Case("eval-stall-zero", call("wam_gym.eval.config:EvaluationConfig", actor_stall_s=0), ValueError,
             r"EVALUATION\.actor_stall_s must be in \(0, \d+\] \(seconds\) or null \(off\), got 0"),
        Case("eval-negative-restarts", call("wam_gym.eval.config:MultirunConfig", max_worker_restarts=-1), ValueError,
             r"MULTIRUN\.max_worker_restarts must be in \[0, \d+\] \(0: the first death stops the run\), got -1"),
        Case("eval-unknown-video-camera", eval_manager(video_camera="front"), ValueError,
             r"EVALUATION\.video_camera='front': \S+ renders cameras \['corner', 'gripperPOV'\]; pick one of them"),
        Case("eval-task-index-without-task-ids", eval_manager(tasks=("wam_gym/MetaWorld-reach-v3:3",)), ValueError,
             r"takes no task index \(only LIBERO ids do\); drop the ':3'"),
        Case("eval-ckpt-config-wrong-type", eval_wam(lambda c, ctx: edit_json(c / "wam_config.json", action_horizon="16")),
             ValueError, r"\S+/wam_config\.json: action_horizon=\"16\" is not int; fix that field, or re-save the checkpoint"),
        Case("eval-ckpt-config-truncated", eval_wam(lambda c, ctx: truncate(c / "wam_config.json")), MissingCheckpointError,
             r"\S+/wam_config\.json is not readable JSON \(.*\): the checkpoint is truncated or corrupt; re-save it"),
        Case("eval-ckpt-without-stats", eval_wam(lambda c, ctx: (c / "dataset_stats.json").unlink()), FileNotFoundError,
             r"has no dataset_stats\.json: .*set EVALUATION\.dataset_stats_path=<dataset>/meta/stats\.json"),
        Case("eval-stats-path-missing", eval_wam(dataset_stats_path="/nonexistent/stats.json"), FileNotFoundError,
             r"dataset stats /nonexistent/stats\.json not found; point EVALUATION\.dataset_stats_path at"),
        Case("eval-stats-wrong-size", eval_wam(lambda c, ctx: identity_stats(c / "dataset_stats.json", action_dim=7)),
             ValueError, r"describe a 7-d action, the checkpoint's model a 4-d one: point EVALUATION\.dataset_stats_path"),
        Case("eval-image-size-mismatch", eval_wam(env_kwargs={"image_size": 128}), ValueError,
             r"env_kwargs\.image_size=\[128, 128\] differs from the checkpoint's image_size \[64, 64\].*"
             r"Drop env_kwargs\.image_size.*or set EVALUATION\.allow_image_resize=true"),
        Case("eval-camera-missing", eval_wam(env_kwargs={"cameras": ["corner"]}), ValueError,
             r"env_kwargs\.cameras=\['corner'\] lacks \['gripperPOV'\], which the checkpoint takes .*"
             r"Drop env_kwargs\.cameras \(the env then renders the checkpoint's\), or list all of them"),
        Case("eval-action-horizon-too-long", eval_wam(action_horizon=32), ValueError,
             r"EVALUATION\.action_horizon=32: the checkpoint predicts 1\.\.16 actions per call"),
        Case("eval-unknown-protocol", call("wam_gym.eval.config:EvalConfig", protocol="fastwam"), ValueError,
             r"protocol='fastwam' is not a known protocol: choose one of \['fastwam_libero', "
             r"'lingbot_va_libero', 'lingbot_va_robotwin'\], or none"),
        Case("eval-protocol-conflict", eval_manager(tasks=(LIBERO,), protocol="fastwam_libero", seed=3), ValueError,
             r"EVALUATION\.seed=3 conflicts with protocol=fastwam_libero, which fixes it to 42: drop the "
             r"override, or leave the protocol out \(protocol=none\)"),
        Case("eval-protocol-other-suite", eval_manager(protocol="fastwam_libero"), ValueError,
             r"protocol=fastwam_libero evaluates libero tasks, and wam_gym/MetaWorld-reach-v3 is a metaworld "
             r"task: evaluate libero tasks \(benchmark=libero\), or leave the protocol out \(protocol=none\)"),
        Case("eval-protocol-ckpt-inputs", eval_wam(tasks=(LIBERO,), protocol="fastwam_libero"), ValueError,
             r"protocol=fastwam_libero feeds the model by the input convention 'fastwam_libero', and "
             r"ckpt=\S+ declares none \(inputs\.name in its wam_config\.json\): evaluate a checkpoint made with that "
             r"convention .*, or leave the protocol out \(protocol=none\)"),
        Case("eval-protocol-cannot-run", eval_manager(tasks=("wam_gym/RoboTwin-beat_block_hammer-v0",), agent="random",
                                                      protocol="lingbot_va_robotwin"), ValueError,
             r"protocol=lingbot_va_robotwin records their evaluation and runs no episode yet: .*; leave the "
             r"protocol out \(protocol=none\)"),
        Case("eval-output-dir-is-file", output_dir_is_file, ValueError,
             r"EVALUATION\.output_dir=\S+ is a file, not a directory: pass a directory path"),
        Case("eval-output-dir-not-writable", read_only, ValueError,
             r"EVALUATION\.output_dir=\S+ is not writable .*pass a directory you can write to"),
        Case("eval-resume-mismatch", eval_rerun(seed=8), ResumeMismatch,
             r"holds episodes run with other settings: EVALUATION\.seed was 7, now 8\..*use a new EVALUATION\.output_dir, "
             r"or set EVALUATION\.allow_resume_mismatch=true"),
        Case("eval-resume-without-protocol", eval_rerun(lambda ctx, out: (out / "protocol.json").unlink()),
             ResumeMismatch, r"holds episodes but no protocol\.json: the settings they ran with are unknown, and resuming "
                             r"would count them as this run's\. Use a new EVALUATION\.output_dir, or set "
                             r"EVALUATION\.allow_resume_mismatch=true"),
        Case("eval-output-dir-busy", eval_rerun(hold_lock), OutputDirBusy,
             r"is in use by another evaluation \(pid \d+ on \S+, since \S+: .*\): wait for it to finish, or use another "
             r"EVALUATION\.output_dir"),
        Case("eval-disk-full", eval_rerun(eval_disk_full), EvalError,
             r"no space left on device writing \S+/results\.json \(\d+ MiB free; .*every record written before is "
             r"kept\): free space, then run again to resume with EVALUATION\.output_dir="),
        # --- serving, remote and python policies (issue 16)
        Case("serve-agent-not-served", serve_config(agent="expert"), ValueError,
             r"EVALUATION\.agent='expert' cannot be served; serve one of \('wam', 'python'\)"),
        Case("serve-python-without-cameras", serve_config(agent="python", policy="example_policy:make_policy"),
             ValueError, r"EVALUATION\.agent=python needs SERVE\.cameras=\[\.\.\.\]: the cameras your policy takes"),
        Case("serve-bad-port", call("wam_gym.serve.config:ServeSettings", port=70000), ValueError,
             r"SERVE\.port must be in \[0, 65535\] \(0: any free port\), got 70000"),
        Case("serve-client-frames-unknown", call("wam_gym.serve.config:ServeSettings", client_frames="flipped"),
             ValueError, r"SERVE\.client_frames='flipped' is not a frame orientation: choose one of \['mirrored', "
             r"'rotated_180', 'upright', 'upside_down'\]"),
        Case("serve-suite-unknown", call("wam_gym.serve.config:ServeSettings", suite="liberoo"), ValueError,
             r"SERVE\.suite='liberoo' is not a suite: choose one of \[.*'libero'"),
        Case("serve-obs-orientation-unknown", served_frame({"image_orientation": "sideways"}), ObservationError,
             r"image_orientation='sideways' is not a frame orientation: send one of \['mirrored', 'rotated_180', "
             r"'upright', 'upside_down'\], or leave it out"),
        Case("serve-episode-knob", call("wam_gym.serve.config:refuse_episode_knobs", ["EVALUATION.num_trials=5"]),
             ValueError, r"EVALUATION\.num_trials is an evaluation knob \(episodes, outputs, actors\): python -m "
             r"wam_gym\.serve runs no episodes and takes only the model-call knobs; drop it"),
        Case("serve-key-map-unknown", served_frame({}, {"pixels.wrist": "image"}), ValueError,
             r"SERVE\.openpi_keys maps \['pixels\.wrist'\], which name no input of the model; map any of"),
        Case("serve-obs-missing-key", served_frame({"prompt": "reach"}), ObservationError,
             r"the observation lacks 'observation/image' \(the model's pixels\.corner\); it has keys \['prompt'\]: "
             r"send it, or map .* with SERVE\.openpi_keys"),
        Case("serve-vla-eval-obs-missing-state",
             served_frame({"images": {"corner": pixel, "gripperPOV": pixel}, "task_description": "reach"},
                          protocol="vla-eval"), ObservationError,
             r"the observation lacks 'state' \(the model's state; also read as 'states', 'joint_state'\); it has keys "
             r"\['images\.corner', 'images\.gripperPOV', 'task_description'\]: send it \(vla-eval's runner: "
             r"--param send_state=true\), or map .* with SERVE\.vla_eval_keys"),
        Case("serve-obs-float-image", served_frame({"observation/image": {b"__ndarray__": True, b"data": bytes(12),
                                                                          b"dtype": "<f4", b"shape": [1, 1, 3]}}),
             ObservationError, r"'observation/image' \(camera corner\) must be a uint8 \(H, W, 3\) image, got float32"),
        Case("serve-obs-object-array", served_frame({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|O",
                                                           b"shape": [0]}}),
             WireError, r"dtype object is not allowed: send bool, int, uint or float arrays"),
        Case("eval-python-without-policy", eval_manager(agent="python"), ValueError,
             r"EVALUATION\.agent=python needs EVALUATION\.policy=pkg\.module:factory"),
        Case("eval-python-policy-not-importable", eval_manager(agent="python", policy="nowhere:make"), ValueError,
             r"EVALUATION\.policy='nowhere:make': cannot import nowhere .*put its folder on PYTHONPATH"),
        Case("eval-remote-frames-unknown", eval_manager(agent="remote", remote={"url": "ws://localhost:8000",
                                                                                    "frames": "sideways"}), ValueError,
             r"REMOTE\.frames='sideways' is not a frame orientation: choose one of"),
        Case("eval-remote-knob-moved", call("wam_gym.eval.config:compose", ["EVALUATION.remote_url=ws://h:1"]),
             ValueError, r"^EVALUATION\.remote_url is now REMOTE\.url: write REMOTE\.url=\.\.\. instead"),
        Case("eval-remote-without-url", eval_manager(agent="remote"), ValueError,
             r"EVALUATION\.agent=remote needs REMOTE\.url=ws://host:port"),
        Case("eval-remote-bad-url", eval_manager(agent="remote", remote={"url": "http://localhost:8000"}), ValueError,
             r"REMOTE\.url='http://localhost:8000': write it as ws://host:port"),
        Case("eval-remote-unknown-protocol", eval_manager(agent="remote", remote={"url": "ws://localhost:8000",
                                                                                      "protocol": "grpc"}), ValueError,
             r"REMOTE\.protocol='grpc': choose one of \['openpi', 'vla-eval'\]"),
        Case("eval-target-halfwidth-out-of-range", call("wam_gym.eval.config:EvaluationConfig", target_ci_halfwidth=0.7),
             ValueError, r"EVALUATION\.target_ci_halfwidth must be in \(0, 0\.5\] \(e\.g\. 0\.1: \+-10 points\) or null"),
        Case("eval-compare-to-not-a-run", eval_manager(compare_to="/nonexistent/run"), ValueError,
             r"EVALUATION\.compare_to: /nonexistent/run has no protocol\.json \(not an evaluation output dir"),
        Case("compare-different-protocols", compared_runs({"EVALUATION.seed": 1}), ValueError,
             r"A \(\S+\) and B \(\S+\) ran under different protocols, so their episodes are not the same episodes: "
             r"EVALUATION\.seed is in A \S+ 0, in B \S+ 1\. Compare runs evaluated with the same suite"),
        # --- datasets and training
        Case("dataset-missing", call("training.data:LeRobotDataset", "/nonexistent/dataset"), DatasetError,
             r"no dataset at /nonexistent/dataset.*Collect one with: python -m training\.collect --env ENV_ID"),
        Case("dataset-no-stats", dataset_without_stats, DatasetError,
             r"meta/stats\.json is missing; recompute it with: python -m training\.collect --stats-only \S+"),
        Case("train-dataset-root-unset", train_build(dataset=False), ValueError,
             r"dataset\.root is not set: collect demos with `python -m training\.collect"),
        Case("train-camera-not-in-dataset", train_build(cameras=("corner", "topview")), ValueError,
             r"model\.cameras \['topview'\] are not in the dataset.*set model\.cameras=\['corner', 'wrist'\]"),
        Case("train-lora-without-init", train_build(lora=True), ValueError,
             r"LoRA fine-tunes trained weights: set init_from=<checkpoint>"),
        Case("train-unknown-deepspeed", call("training.engine:resolve_deepspeed_config", "zero3"), FileNotFoundError,
             r"deepspeed='zero3': not one of zero1, zero2, zero2_offload"),
        Case("train-augment-with-cache", augment_with_cache, ValueError,
             r"^dataset\.deterministic=false \(random augmentation\) cannot use a static latent cache: "
             r"train with \+infra=online or \+infra=compile"),
        Case("cache-dir-unset", no_cache_dir, ValueError, r"export WAM_LATENT_CACHE=/path/to/cache"),
        Case("cache-missing", cache_with(None), FileNotFoundError,
             r"no latent cache in \S+: generate it with `python scripts/video_cache\.py .*video_latent_cache=generate`"),
        Case("cache-mismatch", cache_with({"image_size": [16, 16]}), CacheMismatchError,
             r"image_size: cache \[16, 16\] vs run \[32, 32\].*python scripts/video_cache\.py .*video_latent_cache=generate"),
        # --- videos
        Case("video-write-float-frames", write_video(np.zeros((2, 8, 8, 3), f32)), ValueError,
             r"frames dtype must be uint8, got float32; convert with \(np\.clip\(x, 0, 1\) \* 255\)\.astype\(np\.uint8\)"),
        Case("video-write-bad-shape", write_video([np.zeros((8, 8), np.uint8)]), ValueError,
             r"frame 0: shape must be \(H, W, 3\), got \(8, 8\); pass RGB images"),
        Case("video-read-missing", read_video(None), FileNotFoundError,
             r"no such video: \S+v\.mp4; check the path.*EVALUATION\.eval_save_video=true"),
        Case("video-read-corrupt", read_video(b"not a video"), ValueError,
             r"unreadable video: \S+v\.mp4 \(\w+\); the file is not an mp4 or is truncated: record it again"),
        # --- training and datasets: no silent wrong results (issue 15)
        Case("train-save-every-zero", call("training.config:TrainConfig", save_every=0), ValueError,
             r"^save_every=0 must be an integer >= 1: set save_every=500"),
        Case("train-log-every-zero", call("training.config:TrainConfig", log_every=0), ValueError,
             r"^log_every=0 must be an integer >= 1: set log_every=10"),
        Case("train-keep-checkpoints-zero", call("training.config:TrainConfig", keep_checkpoints=0), ValueError,
             r"^keep_checkpoints=0 must be an integer >= 1: set keep_checkpoints=2"),
        Case("train-resume-mismatch", resume_mismatch, ResumeMismatchError,
             r"holds checkpoints trained with other settings, batch_size=8 in train_config\.json, batch_size=4 now: "
             r".*Use another output_dir, or resume=false to start over .*or allow_resume_mismatch=true"),
        Case("train-disk-full", train_disk_full, DiskFullError,
             r"^no space left on device writing \S+/checkpoints/step-00000000 .*: free space or set output_dir="),
        Case("dataset-fps-mismatch", dataset_with_fps(info_rate=80), DatasetError,
             r"meta/info\.json has fps=80 but features\['observation\.images\.corner'\]\.info\['video\.fps'\]=20; "
             r"set fps in meta/info\.json to the rate the data was recorded at"),
        Case("dataset-video-fps-mismatch", dataset_with_fps(video_rate=80), DatasetError,
             r"video file videos/observation\.images\.wrist/chunk-000/file-000\.mp4 plays at 80 fps but "
             r"meta/info\.json has fps=20; set fps in meta/info\.json"),
        Case("dataset-action-not-finite", damaged_dataset(lambda r: _edit_column(
            r / "data/chunk-000/file-000.parquet", "action", lambda rows: [[float("nan")] * len(rows[0])] + rows[1:])),
             DatasetError, r"episode 0 frame 0: action is not finite \(\[nan, nan, nan\]; 1 such frames in all\); training "
             r"would learn from it: fix or drop it where the dataset was made, then convert it again"),
        Case("dataset-task-empty", damaged_dataset(lambda r: _edit_column(r / "meta/tasks.parquet", "task",
                                                                          lambda tasks: [""] * len(tasks))),
             DatasetError, r"meta/tasks\.parquet: task_index 0 is '', not an instruction: every task must be a non-empty "
                           r"string \(training conditions on it\)"),
        Case("dataset-path-outside", damaged_dataset(lambda r: _edit_info(r, data_path="../{chunk_index}/{file_index}.parquet")),
             DatasetError, r"meta/info\.json's data_path '\.\./{chunk_index}/{file_index}\.parquet' names '\.\./0/0\.parquet', "
                           r"which is outside the dataset; a dataset's files must lie under its root"),
        Case("dataset-orientation-unknown", dataset_of_unknown_orientation, DatasetError,
             r"ds: meta/info\.json does not say how observation\.images\.corner's frames are turned \(a dataset from "
             r"elsewhere; .*: state it by converting the dataset: python -m training\.datasets convert \S+/ds \S+/ds-declared "
             r"--frames upright\|mirrored\|upside_down\|rotated_180$"),
        Case("dataset-orientation-invalid", damaged_dataset(lambda r: _recorded_orientation(r, "sideways", "wam_gym")),
             DatasetError, r"meta/info\.json's features\['observation\.images\.corner'\]\.info\['orientation'\] is "
                           r"'sideways', not a frame orientation: set it to one of \['mirrored', 'rotated_180', "
                           r"'upright', 'upside_down'\]"),
        Case("dataset-convert-busy", convert_into_a_busy_destination, TargetBusyError,
             r"dst is being written by another writer \(pid \d+ on \S+, since \S+: .*\); wait for it to finish or stop "
             r"it, or write to another path"),
        Case("dataset-video-timeline-drift", drifting_dataset, DatasetError,
             r"file-000\.mp4: episode 1 frame 0 \(frame 4 of the file\) should be at 0\.2000 s, the video has 0\.2200 s "
             r"there: its timeline drifts .*repair the dataset with: python -m training\.datasets convert \S+ \S+-exact"),
    ]


# Each module of tests/bad_inputs/ holds one area's cases(), in the order of their names.
AREAS = tuple(importlib.import_module(f"tests.bad_inputs.{m.name}")
              for m in sorted(pkgutil.iter_modules([str(ROOT / "tests/bad_inputs")]), key=lambda m: m.name))
CASES = cases() + [case for area in AREAS for case in area.cases()]
CLI_IN_PROCESS = {"wam_gym.envs"}  # argparse CLIs cheap enough to call in this process


def is_subprocess(case: Case) -> bool:
    return isinstance(case.trigger, tuple) and case.trigger[0] not in CLI_IN_PROCESS


def marks(case: Case) -> list:
    out = []
    if case.needs and importlib.util.find_spec(case.needs) is None:
        out.append(pytest.mark.skip(reason=f"needs {case.needs}"))
    if case.absent and importlib.util.find_spec(case.absent) is not None:
        out.append(pytest.mark.skip(reason=f"{case.absent} is installed here"))
    return out


# ----------------------------------------------------------------------------- running the cases
@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Shared:
    return Shared(tmp_path_factory.mktemp("shared"))


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict[str, SimpleNamespace]:
    """Every subprocess case at once, each in its own empty working directory."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(OMP_NUM_THREADS="1", MUJOCO_GL=env.get("MUJOCO_GL", "egl"))
    started = {}
    for case in filter(is_subprocess, CASES):
        cwd = tmp_path_factory.mktemp(case.id)
        started[case.id] = (cwd, subprocess.Popen([sys.executable, "-m", *case.trigger], cwd=cwd, env=env, text=True,
                                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    runs = {}
    for case_id, (cwd, proc) in started.items():
        _, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
        runs[case_id] = SimpleNamespace(cwd=cwd, returncode=proc.returncode, stderr=stderr)
    return runs


def run_in_process_cli(argv: tuple[str, ...]) -> SimpleNamespace:
    module = importlib.import_module(argv[0])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        returncode = module.main(list(argv[1:]))
    return SimpleNamespace(cwd=None, returncode=returncode, stderr=err.getvalue())


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=marks(c)) for c in CASES])
def test_bad_input_names_the_fix(case: Case, request, tmp_path, monkeypatch, shared):
    if isinstance(case.trigger, tuple):
        run = request.getfixturevalue("cli_runs")[case.id] if is_subprocess(case) else run_in_process_cli(case.trigger)
        assert run.returncode == case.error, run.stderr[-3000:]
        assert "Traceback" not in run.stderr, run.stderr[-3000:]
        last = run.stderr.strip().splitlines()[-1]
        assert re.search(case.fix, last), f"last stderr line: {last!r}"
        assert [line for line in run.stderr.splitlines() if line.startswith("error:")] == [last]
        if run.cwd is not None:
            assert not list(run.cwd.iterdir()), "a refused command wrote files"
        return
    with pytest.raises(BaseException) as info:
        case.trigger(Ctx(tmp_path, monkeypatch, shared))
    assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
    first = str(info.value).strip().splitlines()[0]
    assert re.search(case.fix, first), f"first line: {first!r}"


def test_ids_are_unique_and_cli_cases_few():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 24
    assert sum(map(is_subprocess, CASES)) <= 4  # each costs seconds of imports
