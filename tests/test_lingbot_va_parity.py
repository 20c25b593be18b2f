"""LingBot-VA in wam_gym computes what LingBot-VA's own code computes (Robbyant/lingbot-va).

tests/fixtures/lingbot_va/ was made by scripts/lingbot_va_reference.py, which runs THEIR code (their
WanTransformer3DModel and VA_Server, outside the project, never importing ours) at a tiny size with seeded
random weights in fp32 on the CPU: their transformer/ folder as a release holds it, a tiny diffusers
AutoencoderKLWan, the inputs and their outputs. Here their folder goes through our loader and our sampler
runs the same episodes from the same inputs:

* single transformer calls: the video stream and the action stream (batch 2, per-row timesteps and
  positions, no cache), and an action call attending to a kept video write;
* their schedules (video shift 5, action shift 1; the tiny step counts and LIBERO's 20 / 50);
* whole episodes as their LIBERO client drives their server: the first chunk (frame 0 held to the first
  observation, its actions to zero), then chunks after feedback of the key frames (through the streaming
  VAE, whose causal state runs on across calls) and of the executed chunk, through the KV cache: episode ``a``
  (guidance 5 / 1) runs 5 chunks, past the attention window, so temporary writes evict the oldest kept
  ones; ``b`` (guidance 2 / 3: both streams guided) and ``c`` (no guidance: one row) start after resets.
  Per chunk: the video latents, the model-space actions, the latents fed back, and the cache's bookkeeping
  (which slots are valid, their write ids and predicted flags) after the chunk and after its feedback, which
  must equal theirs exactly; at the end the last layer's cached keys and values;
* two episodes stepped in turn reproduce theirs run one after the other (the state is all in EpisodeState).

Tolerance: |ours - theirs| <= 1e-5 + 1e-5 |theirs| (outputs of about unit scale, latents up to 5); measured
(torch 2.13, diffusers 0.42, CPU) at most 6e-7 on single calls and 3.1e-6 on latents after 5 chunks (guidance
5 amplifies); the RoPE rotation is float64 on their side, float32 on ours.

At the released size, ``preset("lingbot_va")``'s transformer built on the meta device has exactly their keys,
shapes and parameter count (full_size.json, built from their code the same way).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file, save_file

from agents.wam.lingbot_va.cache import KVCache, WriteMode
from agents.wam.lingbot_va.checkpoint import CheckpointMismatchError, load_transformer, transformer_config
from agents.wam.lingbot_va.config import TransformerConfig, preset
from agents.wam.lingbot_va.model import LingBotVATransformer
from agents.wam.lingbot_va.positions import action_positions, video_positions
from agents.wam.lingbot_va.sampling import feed_back, infer_chunk
from agents.wam.lingbot_va.schedule import FlowSchedule
from agents.wam.lingbot_va.state import EpisodeState, new_episode

FIXTURE = Path(__file__).parent / "fixtures" / "lingbot_va"
TOL = {"atol": 1e-5, "rtol": 1e-5}
THEIRS = json.loads((FIXTURE / "config.json").read_text())
EPISODES = {episode["name"]: episode for episode in THEIRS["episodes"]}


@functools.cache
def their_fixture() -> tuple[dict[str, torch.Tensor], LingBotVATransformer, AutoencoderKLWan]:
    """Their inputs and outputs, their transformer through our loader, the fixture's VAE (loaded once)."""
    return (load_file(str(FIXTURE / "io.safetensors")), load_transformer(FIXTURE / "transformer"),
            AutoencoderKLWan.from_pretrained(FIXTURE / "vae", use_safetensors=True).eval())


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return their_fixture()[0]


@pytest.fixture(scope="module")
def model() -> LingBotVATransformer:
    return their_fixture()[1]


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLWan:
    return their_fixture()[2]


def _config(name: str):
    episode = EPISODES[name]
    return preset("lingbot_va_tiny", video_guidance=episode["guidance_scale"],
                  action_guidance=episode["action_guidance_scale"])


def _pixels(frames: torch.Tensor) -> torch.Tensor:
    """Camera frames (T, cameras, h, w, 3) uint8 -> (cameras, 3, T, H, W) in [-1, 1], resized as their _encode_obs."""
    height, width = THEIRS["job"]["height"], THEIRS["job"]["width"]
    cameras = [F.interpolate(frames[:, c].float().permute(3, 0, 1, 2), size=(height, width), mode="bilinear",
                             align_corners=False) for c in range(frames.shape[1])]
    return torch.stack(cameras) / 255.0 * 2.0 - 1.0


def _text(embeds: torch.Tensor) -> torch.Tensor:
    """Their encode_prompt's output: the prompt's positions, then zeros to 512."""
    return F.pad(embeds, (0, 0, 0, THEIRS["text_tokens"] - embeds.shape[0]))[None]


def _start(io, name: str, vae) -> EpisodeState:
    negative = io.get(f"{name}.negative")
    return new_episode(_config(name), vae, _text(io[f"{name}.prompt"]), None if negative is None else _text(negative),
                       torch.Generator().manual_seed(EPISODES[name]["seed"]))


def _their_video(out: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
    """Their video output (B, L x 4, C), patch tokens in sequence, on the latent grid (their data_seq_to_patch)."""
    grid = out.reshape(out.shape[0], frames, height // 2, width // 2, 1, 2, 2, -1)
    return grid.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)


def _assert_bookkeeping(cache: KVCache, io, prefix: str) -> None:
    valid = io[f"{prefix}.mask"]
    assert torch.equal(cache.valid, valid), prefix
    assert torch.equal(cache.write_id[valid], io[f"{prefix}.id"][valid]), prefix
    assert torch.equal(cache.predicted[valid], io[f"{prefix}.pred"][valid]), prefix


# ----------------------------------------------------------------------------- single calls, schedules
def test_video_call(io, model):
    start = torch.tensor([3, 7])  # rows at different frames
    positions = video_positions(start, 2, 2, 3)
    assert torch.equal(positions, io["call.video.grid"][:, :3].double())
    with torch.no_grad():
        out = model.video(io["call.video.latents"], io["call.video.timesteps"], positions, io["call.text"])
    torch.testing.assert_close(out, _their_video(io["call.video.out"], 2, 4, 6), **TOL)


def test_action_calls(io, model):
    start = torch.tensor([3, 7])
    positions = action_positions(start, 2, 4)
    assert torch.equal(positions, io["call.action.grid"][:, :3].double())  # fractional frames, as theirs in float32
    actions, timesteps, text = io["call.action.actions"][..., 0], io["call.action.timesteps"], io["call.text"]
    with torch.no_grad():
        out = model.action(actions, timesteps, positions, text)
        torch.testing.assert_close(out, io["call.action.out"].transpose(1, 2).unflatten(2, (2, 4)), **TOL)
        cache = KVCache.empty(2, 2, 40, 2, 20)
        model.video(io["call.video.latents"], io["call.video.timesteps"], video_positions(start, 2, 2, 3), text,
                    [cache], WriteMode.KEPT)
        cached = model.action(actions, timesteps, positions, text, [cache])
    torch.testing.assert_close(cached, io["call.cached_action.out"].transpose(1, 2).unflatten(2, (2, 4)), **TOL)
    assert int(cache.valid.sum()) == 12  # the temporary action write is gone, the kept video stays


@pytest.mark.parametrize("name", ["video", "action", "libero_video", "libero_action"])
def test_schedules(io, name):
    job, steps = THEIRS["job"], THEIRS["libero_steps"]
    grids = {"video": (job["num_inference_steps"], job["snr_shift"]),
             "action": (job["action_num_inference_steps"], job["action_snr_shift"]),
             "libero_video": steps["video"], "libero_action": steps["action"]}
    schedule = FlowSchedule.build(*grids[name])
    assert torch.equal(schedule.sigmas, io[f"sched.{name}.sigmas"])
    assert torch.equal(schedule.timesteps, io[f"sched.{name}.timesteps"])


# ----------------------------------------------------------------------------- episodes
def _chunk(io, name: str, chunk: int, model, vae, state: EpisodeState) -> None:
    """One chunk of episode ``name`` and its feedback, checked against theirs."""
    config, frames = _config(name), io[f"{name}.frames"]
    out = infer_chunk(model, vae, config, state, _pixels(frames[:1]))
    if chunk == 0:
        torch.testing.assert_close(state.first_latents, io[f"{name}.init_latent"], **TOL)
    torch.testing.assert_close(out.latents, io[f"{name}.{chunk}.latents"], **TOL)
    torch.testing.assert_close(out.actions, io[f"{name}.{chunk}.actions"][..., 0], **TOL)
    _assert_bookkeeping(state.cache, io, f"{name}.{chunk}.cache_after_infer")
    if chunk + 1 == EPISODES[name]["chunks"]:
        return
    first = 1 + 4 * config.frame_chunk_size * chunk - 4 * (chunk > 0)  # the key frames of this chunk start here
    count = 4 * (config.frame_chunk_size - (chunk == 0))
    before, theirs = state.frame, io[f"{name}.{chunk}.feedback_latents"]  # their _encode_obs of the key frames
    written = feed_back(model, vae, config, state, _pixels(frames[first:first + count]),
                        io[f"{name}.{chunk}.feedback_actions"][..., 0])
    torch.testing.assert_close(written[:, :, -theirs.shape[2]:], theirs, **TOL)
    _assert_bookkeeping(state.cache, io, f"{name}.{chunk}.cache_after_feedback")
    assert state.frame == before + config.frame_chunk_size


def _assert_last_layer(io, name: str, state: EpisodeState) -> None:
    """The last layer's cached keys and values equal theirs. Without action guidance our action stream runs the
    prompted row alone, so the unprompted row's predicted actions (the newest write) hold nothing of theirs: the
    chunks after it match theirs without them (test_episode), which is what proves nothing reads them."""
    visible = state.cache.visible()
    keys, values = state.cache.gather(len(state.cache.keys) - 1, visible)
    theirs_keys, theirs_values = io[f"{name}.last_layer_keys"], io[f"{name}.last_layer_values"]
    if _config(name).action_guidance <= 1 and state.cache.rows == 2:
        ours = state.cache.write_id[visible] < state.cache.write_id[visible].max()
        keys, values = keys[:, ours], values[:, ours]
        theirs_keys, theirs_values = theirs_keys[:, ours], theirs_values[:, ours]
        torch.testing.assert_close(state.cache.gather(len(state.cache.keys) - 1, visible, rows=1)[0],
                                   io[f"{name}.last_layer_keys"][:1], **TOL)
    torch.testing.assert_close(keys, theirs_keys, **TOL)
    torch.testing.assert_close(values, theirs_values, **TOL)


@pytest.mark.parametrize("name", sorted(EPISODES))
def test_episode(io, model, vae, name):
    state = _start(io, name, vae)
    for chunk in range(EPISODES[name]["chunks"]):
        _chunk(io, name, chunk, model, vae, state)
    _assert_last_layer(io, name, state)


def test_episodes_in_turn(io, model, vae):
    states = {name: _start(io, name, vae) for name in ("b", "c")}
    for chunk in range(2):
        for name, state in states.items():
            _chunk(io, name, chunk, model, vae, state)
    for name, state in states.items():
        _assert_last_layer(io, name, state)


def test_feedback_first(io, model, vae):
    state = _start(io, "c", vae)
    with pytest.raises(ValueError, match="feed_back before the episode's first chunk"):
        feed_back(model, vae, _config("c"), state, torch.zeros(2, 3, 4, 64, 48), torch.zeros(1, 30, 2, 4))


# ----------------------------------------------------------------------------- release size, loading
def test_full_size_matches_theirs():
    theirs = json.loads((FIXTURE / "full_size.json").read_text())
    config = preset("lingbot_va").transformer
    with torch.device("meta"):
        ours = LingBotVATransformer(**config.kwargs())
    assert {k: list(v.shape) for k, v in ours.state_dict().items()} == theirs["keys"]
    assert sum(p.numel() for p in ours.parameters()) == theirs["parameters"] == 5_088_872_670
    known = {k: v for k, v in theirs["config"].items() if k in TransformerConfig.__dataclass_fields__}
    assert TransformerConfig(**{**known, "patch_size": tuple(known["patch_size"])}) == config


def test_loader_refuses_other_folders(tmp_path):
    folder = tmp_path / "transformer"
    shutil.copytree(FIXTURE / "transformer", folder)
    assert transformer_config(folder) == preset("lingbot_va_tiny").transformer
    weights = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    weights.pop("action_proj_out.bias")
    save_file(weights, str(folder / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=r"1 key\(s\) missing \(first: \['action_proj_out.bias'\]\)"):
        load_transformer(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "_class_name": "WanModel"}))
    with pytest.raises(CheckpointMismatchError, match="is not their WanTransformer3DModel"):
        load_transformer(folder)
