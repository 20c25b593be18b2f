import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
# torch's OpenMP threads wait for work by spinning: beside any other busy process (a model worker, an actor, make
# test's pip installs) each parallel region then stalls. Waiting asleep took tests/test_action_loss_mask.py and
# tests/test_wam_model.py from 188 s to 101 s next to one busy process, 80 s to 58 s on a quieter machine. Set here,
# before torch loads, so every test process and the commands they start wait asleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py imported as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_python(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (as a user would), from outside the repo."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd="/tmp"
    )


@pytest.fixture
def fresh_python():
    return run_python


def check_registered_env(env_id: str, skip_render_check: bool = False, **kwargs) -> None:
    """Gymnasium's env checker on ``gymnasium.make(env_id, **kwargs)``: the suite tests' shared body."""
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make(env_id, **kwargs)
    try:
        check_env(env.unwrapped, skip_render_check=skip_render_check)
    finally:
        env.close()


def made_without_importing_envs(env_id: str, camera: str, **kwargs) -> str:
    """``gymnasium.make(env_id, **kwargs)`` and a reset in a fresh interpreter that never imports ``envs`` (the
    entry point does): prints ``camera``'s frame shape, the reset's info keys and whether ``envs`` got imported."""
    out = run_python(
        "import sys, gymnasium\n"
        f"env = gymnasium.make({env_id!r}, **{kwargs!r})\n"
        "obs, info = env.reset(seed=0)\n"
        f"print(obs['pixels'][{camera!r}].shape, sorted(info), 'envs' in sys.modules)\n"
        "env.close()\n"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture
def train_two_steps(tmp_path):
    """``train_two_steps(dataset_root, camera)``: python -m training's loop, two steps of the tiny WAM on
    one camera of the dataset; returns the final checkpoint (a dataset layout is usable end to end)."""

    def train(root, camera: str):
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from training import loop
        from training.config import register_configs

        register_configs()
        conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training", "conf")
        overrides = ["task=metaworld_tiny", f"dataset.root={root}", f"model.cameras=[{camera}]", "model.image_size=[32,32]",
                     "batch_size=2", "max_steps=2", "save_every=2", "num_workers=0", f"output_dir={tmp_path / 'run'}"]
        with initialize_config_dir(config_dir=conf, version_base=None):
            return loop.train(OmegaConf.to_object(compose("train", overrides=overrides)))

    return train


@pytest.fixture
def no_shm_build(monkeypatch):
    """Stub DeepSpeed's shm all-reduce op build (only inference_all_reduce uses it; it is minutes
    of C++ on 2 cores) and restore the env vars DeepSpeed's setup sets."""
    import importlib

    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")  # `deepspeed.comm.torch` is shadowed by torch
    assert hasattr(ds_comm_torch, "build_shm_op"), "DeepSpeed moved build_shm_op: update this fixture"
    monkeypatch.setattr(ds_comm_torch, "build_shm_op", lambda: None)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def fingerprint_cache(tmp_path_factory):
    """The content-fingerprint cache of this session's runs (and their subprocesses), not the user's
    ~/.cache/wam_gym."""
    os.environ["WAM_GYM_CACHE"] = str(tmp_path_factory.mktemp("wam_gym_cache"))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A tiny WAM checkpoint with random weights (a few MB; fast on a CPU), and identity
    statistics (state mean 0 / std 1, actions in [-1, 1]) as its dataset_stats.json: evaluation
    refuses a checkpoint without statistics."""

    from agents.wam import Normalizer, build_model, preset, save_pretrained
    from agents.wam.normalization import unit_stats

    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    model = build_model(preset("tiny"))
    save_pretrained(model, path)
    Normalizer.from_stats(unit_stats(model.config.state_dim, model.config.action_dim)).save(path / "dataset_stats.json")
    return path


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """Meta-World reach demos, 1 episode x 12 steps at 32x32: 12 clips, 3 batches of 4 per epoch,
    so a few training steps cross epochs."""
    from training.collect import collect

    root = tmp_path_factory.mktemp("data") / "small"
    assert collect(["wam_gym/MetaWorld-reach-v3"], episodes=1, output=root, image_size=32, max_steps=12,
                   log=None)["frames"] == 12
    return root


@pytest.fixture(scope="session")
def openpi_python() -> Path:
    """The real openpi-client in a venv of its own (.venv-openpi: it pins numpy<2); made once, then reused."""
    venv = Path(__file__).resolve().parents[1] / ".venv-openpi"
    python = venv / "bin" / "python"
    if not python.exists() or subprocess.run([python, "-c", "import openpi_client.websocket_client_policy"]).returncode:
        subprocess.run([venv.parent / "scripts" / "install_openpi_client.sh", venv], check=True)
    return python
