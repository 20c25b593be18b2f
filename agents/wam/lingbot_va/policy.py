"""LingBot-VA as a served policy: each row continues its own episode, whose state stays here between calls.

A call's rows come from :class:`~agents.episode_memory.MemoryChunkAgent`: each carries its episode's id
(``obs["episode"]``) and the frames seen since the episode's last call (``obs["seen"]``). A new id starts an
episode (their server's ``reset``: the prompt encoded, an empty cache, the first observation encoded); a known
one first writes what happened into its cache (their ``compute_kv_cache``: the key frames, and the chunk it
predicted last, sent back through the robot's units as their client sends it), then predicts the next chunk.
The first chunk's frame-0 actions are not returned: they belong to the observed frame (their client skips them).

Episodes are kept, least recently used first out, up to ``max_episodes``; a call that continues an episode no
longer held is refused (its cache is gone: it cannot be continued on a wrong one). Rows run one after another:
batching episodes is the broker's next step.

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

from agents.episode_memory import EPISODE, SEEN
from agents.policy import EpisodicPolicy, Prediction
from agents.wam.lingbot_va.config import LingBotVAConfig
from agents.wam.lingbot_va.inputs import LingBotVAInputs, convention
from agents.wam.lingbot_va.prompt import PromptEncoder
from agents.wam.lingbot_va.sampling import feed_back, infer_chunk
from agents.wam.lingbot_va.state import EpisodeState, new_episode
from envs.protocol import INSTRUCTION, PIXELS

MAX_EPISODES = 16  # episodes a worker holds at once (one per actor it serves, in evaluation)


class LingBotVAPolicy(EpisodicPolicy):
    """Their model, VAE and text encoder, one input convention, and the episodes in flight."""

    def __init__(self, model, vae, prompts: PromptEncoder, config: LingBotVAConfig, inputs: LingBotVAInputs,
                 max_episodes: int = MAX_EPISODES):
        if max_episodes < 1:
            raise ValueError(f"max_episodes={max_episodes} must be >= 1")
        self.model, self.vae, self.prompts, self.config, self.inputs = model, vae, prompts, config, inputs
        self.max_episodes = max_episodes
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
        rows = len(obs[EPISODE])
        self._check_rows(obs)
        seeds = list(noise_seeds) if noise_seeds is not None else [None] * rows
        return Prediction(np.stack([self._row(obs, i, seeds[i]) for i in range(rows)]))

    def _check_rows(self, obs: Mapping[str, Any]) -> None:
        """Refuse a call before any episode changes (an EpisodicPolicy's contract: a worker retries a failed call row
        by row, and a row already fed back must not be fed back twice)."""
        steps = {len(frames) for seen in obs[SEEN].values() for frames in seen}
        if len({n == 0 for n in steps}) > 1:
            raise ValueError("rows of one call must be at the same point of their episodes (first chunk or not): "
                             "MemoryChunkAgent groups them so")
        if 0 not in steps:
            for episode in obs[EPISODE]:
                self._continued(int(episode), max(steps))

    def end_episode(self, episode: int) -> None:
        """Release an episode's state (its cache) now: the broker calls it on the episode's worker when its env
        is reset, its actor is gone or the run ends."""
        self._episodes.pop(episode, None)
        self._last_chunk.pop(episode, None)

    def _row(self, obs: Mapping[str, Any], i: int, seed: int | None) -> np.ndarray:
        episode = int(obs[EPISODE][i])
        seen = {camera: frames[i] for camera, frames in obs[SEEN].items()}
        steps = len(next(iter(seen.values())))
        if steps == 0:
            state = self._start(episode, obs[INSTRUCTION][i], seed)
            first = {camera: image[i][None] for camera, image in obs[PIXELS].items()}
            chunk = infer_chunk(self.model, self.vae, self.config, state, self._pixels(first))
        else:
            state = self._continued(episode, steps)
            key_frames = {camera: frames[self.inputs.steps_per_key_frame - 1 :: self.inputs.steps_per_key_frame]
                          for camera, frames in seen.items()}
            executed = self.inputs.normalized(self.inputs.unnormalized(self._last_chunk[episode]))  # as their client sends it
            feed_back(self.model, self.vae, self.config, state, self._pixels(key_frames),
                      torch.from_numpy(executed)[None].to(state.text))
            chunk = infer_chunk(self.model, self.vae, self.config, state)
        model_actions = chunk.actions[0].float().cpu().numpy()
        self._last_chunk[episode] = model_actions
        return self.inputs.env_actions(model_actions, first=steps == 0)

    def _start(self, episode: int, instruction: str, seed: int | None) -> EpisodeState:
        self.end_episode(episode)
        while len(self._episodes) >= self.max_episodes:
            self.end_episode(next(iter(self._episodes)))
        device = self.model.device
        generator = torch.Generator(device)
        generator.manual_seed(int(seed)) if seed is not None else generator.seed()
        prompt, empty = self.prompts.encode(self.inputs.prompt(instruction), self.config.uses_guidance)
        state = new_episode(self.config, self.vae, prompt, empty, generator, self.model.dtype)
        self._episodes[episode] = state
        return state

    def _continued(self, episode: int, steps: int) -> EpisodeState:
        if episode not in self._episodes:
            raise ValueError(f"episode {episode} continues ({steps} frames seen) but its state is not held here (more "
                             f"than max_episodes={self.max_episodes} episodes at once, or a restarted worker): "
                             "restart the episode, or raise max_episodes")
        self._episodes.move_to_end(episode)
        return self._episodes[episode]

    def _pixels(self, frames: Mapping[str, np.ndarray]) -> torch.Tensor:
        """Upright (T, H, W, 3) frames per camera -> (cameras, 3, T, h, w) in [-1, 1], the VAE's batch."""
        video = self.inputs.video(frames)
        return torch.stack([video[camera] for camera in self.inputs.cameras]).to(self.model.device, self.model.dtype)
