"""LingBot-VA as a served policy: each row continues its own episode, whose state stays here between calls.

A call's rows come from :class:`~agents.episode_memory.MemoryChunkAgent`: each carries its episode's id
(``obs["episode"]``) and the frames seen since the episode's last call (``obs["seen"]``). A new id starts an
episode (their server's ``reset``: the prompt encoded, an empty cache, the first observation encoded); a known
one first writes what happened into its cache (their ``compute_kv_cache``: the key frames, and the chunk it
predicted last, sent back through the robot's units as their client sends it), then predicts the next chunk.
The first chunk's frame-0 actions are not returned: they belong to the observed frame (their client skips them).

A call's rows run as one batch (:func:`~agents.wam.lingbot_va.sampling.infer_chunks`): episodes at different
chunks, cache fill and frames side by side, each on its own cache, generator and VAE state, so a row's actions do
not depend on its company (tests/test_lingbot_va_batching.py). The policy holds ``episode_capacity`` episodes:
as many as the device's free memory holds once the weights are loaded, at most ``max_episodes``
(:mod:`agents.wam.lingbot_va.memory`), their caches allocated up front. The broker admits no more; used
alone, a new episode past it lets the least recently used one go, and a call that continues an episode no
longer held is refused (its cache is gone: it cannot be continued on a wrong one).

    policy = LingBotVAPolicy.from_release("lingbot-va-libero", "lingbot_va_libero")  # their folder as published
    policy = LingBotVAPolicy.from_checkpoint("outputs/libero_lingbot_va_lora/checkpoint")  # python -m training's
    chunk = policy.predict(obs, noise_seeds=[7]).actions   # (1, 12 then 16, 7) LIBERO actions
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import rtc
from agents.episode_memory import EPISODE, SEEN
from agents.policy import EpisodicPolicy, Prediction
from agents.wam.lingbot_va.config import LingBotVAConfig, uses_guidance
from agents.wam.lingbot_va.inputs import LingBotVAInputs, convention
from agents.wam.lingbot_va.memory import CachePool, episodes_that_fit, free_bytes
from agents.wam.lingbot_va.prompt import PromptEncoder
from agents.wam.lingbot_va.sampling import feed_back_chunks, infer_chunks
from agents.wam.lingbot_va.state import EpisodeState, new_episode
from agents.wam.rtc import PrefixGuide
from envs.protocol import INSTRUCTION, PIXELS

MAX_EPISODES = 64  # the most episodes a worker holds at once, however much memory it has


class LingBotVAPolicy(EpisodicPolicy):
    """Their model, VAE and text encoder, one input convention, and the episodes in flight."""

    def __init__(self, model, vae, prompts: PromptEncoder, config: LingBotVAConfig, inputs: LingBotVAInputs,
                 max_episodes: int = MAX_EPISODES, realtime: rtc.RTCConfig | None = None):
        """``realtime``: real-time chunking's knobs, for calls that carry a committed prefix (agents/rtc.py)."""
        if max_episodes < 1:
            raise ValueError(f"max_episodes={max_episodes} must be >= 1")
        self.model, self.vae, self.prompts, self.config, self.inputs = model, vae, prompts, config, inputs
        self.realtime = realtime or rtc.RTCConfig()
        self.episode_capacity = episodes_that_fit(config, model.dtype, free_bytes(model.device), max_episodes)
        self._caches = CachePool(config, self.episode_capacity, model.dtype, model.device)
        self.action_horizon = inputs.chunk_actions  # the first chunk of an episode runs action_per_frame fewer
        self.num_inference_steps = config.video_steps + config.action_steps
        self._episodes: OrderedDict[int, EpisodeState] = OrderedDict()
        self._last_chunk: dict[int, np.ndarray] = {}  # episode -> its last chunk, (30, F, N) model space

    @classmethod
    def from_release(cls, folder: str | Path, inputs: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
                     **kwargs: Any) -> LingBotVAPolicy:
        """Their release folder as published (transformer/, vae/, text_encoder/, tokenizer/), evaluated by the
        named input convention (``lingbot_va_libero``, ``lingbot_va_robotwin``)."""
        from agents.wam.lingbot_va.release import load_release

        release = load_release(folder, convention(inputs), device=device, dtype=dtype)
        return cls(release.model, release.vae, release.prompts, release.config, convention(inputs), **kwargs)

    @classmethod
    def from_checkpoint(cls, folder: str | Path, inputs: str | None = None, device: str = "cpu",
                        dtype: torch.dtype = torch.float32, **kwargs: Any) -> LingBotVAPolicy:
        """One of our checkpoints (python -m training's: wam_config.json, their-layout transformer/, lora/), evaluated
        by its own input convention; ``inputs``, when given (a protocol's), must be that one. LoRA adapters are
        merged into the weights they adapt (the same numbers, one matrix product less per projection)."""
        from agents.wam.lingbot_va.trained import load_lingbot_va
        from agents.wam.lora import has_lora, merged_state_dict

        model = load_lingbot_va(folder)
        own = model.config.inputs
        if own is None or (inputs is not None and inputs != own):
            raise ValueError(f"{folder} holds a LingBot-VA trained under {own!r}, which the protocol's {inputs!r} is "
                             f"not: evaluate it under the protocol of its convention")
        if has_lora(model.transformer):
            merged_state_dict(model.transformer)
        model = model.to(device=device, dtype=dtype).eval()
        return cls(model.transformer, model.vae, model.prompt_encoder(), model.config, convention(own), **kwargs)

    @classmethod
    def load(cls, folder: str | Path, inputs: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
             **kwargs: Any) -> LingBotVAPolicy:
        """A release folder as published, or one of our LingBot-VA checkpoints, evaluated by the convention ``inputs``."""
        from agents.wam.lingbot_va.folder import is_release

        if is_release(folder):
            return cls.from_release(folder, inputs, device=device, dtype=dtype, **kwargs)
        return cls.from_checkpoint(folder, inputs, device=device, dtype=dtype, **kwargs)

    @property
    def episodes(self) -> int:
        """Episodes held now."""
        return len(self._episodes)

    @torch.no_grad()
    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Prediction:
        if EPISODE not in obs or SEEN not in obs:
            raise ValueError("a LingBot-VA call needs each row's episode id and the frames seen since its last call "
                             "(obs['episode'], obs['seen']): drive it with agents.episode_memory.MemoryChunkAgent")
        episodes = [int(episode) for episode in obs[EPISODE]]
        steps = self._check_rows(obs, episodes)
        seeds = list(noise_seeds) if noise_seeds is not None else [None] * len(episodes)
        if steps == 0:
            states = [self._start(episode, obs[INSTRUCTION][i], seeds[i]) for i, episode in enumerate(episodes)]
            first = [self._pixels({camera: image[i][None] for camera, image in obs[PIXELS].items()})
                     for i in range(len(episodes))]
        else:
            states = [self._continued(episode, steps) for episode in episodes]
            self._feed_back(obs, episodes, states)
            first = [None] * len(episodes)
        request = rtc.Request.of(obs, len(episodes), self.action_horizon, len(self.inputs.channels))
        guide = prefix_guide(request, self, first=steps == 0)
        chunks = infer_chunks(self.model, self.vae, self.config, states, first, guide)
        actions = []
        for episode, chunk in zip(episodes, chunks):
            self._last_chunk[episode] = chunk.actions[0].float().cpu().numpy()
            actions.append(self.inputs.env_actions(self._last_chunk[episode], first=steps == 0))
        return Prediction(rtc.commit(np.stack(actions), request))

    def _check_rows(self, obs: Mapping[str, Any], episodes: list[int]) -> int:
        """Refuse a call before any episode changes (an EpisodicPolicy's contract: a worker retries a failed call row
        by row, and a row already fed back must not be fed back twice). The frames each row saw: 0 in a first chunk."""
        steps = {len(frames) for seen in obs[SEEN].values() for frames in seen}
        if len({n == 0 for n in steps}) > 1:
            raise ValueError("rows of one call must be at the same point of their episodes (first chunk or not): "
                             "MemoryChunkAgent groups them so")
        if len(set(episodes)) < len(episodes) or len(episodes) > self.episode_capacity:
            raise ValueError(f"a call of {len(episodes)} rows for {len(set(episodes))} episodes: each row must be an "
                             f"episode of its own, at most episode_capacity={self.episode_capacity} of them")
        if 0 not in steps:
            for episode in episodes:
                self._continued(episode, max(steps))
        return max(steps)

    def end_episode(self, episode: int) -> None:
        """Release an episode's state (its cache) now: the broker calls it on the episode's worker when its env
        is reset, its actor is gone or the run ends."""
        self._episodes.pop(episode, None)
        self._last_chunk.pop(episode, None)
        self._caches.give_back(episode)

    def _feed_back(self, obs: Mapping[str, Any], episodes: list[int], states: list[EpisodeState]) -> None:
        """Write what each row's episode saw and did since its last call into its cache, all rows in one batch."""
        pixels, executed = [], []
        every = self.inputs.steps_per_key_frame
        for i, (episode, state) in enumerate(zip(episodes, states)):
            pixels.append(self._pixels({camera: frames[i][every - 1 :: every] for camera, frames in obs[SEEN].items()}))
            sent = self.inputs.normalized(self.inputs.unnormalized(self._last_chunk[episode]))  # as their client sends it
            executed.append(torch.from_numpy(sent)[None].to(state.text))
        feed_back_chunks(self.model, self.vae, self.config, states, pixels, executed)

    def _start(self, episode: int, instruction: str, seed: int | None) -> EpisodeState:
        self.end_episode(episode)
        while len(self._episodes) >= self.episode_capacity:
            self.end_episode(next(iter(self._episodes)))
        device = self.model.device
        generator = torch.Generator(device)
        generator.manual_seed(int(seed)) if seed is not None else generator.seed()
        prompt, empty = self.prompts.encode(self.inputs.prompt(instruction), uses_guidance(self.config))
        state = new_episode(self.config, self.vae, prompt, empty, generator, self.model.dtype, self._caches.take(episode))
        self._episodes[episode] = state
        return state

    def _continued(self, episode: int, steps: int) -> EpisodeState:
        if episode not in self._episodes:
            raise ValueError(f"episode {episode} continues ({steps} frames seen) but its state is not held here (more "
                             f"than episode_capacity={self.episode_capacity} episodes at once, or a restarted worker): "
                             "restart the episode")
        self._episodes.move_to_end(episode)
        return self._episodes[episode]

    def _pixels(self, frames: Mapping[str, np.ndarray]) -> torch.Tensor:
        """Upright (T, H, W, 3) frames per camera -> (cameras, 3, T, h, w) in [-1, 1], the VAE's batch."""
        video = self.inputs.video(frames)
        return torch.stack([video[camera] for camera in self.inputs.cameras]).to(self.model.device, self.model.dtype)


def prefix_guide(request: rtc.Request | None, policy: LingBotVAPolicy, first: bool) -> PrefixGuide | None:
    """Real-time chunking's guide in the action stream's layout (E, 30, F, N): each row's env-unit prefix as the
    model's normalised actions, its soft mask on the robot's channels. None: nothing to continue."""
    if request is None or not request.guides:
        return None
    inputs, config = policy.inputs, policy.config
    if first or inputs.relative_pose:
        raise ValueError(f"{rtc.OVERLAP} > 0 on an episode's first chunk (nothing was committed yet) or with "
                         f"{inputs.name}'s relative targets: send no prefix there (agents.rtc.entries(None, 0, ...))")
    shape = (len(inputs.channels), config.frame_chunk_size, config.action_per_frame)
    target = np.stack([inputs.normalized(row.T.reshape(shape)) for row in request.prefix])
    mask = request.mask(policy.realtime).reshape(-1, 1, *shape[1:])
    keep = np.zeros((target.shape[1], 1, 1), np.float32)
    keep[list(inputs.channels)] = 1
    device = policy.model.device
    return PrefixGuide(torch.from_numpy(target).to(device), torch.from_numpy(mask * keep).to(device),
                       float(policy.realtime.max_guidance_weight))
