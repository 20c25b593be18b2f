"""Many LingBot-VA episodes in one batch: each computes exactly what it computes alone (issue 52, item 4).

Episode ``a`` of the parity fixture (tests/fixtures/lingbot_va: their code's outputs, guidance 5 / 1, 5 chunks,
past the attention window) runs in ragged batches with three companions of the same config, every chunk's
feedback and inference one batched call each, the batch order shuffled every time:

* ``early`` started two chunks before ``a`` (7 chunks: its cache is full and evicting when ``a`` starts);
* ``twin`` starts with ``a`` and ends after 2 chunks (the batch shrinks);
* ``late`` starts when ``a`` is at its third chunk (a first chunk, frame 0 held, beside chunks that are not).

So one call holds episodes at different frames (positions), cache fill (a key-padding mask), first chunk or
not, and with evictions under way in some. ``a``'s latents, actions, fed-back latents and cache bookkeeping must
equal THEIR code's (the fixture); each companion's must equal the same companion run alone through
``infer_chunk``/``feed_back`` (the path test_lingbot_va_parity.py holds to their code). Tolerance as the parity
tests: |batched - reference| <= 1e-5 + 1e-5 |reference|; measured (torch 2.13, CPU, fp32) at most 5.3e-6
against theirs (5 chunks, guidance 5 amplifies) and 4.0e-6 against alone, over every chunk (tests print the figures).

Without action guidance the action stream runs one row per episode (their code runs the unprompted one too, and
nothing reads it): ``a``'s actions equal theirs with it skipped, and the calls are counted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from agents.wam.lingbot_va.memory import CachePool, episode_bytes, episodes_that_fit
from agents.wam.lingbot_va.sampling import feed_back, feed_back_chunks, infer_chunk, infer_chunks
from agents.wam.lingbot_va.state import EpisodeState, new_episode
from tests.test_lingbot_va_parity import (
    EPISODES,
    TOL,
    _assert_bookkeeping,
    _config,
    _pixels,
    _start,
    _text,
    their_fixture,
)

CONFIG = _config("a")


@pytest.fixture(scope="module", name="theirs")
def _theirs():
    """(their inputs and outputs, the transformer, the VAE) of test_lingbot_va_parity.py's fixture."""
    return their_fixture()

FRAMES = 1 + 4 * CONFIG.frame_chunk_size * 8  # enough key frames for 8 chunks


@dataclass
class Episode:
    """One episode of the schedule: its state, frames, the chunks it runs, and what it produced."""

    name: str
    state: EpisodeState
    frames: torch.Tensor  # (T, cameras, h, w, 3) uint8
    chunks: int
    executed: list[torch.Tensor]  # per chunk, the actions fed back (1, A, F, N)
    done: int = 0
    out: list[dict] = field(default_factory=list)  # per chunk: latents, actions, fed-back latents

    def key_frames(self) -> torch.Tensor:
        """The key frames seen while the last chunk ran (as test_lingbot_va_parity._chunk cuts them)."""
        chunk = self.done - 1
        first = 1 + 4 * CONFIG.frame_chunk_size * chunk - 4 * (chunk > 0)
        return _pixels(self.frames[first : first + 4 * (CONFIG.frame_chunk_size - (chunk == 0))])


def _companion(name: str, seed: int, chunks: int, vae) -> Episode:
    g = torch.Generator().manual_seed(seed)
    prompt, negative = torch.randn(5, 16, generator=g), torch.randn(3, 16, generator=g)
    frames = torch.randint(0, 256, (FRAMES, 2, 16, 12, 3), generator=g, dtype=torch.uint8)
    executed = [torch.randn(1, 30, CONFIG.frame_chunk_size, CONFIG.action_per_frame, generator=g) for _ in range(chunks)]
    state = new_episode(CONFIG, vae, _text(prompt), _text(negative), torch.Generator().manual_seed(seed + 1))
    return Episode(name, state, frames, chunks, executed)


def _episodes(io, vae) -> dict[str, Episode]:
    theirs = EPISODES["a"]
    a = Episode("a", _start(io, "a", vae), io["a.frames"], theirs["chunks"],
                [io[f"a.{chunk}.feedback_actions"][..., 0] for chunk in range(theirs["chunks"] - 1)])
    return {"a": a, "early": _companion("early", 101, 7, vae), "twin": _companion("twin", 202, 2, vae),
            "late": _companion("late", 303, 3, vae)}


STARTS = {"early": 0, "a": 2, "twin": 2, "late": 4}  # the tick each episode starts at


def _run_batched(episodes: dict[str, Episode], model, vae, seed: int) -> None:
    """Every tick: the running episodes past their first chunk feed back in one call, then all infer in one."""
    shuffle = random.Random(seed).shuffle
    for tick in range(max(STARTS[n] + e.chunks for n, e in episodes.items())):
        running = [e for n, e in episodes.items() if STARTS[n] <= tick < STARTS[n] + e.chunks]
        back = [e for e in running if e.done > 0]
        shuffle(back)
        if back:
            written = feed_back_chunks(model, vae, CONFIG, [e.state for e in back], [e.key_frames() for e in back],
                                       [e.executed[e.done - 1] for e in back])
            for e, latents in zip(back, written):
                e.out[-1]["fed_back"] = latents
        shuffle(running)
        first = [_pixels(e.frames[:1]) if e.done == 0 else None for e in running]
        for e, chunk in zip(running, infer_chunks(model, vae, CONFIG, [e.state for e in running], first)):
            e.out.append({"latents": chunk.latents, "actions": chunk.actions})
            e.done += 1


def _run_alone(episode: Episode, model, vae) -> list[dict]:
    out = []
    for chunk in range(episode.chunks):
        if chunk:
            episode.done = chunk
            out[-1]["fed_back"] = feed_back(model, vae, CONFIG, episode.state, episode.key_frames(),
                                            episode.executed[chunk - 1])
        result = infer_chunk(model, vae, CONFIG, episode.state, _pixels(episode.frames[:1]))
        out.append({"latents": result.latents, "actions": result.actions})
    return out


def _close(ours: torch.Tensor, reference: torch.Tensor) -> float:
    torch.testing.assert_close(ours, reference, **TOL)
    return float((ours - reference).abs().max())


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_shuffled_batches_compute_what_each_episode_computes_alone(theirs, seed):
    io, model, vae = theirs
    episodes = _episodes(io, vae)
    _run_batched(episodes, model, vae, seed)
    worst = 0.0
    for c, out in enumerate(episodes["a"].out):  # theirs
        worst = max(worst, _close(out["latents"], io[f"a.{c}.latents"]), _close(out["actions"], io[f"a.{c}.actions"][..., 0]))
        if "fed_back" in out:  # theirs are the key frames' latents (the first chunk's lack the first observation's)
            fed = io[f"a.{c}.feedback_latents"]
            worst = max(worst, _close(out["fed_back"][:, :, -fed.shape[2]:], fed))
    _assert_bookkeeping(episodes["a"].state.cache, io, f"a.{EPISODES['a']['chunks'] - 1}.cache_after_infer")
    against_theirs, worst = worst, 0.0
    for name, seed_of in (("early", 101), ("twin", 202), ("late", 303)):
        alone = _run_alone(_companion(name, seed_of, episodes[name].chunks, vae), model, vae)
        for ours, reference in zip(episodes[name].out, alone, strict=True):
            worst = max(worst, *(_close(ours[key], reference[key]) for key in reference))
    print(f"largest |batched - theirs| {against_theirs:.2e}, |batched - alone| {worst:.2e}")


def test_unguided_actions_run_one_row_per_episode(theirs, monkeypatch):
    _, model, vae = theirs
    rows = []
    action = type(model).action

    def counted(self, actions, *args, **kwargs):
        rows.append(actions.shape[0])
        return action(self, actions, *args, **kwargs)

    monkeypatch.setattr(type(model), "action", counted)
    episodes = [_companion(name, seed, 2, vae) for name, seed in (("x", 1), ("y", 2), ("z", 3))]
    states = [e.state for e in episodes]
    chunks = infer_chunks(model, vae, CONFIG, states, [_pixels(e.frames[:1]) for e in episodes])
    assert rows == [3] * (CONFIG.action_steps + 1)  # guidance 1 on actions: the prompted row of each episode
    rows.clear()
    feed_back_chunks(model, vae, CONFIG, states, [_pixels(e.frames[1:1 + 4 * (CONFIG.frame_chunk_size - 1)])
                                                  for e in episodes], [c.actions for c in chunks])
    assert rows == [6]  # the executed actions are kept for both rows: the unprompted video row reads them


def test_a_worker_holds_what_its_memory_holds():
    per_episode = episode_bytes(CONFIG, torch.float32)
    assert episodes_that_fit(CONFIG, torch.float32, 10 * per_episode, max_episodes=64) == 9  # a tenth kept back
    assert episodes_that_fit(CONFIG, torch.float32, 100 * per_episode, max_episodes=16) == 16
    with pytest.raises(MemoryError, match="one LingBot-VA episode needs .* GiB"):
        episodes_that_fit(CONFIG, torch.float32, per_episode // 2, max_episodes=16)
    pool = CachePool(CONFIG, 2, torch.float32, "cpu")
    first, second = pool.take(1), pool.take(2)
    assert first.keys.data_ptr() != second.keys.data_ptr()
    with pytest.raises(ValueError, match="all 2 episode caches are in use"):
        pool.take(3)
    pool.give_back(1)
    assert not pool.take(3).valid.any()  # a fresh cache on the block episode 1 left


def test_episodes_of_other_configs_do_not_share_a_batch(theirs):
    io, model, vae = theirs
    states = [_start(io, "a", vae), _start(io, "c", vae)]  # 2 guidance rows, and 1
    with pytest.raises(ValueError, match="episodes of one config"):
        infer_chunks(model, vae, CONFIG, states, [None, None])
