"""``python -m training task=libero_lingbot_va_lora``: LingBot-VA fine-tuned with LoRA under DeepSpeed ZeRO-2 from a
release folder, and the result reloaded in both layouts.

On this CPU the tiny release of scripts/tiny_lingbot_va_release.py stands in for theirs (``model=
lingbot_va_libero_tiny``: the same code at 2 layers, under the lingbot_va_libero convention), and a small dataset in
our LeRobot layout with LIBERO's cameras and 7-d actions stands in for collected LIBERO demos. The run's checkpoint
(a) is taken by wam_gym's evaluation (preflight under protocol=lingbot_va_libero, the model worker's
policy) and (b) exported to their release layout (adapters merged) loads through load_release; both act exactly as
the model the run ended with, in memory (fp32, seeded; within 1e-5).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import load_script
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file

from agents.episode_memory import EPISODE, SEEN
from agents.wam.interface import LossInputs, Objective
from agents.wam.lingbot_va.config import preset
from agents.wam.lingbot_va.inputs import convention
from agents.wam.lingbot_va.policy import LingBotVAPolicy
from agents.wam.lingbot_va.trained import build_lingbot_va, load_lingbot_va
from training import loop
from training.config import register_configs
from training.data.clips import ClipDataset
from training.data.lerobot.writer import DatasetWriter
from wam_gym.eval import preflight, protocols
from wam_gym.policies import policy_factory

CONF = str(Path(__file__).resolve().parents[1] / "training" / "conf")
CAMERAS = ("agentview", "robot0_eye_in_hand")
LIBERO = convention("lingbot_va_libero")
TOL = dict(atol=1e-5, rtol=1e-5)


def libero_like(root: Path, episodes: int = 2, steps: int = 20) -> Path:
    """Demos in our LeRobot layout shaped as LIBERO's: two 128 px cameras, 8-d state, 7-d actions in its range."""
    rng = np.random.default_rng(0)
    q01, q99 = np.asarray(LIBERO.q01), np.asarray(LIBERO.q99)
    with DatasetWriter(root, 20, CAMERAS, suites=("libero",)) as writer:
        for episode in range(episodes):
            for step in range(steps):
                pixels = {c: np.full((128, 128, 3), (40 * episode + 9 * step + 60 * i) % 256, np.uint8)
                          for i, c in enumerate(CAMERAS)}
                action = q01 + rng.random(7) * (q99 - q01)
                writer.add_frame(pixels, rng.standard_normal(8).astype(np.float32), action.astype(np.float32),
                                 "put the bowl on the plate")
            writer.save_episode()
    return root


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return load_script("tiny_lingbot_va_release").make(tmp_path_factory.mktemp("lingbot") / "release")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return libero_like(tmp_path_factory.mktemp("data") / "libero")


@pytest.fixture(scope="module")
def run(release, dataset, tmp_path_factory):
    """Three LoRA steps under ZeRO-2 (python -m training's loop, composed as the CLI composes it); the model the run
    ended with is kept as it was handed to the checkpoint writer."""
    import importlib
    import os

    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")  # as conftest's no_shm_build, module-wide
    build_shm_op, saved = ds_comm_torch.build_shm_op, dict(os.environ)
    ds_comm_torch.build_shm_op = lambda: None
    out, kept, save_final = tmp_path_factory.mktemp("lora") / "run", {}, loop.save_final

    def keep(module, final, *args, **kwargs):
        kept["model"] = module
        return save_final(module, final, *args, **kwargs)

    loop.save_final = keep
    try:
        register_configs()
        with initialize_config_dir(config_dir=CONF, version_base=None):
            cfg = compose("train", overrides=[
                "task=libero_lingbot_va_lora", "model=lingbot_va_libero_tiny", f"model.pretrained_path={release}",
                f"dataset.root={dataset}", "mixed_precision=fp32", "gradient_accumulation_steps=1", "max_steps=3",
                "save_every=3", "num_workers=0", "log_every=1", "lora.rank=4", "lora.alpha=4.0", "lr=1e-2",
                "warmup_steps=0", f"output_dir={out}"])
        final = loop.train(OmegaConf.to_object(cfg))
    finally:
        loop.save_final, ds_comm_torch.build_shm_op = save_final, build_shm_op
        os.environ.clear()
        os.environ.update(saved)
    return SimpleNamespace(final=final, out=out, model=kept["model"].eval())


def test_the_run_trains_only_the_adapters_under_zero2(run, release):
    state = json.loads((run.out / "checkpoints" / "step-00000003" / "trainer_state.json").read_text())
    assert state["backend"] == "deepspeed" and state["zero_stage"] == 2 and state["global_step"] == 3
    data = json.loads((run.final / "wam_config.json").read_text())
    assert data["architecture"] == "lingbot_va" and data["inputs"] == {"name": "lingbot_va_libero"}
    for part in ("transformer/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                 "text_encoder/model.safetensors"):
        base, trained = load_file(str(release / part)), load_file(str(run.final / part))
        assert base.keys() == trained.keys() and all(torch.equal(base[k], trained[k]) for k in base), part
    adapters = load_file(str(run.final / "lora" / "video" / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapters.items())  # peft starts B at zero


def test_the_steps_change_the_loss(run, release, dataset):
    config = preset("lingbot_va_libero_tiny", pretrained_path=str(release))
    clips = ClipDataset(dataset, cameras=CAMERAS, image_size=(128, 128), action_horizon=config.action_horizon,
                        num_future_frames=config.num_future_frames, stats_normalize=False, convention=config)
    sample = clips[5]
    before, after = build_lingbot_va(config), load_lingbot_va(run.final)
    losses = []
    for model in (before, after):
        batch = LossInputs(latents=model.encode_video(sample["video"][None]), actions=sample["actions"][None],
                           state=sample["state"][None], text=model.encode_prompt([sample["instruction"]]))
        with torch.no_grad():
            losses.append(model.loss(batch, Objective(), torch.Generator().manual_seed(3))["loss"].item())
    assert np.isfinite(losses).all() and abs(losses[0] - losses[1]) > 1e-4


def _episode(policy: LingBotVAPolicy) -> np.ndarray:
    """Two chunks of one episode (the second after the frames of the first's 12 actions), seeded."""
    frames = torch.Generator().manual_seed(0)
    seen = {c: torch.randint(0, 256, (13, 128, 128, 3), generator=frames, dtype=torch.uint8).numpy() for c in CAMERAS}

    def call(step: int, fed: slice) -> np.ndarray:
        obs = {"pixels": {c: seen[c][step][None] for c in CAMERAS}, "state": np.zeros((1, 8), np.float32),
               "instruction": ("put the bowl on the plate",), EPISODE: np.array([7]),
               SEEN: {c: seen[c][fed][None] for c in CAMERAS}}
        return policy.predict(obs, noise_seeds=[11]).actions[0]

    return np.concatenate([call(0, slice(0, 0)), call(12, slice(1, 13))])


def test_both_layouts_reload_and_act_as_the_trained_model(run, tmp_path):
    model = run.model
    in_memory = _episode(LingBotVAPolicy(model.transformer, model.vae, model.prompt_encoder(), model.config, LIBERO))
    assert in_memory.shape == (12 + 16, 7)

    # (a) wam_gym's evaluation takes the checkpoint under the protocol of its convention
    evaluation = SimpleNamespace(agent="wam", dataset_stats_path=None, video_mode=None, action_horizon=None)
    protocol = protocols.named("lingbot_va_libero")
    protocols.check_checkpoint_inputs(protocol, str(run.final))
    root, facts, stats = preflight.wam_checkpoint(str(run.final), evaluation, protocol)
    assert stats is None and (facts.cameras, facts.image_size, facts.action_horizon) == (CAMERAS, (128, 128), 16)
    served = policy_factory(evaluation, 0, root, stats, protocol.model_inputs)("cpu")
    np.testing.assert_allclose(_episode(served), in_memory, **TOL)

    # (b) their layout: the adapters merged into the weights, read back by load_release
    folder = load_script("export_lingbot_va_release").main([str(run.final), str(tmp_path / "release")])
    assert not (folder / "wam_config.json").exists() and not (folder / "lora").exists()
    np.testing.assert_allclose(_episode(LingBotVAPolicy.from_release(folder, "lingbot_va_libero")), in_memory, **TOL)


@pytest.mark.parametrize("protocol, message", [
    (None, r"trained under the input convention lingbot_va_libero, whose benchmark side is its protocol's: evaluate "
           r"it with protocol=lingbot_va_libero$"),
    ("lingbot_va_robotwin", r"feeds the model by lingbot_va_robotwin, and ckpt=\S+ was trained under "
                            r"lingbot_va_libero: evaluate it under the protocol of its convention$"),
])
def test_evaluation_refuses_it_without_its_protocol(run, protocol, message):
    evaluation = SimpleNamespace(agent="wam", dataset_stats_path=None, video_mode=None, action_horizon=None)
    with pytest.raises(ValueError, match=message):
        preflight.wam_checkpoint(str(run.final), evaluation, protocols.named(protocol))


def _composed(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return OmegaConf.to_object(compose("train", overrides=["task=libero_lingbot_va_lora", *overrides]))


@pytest.mark.parametrize("overrides, message", [
    (["model.attn_window=10"], r"^model\.attn_window=10: the input convention lingbot_va_libero owns it \(30\); drop "
                               r"the override$"),
    (["model=lingbot_va_tiny"], r"names no input convention \(model\.inputs\), so no statistics normalise its actions: "
                                r"train model=lingbot_va_libero_tiny or model=lingbot_va$"),
    ([], r"^model=lingbot_va fine-tunes their released weights: set model\.pretrained_path=<their release folder>"),
    (["model=lingbot_va_libero_tiny", "lora.experts=[video,action]"],
     r"^lora\.experts=\['video', 'action'\]: a LingBotVA has no action expert; set lora\.experts=\['video'\]$"),
])
def test_bad_recipes_are_refused_in_one_line(overrides, message):
    from agents.wam.lora import add_lora

    with pytest.raises((ValueError, FileNotFoundError), match=message):
        cfg = _composed(*overrides)
        cfg.model.convention()
        model = build_lingbot_va(cfg.model)
        add_lora(model, cfg.lora)
