"""What LingBot-VA carries from one chunk of an episode to the next, as one explicit object.

Their server keeps it in attributes reset by ``_reset`` (wan_va/wan_va_server.py): the transformer's KV cache,
the streaming VAE's feature cache, the prompt embeddings, the frame index the next chunk starts at
(``frame_st_id``) and the first observation's latents (``init_latent``); their noise comes from the global
generator. Here :func:`new_episode` makes that state and the sampler (:mod:`agents.wam.lingbot_va.sampling`)
reads and advances it, so episodes never share anything and are batched side by side (:class:`EpisodeBatch`).
The text's cross-attention keys and values, which their model recomputes in every call, are made once per
episode here (the same numbers: the text does not change within an episode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from diffusers import AutoencoderKLWan

from agents.wam.lingbot_va.cache import KVCache
from agents.wam.lingbot_va.config import LingBotVAConfig, uses_guidance
from agents.wam.lingbot_va.memory import cache_shape
from agents.wam.lingbot_va.observations import new_feature_cache


@dataclass
class EpisodeState:
    """One episode's state between chunks."""

    cache: KVCache  # the transformer's self-attention keys/values (rows: prompted, then unprompted)
    vae_cache: list  # the VAE encoder's causal-convolution features (observations.encode_frames)
    text: torch.Tensor  # (rows, text_tokens, text_dim) prompt embeddings: the prompt's, then the empty prompt's
    generator: torch.Generator  # the chunks' noise
    text_kv: dict = field(default_factory=dict)  # each layer's cross-attention keys/values of ``text``, made once
    frame: int = 0  # the latent frame the next chunk starts at (their frame_st_id)
    first_latents: torch.Tensor | None = None  # (1, C, 1, h, w) of the first observation (their init_latent)

    @property
    def started(self) -> bool:
        """Whether the first chunk has run (it encodes the first observation)."""
        return self.first_latents is not None


def new_episode(
    config: LingBotVAConfig, vae: AutoencoderKLWan, prompt: torch.Tensor, empty_prompt: torch.Tensor | None,
    generator: torch.Generator, dtype: torch.dtype = torch.float32, cache: KVCache | None = None,
) -> EpisodeState:
    """A fresh episode (their ``_reset``): an empty cache of ``config.cache_slots`` slots (``cache``: one from a
    worker's pool, else one of its own) and an empty VAE state.

    ``prompt``/``empty_prompt``: (1, text_tokens, text_dim) text-encoder states of the instruction and of "" (zero
    past each prompt's tokens, as their encode_prompt returns them); ``empty_prompt`` is needed only with guidance.
    """
    rows = [prompt]
    if uses_guidance(config):
        if empty_prompt is None:
            raise ValueError("guidance is on (video_guidance or action_guidance > 1): give the empty prompt's embeddings")
        rows.append(empty_prompt)
    text = torch.cat(rows).to(dtype)
    expected = (config.text_tokens, config.transformer.text_dim)
    if tuple(text.shape[1:]) != expected:
        raise ValueError(f"prompt embeddings of shape {tuple(text.shape[1:])}; the model takes (text_tokens, text_dim) "
                         f"= {expected}")
    if cache is None:
        cache = KVCache.empty(*cache_shape(config), dtype=dtype, device=text.device)
    elif cache.keys.shape != cache_shape(config):
        raise ValueError(f"a cache of shape {tuple(cache.keys.shape)} for an episode of {config.preset}: take it from a "
                         "pool made for this config")
    return EpisodeState(cache=cache, vae_cache=new_feature_cache(vae), text=text, generator=generator)


class EpisodeBatch:
    """Episodes that run a chunk's calls together: each call stacks ``rows`` rows per episode, episode-major (the
    prompted row, then the unprompted one), and each episode reads and writes its own cache
    (:mod:`agents.wam.lingbot_va.ragged`). A call may run fewer rows than the caches hold (:meth:`text_kv`)."""

    def __init__(self, states: Sequence[EpisodeState]):
        if not states or len({state.cache.rows for state in states}) != 1:
            raise ValueError("an episode batch needs episodes of one config (as many guidance rows each)")
        self.states = list(states)
        self.rows = self.states[0].cache.rows
        self.caches = [state.cache for state in self.states]
        self._text_kv: dict[int, dict] = {}  # rows -> the episodes' text keys and values stacked, made once

    def __len__(self) -> int:
        return len(self.states)

    def starts(self, rows: int) -> torch.Tensor:
        """(episodes x rows,) the latent frame each row's chunk starts at."""
        frames = torch.tensor([state.frame for state in self.states], device=self.states[0].text.device)
        return frames.repeat_interleave(rows)

    def text_kv(self, model, rows: int) -> dict:
        """Every layer's text keys and values of the first ``rows`` rows of each episode, stacked as the call's rows
        (each episode's made once, on its first call)."""
        if rows not in self._text_kv:
            for state in self.states:
                if not state.text_kv:
                    state.text_kv.update(model.text_keys_values(state.text))
            layers = self.states[0].text_kv.keys()
            self._text_kv[rows] = {
                layer: tuple(_stacked([state.text_kv[layer][i][:rows] for state in self.states]) for i in (0, 1))
                for layer in layers
            }
        return self._text_kv[rows]


def _stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)  # one episode's own rows: a view, no copy
