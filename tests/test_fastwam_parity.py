"""FastWAM in wam_gym computes what FastWAM's own code computes (yuantianyuan01/FastWAM).

tests/fixtures/fastwam/ was made by scripts/fastwam_reference.py, which runs THEIR code (in a venv of its
own, never importing ours) at a tiny size with seeded random weights in fp32 on the CPU: the weights in
their checkpoint layout, the inputs, and their outputs. Here the weights go through our loader, written
back as the torch.save dict their release is, and our model reproduces their outputs:

* one joint denoiser call (batch 2, per-row timesteps): the future frames' video velocity and the actions';
* one action-only call (our cached current-frame keys/values against their full recompute);
* their seeded inference, action-only (infer_action) and joint (infer_joint), after 1 and after 4 steps:
  the action chunk and the denoised video latents, from the noise their seed draws;
* their schedules (inference grids per modality, training-loss weights);
* their training loss on a clip with padded actions and frames, from the noise and timesteps it drew
  (which a generator seeded like their global one draws again).

Tolerance: |ours - theirs| <= 1e-5 + 1e-5 |theirs| on outputs of about unit scale; measured (torch 2.13,
diffusers 0.42, CPU) at most 5e-7. The rest of the gap budget is for other kernels (fp64 RoPE and
timestep features on their side, fp32 on ours, SDPA on other CPUs).

At the released size, ``preset("fastwam")`` built on the meta device has exactly their checkpoint's
keys (mapped), shapes and parameter count (fixture's full_size.json, built from their code the same way).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agents.wam.fastwam.checkpoint import (
    CheckpointMismatchError,
    MissingCheckpointError,
    convert_their_checkpoint,
    export_their_checkpoint,
    from_their_checkpoint,
    load_fastwam,
    read_our_checkpoint,
    read_their_checkpoint,
    save_fastwam,
    their_state,
    write_their_checkpoint,
)
from agents.wam.fastwam.config import FastWAMConfig, FlowScheduleConfig, preset
from agents.wam.fastwam.layout import to_ours, to_theirs
from agents.wam.fastwam.mask import block_mask
from agents.wam.fastwam.model import CallCache, FastWAM
from agents.wam.fastwam.objective import Draws, draw, flow_matching_loss
from agents.wam.fastwam.sampling import sample_actions, sample_joint, their_noise
from agents.wam.fastwam.schedule import FlowSchedule
from tests.conftest import load_script

FIXTURE = Path(__file__).parent / "fixtures" / "fastwam"
TOL = {"atol": 1e-5, "rtol": 1e-5}
FIXTURE_CONFIG = json.loads((FIXTURE / "config.json").read_text())


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "io.safetensors"))


@pytest.fixture(scope="module")
def their_weights() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "weights.safetensors"))


@pytest.fixture(scope="module")
def their_pt(tmp_path_factory, their_weights) -> Path:
    """The fixture's weights as the file FastWAM releases: a torch.save dict of state dicts."""
    path = tmp_path_factory.mktemp("their") / "fastwam_tiny.pt"
    return write_their_checkpoint(their_weights, path, step=0)


@pytest.fixture(scope="module")
def model(their_pt) -> FastWAM:
    return from_their_checkpoint(their_pt, preset("fastwam_tiny"))


def test_the_tiny_preset_is_the_fixture_size():
    cfg, video, action = preset("fastwam_tiny"), FIXTURE_CONFIG["video_dit_config"], FIXTURE_CONFIG["action_dit_config"]
    bb = cfg.backbone
    assert (bb.num_layers, bb.num_attention_heads, bb.attention_head_dim, bb.num_attention_heads * bb.attention_head_dim) == (
        video["num_layers"], video["num_heads"], video["attn_head_dim"], video["hidden_dim"])
    assert (bb.in_channels, bb.ffn_dim, bb.text_dim, bb.freq_dim) == (video["in_dim"], video["ffn_dim"], video["text_dim"],
                                                                      video["freq_dim"])
    assert (cfg.action_expert.dim, cfg.action_expert.ffn_dim, cfg.action_expert.freq_dim, cfg.action_dim) == (
        action["hidden_dim"], action["ffn_dim"], action["freq_dim"], action["action_dim"])
    assert (cfg.state_dim, cfg.text_encoder.max_length, cfg.action_horizon) == (
        FIXTURE_CONFIG["proprio_dim"], FIXTURE_CONFIG["text_tokens"], FIXTURE_CONFIG["action_horizon"])
    assert (cfg.video_schedule.infer_shift, cfg.action_schedule.infer_shift) == (
        FIXTURE_CONFIG["video_shift"], FIXTURE_CONFIG["action_shift"])
    assert (cfg.latent_frames, *cfg.latent_size) == tuple(FIXTURE_CONFIG["latent_shape"][1:])


def test_one_joint_call_matches_theirs(model, io):
    with torch.no_grad():
        video, actions = model(io["call.latents"], io["call.timestep_video"], io["call.actions"],
                               io["call.timestep_action"], io["call.text"], io["call.proprio"])
    # Their head also outputs the current frame, whose velocity nothing uses (inference overwrites it).
    torch.testing.assert_close(video, io["call.video_velocity"][:, :, 1:], **TOL)
    torch.testing.assert_close(actions, io["call.action_velocity"], **TOL)


def test_action_only_call_with_cached_video_matches_their_full_recompute(model, io):
    current = io["call.latents"][:, :, :1]
    cache = CallCache()
    with torch.no_grad():
        first = model.action_velocity(current, io["call.actions"], io["call.timestep_action"], io["call.text"],
                                      io["call.proprio"], cache)
        again = model.action_velocity(current, io["call.actions"], io["call.timestep_action"], io["call.text"],
                                      io["call.proprio"], cache)  # from the cache
    assert cache.video_kv is not None and len(cache.video_kv) == model.config.backbone.num_layers
    torch.testing.assert_close(first, io["call.action_only_velocity"], **TOL)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


def test_the_noise_is_what_their_seed_draws(io):
    seed = FIXTURE_CONFIG["seed"]
    torch.testing.assert_close(their_noise(seed, tuple(io["infer.action_noise"].shape)), io["infer.action_noise"], atol=0, rtol=0)
    torch.testing.assert_close(their_noise(seed, tuple(io["infer.video_noise"].shape)), io["infer.video_noise"], atol=0, rtol=0)


@pytest.mark.parametrize("steps", FIXTURE_CONFIG["steps"])
def test_seeded_action_only_inference_matches_theirs(model, io, steps):
    actions = sample_actions(model, io["infer.first_frame"], io["infer.text"], io["infer.proprio"],
                             io["infer.action_noise"], steps)
    torch.testing.assert_close(actions[0], io[f"infer.action_only.{steps}"], **TOL)


@pytest.mark.parametrize("steps", FIXTURE_CONFIG["steps"])
def test_seeded_joint_inference_matches_theirs(model, io, steps):
    future, actions = sample_joint(model, io["infer.first_frame"], io["infer.text"], io["infer.proprio"],
                                   io["infer.video_noise"][:, :, 1:], io["infer.action_noise"], steps)
    theirs = io[f"infer.joint.video.{steps}"]
    torch.testing.assert_close(theirs[:, :, :1], io["infer.first_frame"], atol=0, rtol=0)  # they keep the current frame
    torch.testing.assert_close(future, theirs[:, :, 1:], **TOL)
    torch.testing.assert_close(actions[0], io[f"infer.joint.action.{steps}"], **TOL)


@pytest.mark.parametrize("modality", ["video", "action"])
def test_schedules_match_theirs(io, modality):
    shift = FIXTURE_CONFIG[f"{modality}_shift"]
    schedule = FlowSchedule(FlowScheduleConfig(train_shift=shift, infer_shift=shift))
    for steps in (*FIXTURE_CONFIG["steps"], 10):
        timesteps, deltas = schedule.inference(steps)
        torch.testing.assert_close(timesteps, io[f"schedule.{modality}.timesteps.{steps}"], atol=0, rtol=0)
        torch.testing.assert_close(deltas, io[f"schedule.{modality}.deltas.{steps}"], atol=0, rtol=0)
    weight = schedule.training_weight(io["schedule.training_timesteps"])
    torch.testing.assert_close(weight, io[f"schedule.{modality}.training_weight"], **TOL)


def _loss_inputs(io):
    return (io["loss.latents"], io["loss.actions"], io["loss.proprio"][:, 0], io["loss.text"])


def _loss_pads(io):
    return {"action_is_pad": io["loss.action_is_pad"].bool(), "image_is_pad": io["loss.image_is_pad"].bool()}


def test_training_loss_matches_theirs(model, io):
    theirs = Draws(io["loss.video_noise"], io["loss.video_timestep"], io["loss.action_noise"], io["loss.action_timestep"])
    # Their training_loss draws from torch's global generator; one of ours seeded alike draws the same.
    again = draw(model, io["loss.latents"], io["loss.actions"], torch.Generator().manual_seed(FIXTURE_CONFIG["seed"] + 1))
    for ours, their in zip(vars(again).values(), vars(theirs).values()):
        torch.testing.assert_close(ours, their, atol=0, rtol=0)
    with torch.no_grad():
        loss = flow_matching_loss(model, *_loss_inputs(io), draws=theirs, **_loss_pads(io))
    for key, name in (("loss", "total"), ("video", "video"), ("action", "action")):
        torch.testing.assert_close(loss[key].reshape(1), io[f"loss.{name}"], **TOL)


def test_training_loss_reaches_every_weight(io):
    model = FastWAM(preset("fastwam_tiny"))
    flow_matching_loss(model, *_loss_inputs(io), generator=torch.Generator().manual_seed(0), **_loss_pads(io))["loss"].backward()
    for part in (model.transformer, model.action_expert, model.proprio_encoder):
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in part.parameters())


def test_block_mask_is_theirs():
    # 2 frames of 2 tokens, 3 actions: the current frame sees itself, the future all video, actions the
    # current frame and each other.
    expected = torch.tensor([
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 1],
        [1, 1, 0, 0, 1, 1, 1],
        [1, 1, 0, 0, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(block_mask(4, 2, 3), expected)


# ----------------------------------------------------------------------------- loading, strictly
def test_their_file_round_trips_exactly(model, their_weights, tmp_path):
    assert set(their_state(model)) == set(their_weights)
    path = export_their_checkpoint(model, tmp_path / "export.pt", step=7)
    back = read_their_checkpoint(path)
    assert set(back) == set(their_weights)
    assert all(torch.equal(back[k], their_weights[k]) for k in their_weights)
    payload = torch.load(path, map_location="cpu", weights_only=True)
    assert set(payload) == {"mot", "proprio_encoder", "step", "torch_dtype"} and payload["step"] == 7


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_a_key_that_does_not_fit_is_named(model, their_weights, change):
    flat = dict(their_weights)
    key = "mot.mixtures.action.blocks.1.cross_attn.norm_k.weight"
    if change == "missing":
        del flat[key]
        name = key
    elif change == "unexpected":
        name = "mot.mixtures.video.blocks.0.cross_attn.k_img.weight"  # an image-conditioned Wan's key
        flat[name] = torch.zeros(64, 64)
    else:
        flat[key] = torch.zeros(3)
        name = key
    before = {k: v.clone() for k, v in model.action_expert.state_dict().items()}
    from agents.wam.fastwam.checkpoint import load_their_state

    with pytest.raises(CheckpointMismatchError, match=name.replace(".", r"\.")):
        load_their_state(model, flat)
    assert all(torch.equal(before[k], v) for k, v in model.action_expert.state_dict().items())  # nothing loaded


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_file_that_needs_more_than_tensors_is_refused_unrun(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"mot": {"x": torch.zeros(1)}, "payload": _RunsCode(marker)}, path)
    with pytest.raises(MissingCheckpointError, match="not unpickled"):
        read_their_checkpoint(path)
    assert not marker.exists()


def test_a_file_without_mot_is_refused(tmp_path):
    torch.save({"dit": {"x": torch.zeros(1)}}, tmp_path / "legacy.pt")
    with pytest.raises(MissingCheckpointError, match="'mot'"):
        read_their_checkpoint(tmp_path / "legacy.pt")


def test_our_directory_round_trips(model, their_pt, their_weights, io, tmp_path):
    convert_their_checkpoint(their_pt, tmp_path / "converted", preset("fastwam_tiny"))
    files = {p.suffix for p in (tmp_path / "converted").rglob("*") if p.is_file()}
    assert files <= {".json", ".safetensors"}  # nothing pickled
    back = read_our_checkpoint(tmp_path / "converted")
    assert set(back) == set(their_weights) and all(torch.equal(back[k], their_weights[k]) for k in back)
    save_fastwam(model, tmp_path / "saved", encoders=True)
    loaded = load_fastwam(tmp_path / "saved")
    args = (io["call.latents"], io["call.timestep_video"], io["call.actions"], io["call.timestep_action"],
            io["call.text"], io["call.proprio"])
    with torch.no_grad():
        for ours, theirs in zip(loaded(*args), model(*args)):
            torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    assert isinstance(loaded.config, FastWAMConfig) and loaded.config == model.config


def test_encoders_come_from_a_wan_folder(model, their_pt, tmp_path):
    # Their file holds the denoiser only; the VAE, UMT5 and tokenizer come from a diffusers folder of
    # Wan2.2-TI2V-5B (here: a saved tiny model's, laid out the same way).
    save_fastwam(model, tmp_path / "wan", encoders=True)
    for source in (from_their_checkpoint(their_pt, preset("fastwam_tiny"), encoders_from=tmp_path / "wan"),
                   load_fastwam(convert_their_checkpoint(their_pt, tmp_path / "ours", preset("fastwam_tiny")),
                                encoders_from=tmp_path / "wan")):
        for name in ("vae", "text_encoder"):
            mine, original = getattr(source, name).state_dict(), getattr(model, name).state_dict()
            assert mine.keys() == original.keys() and all(torch.equal(mine[k], original[k]) for k in mine)
        assert source.tokenizer("a bowl").input_ids == model.tokenizer("a bowl").input_ids


def test_the_conversion_script(their_pt, tmp_path, capsys):
    script = load_script("convert_fastwam_checkpoint")
    assert script.main(["to-ours", str(their_pt), str(tmp_path / "ours"), "--preset", "fastwam_tiny"]) == 0
    assert script.main(["to-theirs", str(tmp_path / "ours"), str(tmp_path / "back.pt"), "--step", "3"]) == 0
    back, original = read_their_checkpoint(tmp_path / "back.pt"), read_their_checkpoint(their_pt)
    assert set(back) == set(original) and all(torch.equal(back[k], original[k]) for k in back)
    capsys.readouterr()
    assert script.main(["inspect", str(their_pt)]) == 0
    out = capsys.readouterr().out
    assert "139 (137 mot, 2 proprio_encoder)" in out and "video expert: 2 layers, width 64, 6 latent channels" in out
    assert "action DiT: 2 layers, width 48, actions of 7" in out and "proprio: 8 -> one text token of 32" in out


# ----------------------------------------------------------------------------- the released size
def test_the_released_size_has_their_keys_shapes_and_parameter_count():
    full = json.loads((FIXTURE / "full_size.json").read_text())
    theirs = {f"{group}.{key}": tuple(shape) for group, keys in full["keys"].items() for key, shape in keys.items()}
    with torch.device("meta"):
        model = FastWAM(preset("fastwam"))
    ours = {key: tuple(value.shape) for key, value in their_state(model).items()}
    assert set(ours) == set(theirs), (sorted(set(ours) - set(theirs))[:5], sorted(set(theirs) - set(ours))[:5])
    assert ours == theirs
    assert len(theirs) == 1651  # 1,649 MoT keys + the proprio encoder's 2
    denoiser = sum(p.numel() for m in (model.transformer, model.action_expert, model.proprio_encoder) for p in m.parameters())
    assert denoiser == sum(full["parameters"].values()) == 6_020_710_599
    # Every key maps one to one and back.
    assert all(to_theirs(to_ours(key)) == key for key in theirs)
