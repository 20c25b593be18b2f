"""LingBot-VA served as a policy: an agent that remembers the episode drives it step by step, and the actions the
env executes are those their client executes, from their server, on the same frames (tests/fixtures/lingbot_va,
made by scripts/lingbot_va_reference.py with their code: their LIBERO client's loop at a tiny size).

The path is the whole served one but the broker: MemoryChunkAgent (every frame after each action, the episode's
id) -> PolicyPredictor -> LingBotVAPolicy (episode state kept between calls; key frames and the last chunk, sent
back through the robot's units as their client sends it, fed into the cache; the first chunk's frame 0 skipped).
Tolerance as tests/test_lingbot_va_parity.py: 1e-5 + 1e-5 |theirs| in fp32.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file

from agents.episode_memory import EPISODE, SEEN, MemoryChunkAgent
from agents.predictor import PolicyPredictor
from agents.wam.lingbot_va.checkpoint import load_transformer
from agents.wam.lingbot_va.config import preset
from agents.wam.lingbot_va.inputs import LingBotVAInputs, Sampling, convention
from agents.wam.lingbot_va.policy import LingBotVAPolicy

FIXTURE = Path(__file__).parent / "fixtures" / "lingbot_va"
THEIRS = json.loads((FIXTURE / "config.json").read_text())
EPISODES = {e["name"]: e for e in THEIRS["episodes"]}
TOL = dict(atol=1e-5, rtol=1e-5)
CAMERAS = ("agentview", "robot0_eye_in_hand")


class StoredPrompts:
    """Their prompt embeddings as stored (the text encoder is plain UMT5, not under test here)."""

    def __init__(self, io, name: str):
        self.prompt, self.empty = io[f"{name}.prompt"], io.get(f"{name}.negative")

    def encode(self, text: str, with_empty: bool):
        pad = lambda e: F.pad(e, (0, 0, 0, THEIRS["text_tokens"] - e.shape[0]))[None]  # noqa: E731
        return pad(self.prompt), pad(self.empty) if with_empty else None


class Seeded(PolicyPredictor):
    """Their client's global seed, as the first call's noise seed."""

    def __init__(self, policy, seed: int):
        super().__init__(policy)
        self.seed = seed

    def predict_row(self, obs, noise_seed=None):
        return super().predict_row(obs, self.seed)


def _inputs(name: str) -> LingBotVAInputs:
    job, episode = THEIRS["job"], EPISODES[name]
    channels = tuple(job["used_action_channel_ids"])
    return dataclasses.replace(
        convention("lingbot_va_libero"), cameras=CAMERAS, sizes=((job["height"], job["width"]),) * 2,
        frame_chunk_size=job["frame_chunk_size"], action_per_frame=job["action_per_frame"], channels=channels,
        q01=tuple(job["norm_stat"]["q01"][c] for c in channels), q99=tuple(job["norm_stat"]["q99"][c] for c in channels),
        sampling=Sampling(job["num_inference_steps"], job["action_num_inference_steps"], episode["guidance_scale"],
                          episode["action_guidance_scale"], job["snr_shift"], job["action_snr_shift"], job["attn_window"]),
    )


@pytest.fixture(scope="module")
def io():
    return load_file(str(FIXTURE / "io.safetensors"))


@pytest.fixture(scope="module")
def parts():
    vae = AutoencoderKLWan.from_pretrained(FIXTURE / "vae", use_safetensors=True).eval()
    return load_transformer(FIXTURE / "transformer"), vae


def _policy(io, parts, name: str) -> LingBotVAPolicy:
    episode = EPISODES[name]
    config = preset("lingbot_va_tiny", video_guidance=episode["guidance_scale"], action_guidance=episode["action_guidance_scale"],
                    action_channels=tuple(THEIRS["job"]["used_action_channel_ids"]))
    return LingBotVAPolicy(*parts, StoredPrompts(io, name), config, _inputs(name))


def _obs(frames: torch.Tensor, step: int) -> dict:
    return {"pixels": {camera: frames[step, c].numpy() for c, camera in enumerate(CAMERAS)},
            "state": np.zeros(8, np.float32), "instruction": "put the bowl on the plate"}


def _their_steps(io, name: str, chunk: int) -> np.ndarray:
    """The actions their client executes of chunk ``chunk``: (C, F, N) frame by frame, frame 0 skipped at first."""
    actions = io[f"{name}.{chunk}.env_actions"].numpy()[:, int(chunk == 0):]
    return actions.reshape(actions.shape[0], -1).T


@pytest.mark.parametrize("name", ["a", "b"])
def test_the_agent_executes_their_clients_actions(io, parts, name):
    """Episode a runs 5 chunks past the attention window (eviction), b runs with action guidance."""
    policy, frames = _policy(io, parts, name), io[f"{name}.frames"]
    agent = MemoryChunkAgent(Seeded(policy, EPISODES[name]["seed"]))
    step = 0
    for chunk in range(EPISODES[name]["chunks"]):
        theirs = _their_steps(io, name, chunk)
        ours = np.stack([agent.act(_obs(frames, min(step + k, len(frames) - 1))) for k in range(len(theirs))])
        np.testing.assert_allclose(ours, theirs, **TOL)
        step += len(theirs)
    assert agent.num_model_calls == EPISODES[name]["chunks"] and policy.episodes == 1


def test_a_reset_starts_a_new_episode_and_an_unknown_one_is_refused(io, parts):
    policy = _policy(io, parts, "c")
    agent = MemoryChunkAgent(Seeded(policy, EPISODES["c"]["seed"]))
    frames = io["c.frames"]
    first = [agent.act(_obs(frames, 0)) for _ in range(4)]
    agent.reset()
    again = [agent.act(_obs(frames, 0)) for _ in range(4)]
    np.testing.assert_array_equal(np.stack(first), np.stack(again))  # same seed, same first chunk
    assert policy.episodes == 1  # the reset let the first episode go (Predictor.release_episode)
    row = _obs(frames, 1)
    stray = {"pixels": {c: x[None] for c, x in row["pixels"].items()}, "state": row["state"][None],
             "instruction": (row["instruction"],), EPISODE: np.array([12345]),
             SEEN: {c: frames[1:5, i].numpy()[None] for i, c in enumerate(CAMERAS)}}
    with pytest.raises(ValueError, match="episode 12345 continues .* its state is not held here"):
        policy.predict(stray)
    # a call whose first row continues a held episode and whose second cannot: refused before the first is fed back
    # (a worker retries a failed call row by row: that row must not be fed back twice)
    held = next(iter(policy._episodes))
    before = (policy._episodes[held].frame, policy._episodes[held].generator.get_state())
    pair = {"pixels": {c: np.concatenate([x, x]) for c, x in stray["pixels"].items()},
            "state": np.concatenate([stray["state"]] * 2), "instruction": stray["instruction"] * 2,
            EPISODE: np.array([held, 12345]), SEEN: {c: np.concatenate([x, x]) for c, x in stray[SEEN].items()}}
    with pytest.raises(ValueError, match="episode 12345 continues"):
        policy.predict(pair)
    assert policy._episodes[held].frame == before[0] and torch.equal(policy._episodes[held].generator.get_state(), before[1])


def test_a_call_without_episode_memory_is_refused(io, parts):
    policy = _policy(io, parts, "c")
    with pytest.raises(ValueError, match=r"drive it with agents\.episode_memory\.MemoryChunkAgent"):
        policy.predict({"pixels": {}, "state": np.zeros((1, 8)), "instruction": ("x",)})
    with pytest.raises(ValueError, match="replan_steps=5: a model that remembers the episode runs each chunk whole"):
        MemoryChunkAgent(PolicyPredictor(policy), replan_steps=5)


def test_episodes_in_flight_together_each_get_their_own_answers(io, parts):
    """Two agents share one policy (as two actors share a model worker) and step in turn, the second one chunk
    behind: both run episode a, each executing exactly what their client executes alone (their caches at
    different fill, one past the window while the other is not)."""
    policy, frames = _policy(io, parts, "a"), io["a.frames"]
    theirs = np.concatenate([_their_steps(io, "a", chunk) for chunk in range(4)])
    first, second = (MemoryChunkAgent(Seeded(policy, EPISODES["a"]["seed"])) for _ in range(2))
    ours: dict[int, list] = {0: [], 1: []}
    lag = len(_their_steps(io, "a", 0))
    for step in range(len(theirs) + lag):
        if step < len(theirs):
            ours[0].append(first.act(_obs(frames, step)))
        if step >= lag:
            ours[1].append(second.act(_obs(frames, step - lag)))
    for agent in ours.values():
        np.testing.assert_allclose(np.stack(agent), theirs, **TOL)
    assert policy.episodes == 2
