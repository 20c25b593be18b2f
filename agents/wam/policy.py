"""One model call: a batch of observations in, action chunks (and predicted frames) out.

:class:`WAMPolicy` is what every architecture's policy shares (``MoTPolicy``, ``FastWAMPolicy``): batching,
padding to compiled sizes, the prompt cache, the observation checks, the input/output convention the model's
config gives, and the finiteness check. A subclass adds its architecture's denoising (:meth:`WAMPolicy.sample`).
``WAMPolicy.from_checkpoint`` serves any checkpoint with its architecture's policy.

``predict`` is the unit the inference broker batches and serves; the chunk-queue agent
(agents/chunk_queue.py) calls it only for envs whose action queue ran dry.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import rtc
from agents.policy import Prediction
from agents.wam.architectures import of_checkpoint
from agents.wam.checkpoint import STATS_FILE  # noqa: F401 (re-exported)
from agents.wam.compile import compile_module
from agents.wam.frames import video_to_uint8
from agents.wam.inference_config import InferenceConfig, SamplerConfig
from agents.wam.interface import WAMModel
from agents.wam.normalization import Normalizer
from agents.wam.rtc import PrefixGuide
from envs.protocol import INSTRUCTION, PIXELS, STATE, batch_size, nonfinite_state, select_rows

logger = logging.getLogger(__name__)


class NonFiniteOutputError(RuntimeError):
    """The model produced NaN or inf; nothing is sent to the environment."""


class WAMPolicy(ABC):
    def __init__(
        self,
        model: WAMModel,
        config: InferenceConfig | None = None,
        normalizer: Normalizer | None = None,
        prompt_cache_size: int = 64,
    ):
        """``prompt_cache_size``: instructions whose text embedding is kept (LRU; 0 = off)."""
        self.model = model.eval()
        self.config = config or InferenceConfig()
        self.normalizer = normalizer or Normalizer()
        self.sampler = self._sampler(self.config.sampler)
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.prompt_cache = PromptCache(model, prompt_cache_size)
        compile_module(self.model, self.config.compile)
        if self.config.compile.enabled and self.config.compile.batch_sizes:
            self.warm_up()
        logger.info(
            "WAM policy: preset=%s sampler=%s steps=%d attention=%s video_mode=%s",
            model.config.preset, self.sampler.config.name, self.config.sampler.num_inference_steps,
            model.attention_backend(), model.config.video_mode,
        )

    def __str__(self) -> str:
        return f"the {self.model.config.preset} model's policy"

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, config: InferenceConfig | None = None, dataset_stats_path: str | None = None,
        device: str = "cpu", prompt_cache_size: int = 64, **model_overrides: Any,
    ) -> WAMPolicy:
        """Load a checkpoint; statistics from ``dataset_stats_path``, else the checkpoint's own. Called on
        ``WAMPolicy`` itself it serves the checkpoint with its architecture's policy (its wam_config.json names it);
        on a subclass, with that subclass, which must serve that architecture."""
        architecture = of_checkpoint(path)
        policy = architecture.policy_class()
        if cls is WAMPolicy and not issubclass(policy, WAMPolicy):  # a policy of its own kind (LingBot-VA's keeps
            return policy.from_checkpoint(path, device=device)     # episodes), under its own convention
        if cls is not WAMPolicy and not issubclass(cls, policy):
            raise ValueError(f"{path} holds a {architecture.name} model, which {cls.__name__} does not serve; load it "
                             f"with {policy.__name__} (or WAMPolicy.from_checkpoint, which picks it)")
        model = architecture.load_model(path, **model_overrides).to(device)
        stats = dataset_stats_path or (Path(path) / STATS_FILE)
        # The mode training recorded in the checkpoint's stats file, whichever statistics are given.
        mode = Normalizer.recorded_mode(Path(path) / STATS_FILE)
        normalizer = Normalizer.from_stats_file(stats, mode) if dataset_stats_path or Path(stats).is_file() else None
        if normalizer is None:
            logger.warning("%s has no %s and no dataset_stats_path was given: actions are not unnormalised", path, STATS_FILE)
        return (policy if cls is WAMPolicy else cls)(model, config, normalizer, prompt_cache_size)

    @staticmethod
    @abstractmethod
    def _sampler(config: SamplerConfig) -> Any:
        """What steps the model from noise to data for ``config`` (it has ``.config``, the SamplerConfig it runs)."""

    @property
    def action_horizon(self) -> int:
        return self.model.config.action_horizon

    @property
    def num_inference_steps(self) -> int:
        """Denoising steps per call (the evaluation's cost columns count them)."""
        return self.config.sampler.num_inference_steps

    # ----------------------------------------------------------------- inputs
    def _frames(self, pixels: Mapping[str, Any], batch: int) -> torch.Tensor:
        """Camera images -> (B, 3, 1, H, W * cameras) in [-1, 1], cameras side by side."""
        cfg = self.model.config
        missing = [c for c in cfg.cameras if c not in pixels]
        if missing:
            raise ValueError(
                f"observation lacks camera(s) {missing} (has {sorted(pixels)}); the model was trained on "
                f"cameras={list(cfg.cameras)}: make the env with those cameras"
            )
        # the cameras as one picture in [-1, 1], as the model's convention makes it
        return cfg.input_frames(pixels, batch, self.model.device)[:, :, None]

    def _state(self, state: Any, batch: int) -> torch.Tensor:
        state = np.asarray(state)
        dim = self.model.config.state_dim
        if state.shape != (batch, dim) or not np.issubdtype(state.dtype, np.floating):
            raise ValueError(
                f"state is {state.dtype} {state.shape}; the model needs float (B, {dim}) with B={batch} "
                "(a different state size means the checkpoint was trained on another env: evaluate it there)"
            )
        problem = nonfinite_state(state)
        if problem:
            raise ValueError(problem)
        return torch.from_numpy(self.normalizer.normalize_state(state)).to(self.model.device)

    def _instructions(self, instruction: Any, batch: int) -> list[str]:
        """The prompts the text encoder reads: the instructions, as the model's convention words them."""
        texts = [instruction] if isinstance(instruction, str) else list(instruction)
        if len(texts) != batch or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"instruction must be {batch} string(s), got {instruction!r}")
        return self.model.config.prompts(texts)

    # ----------------------------------------------------------------- call
    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Prediction:
        """Action chunks for a batch of contract observations (envs/protocol.py: one row per env).

        ``noise_seeds`` (one per row) make each row's sampling noise its own, so a row's
        prediction does not depend on which other rows share its batch (the broker's case) up to
        float rounding: batched matmuls may sum in another order (~1e-7 relative). Bit-identical
        rows need one row per call (the broker's ``MULTIRUN.batch_invariant=true``).

        With ``torch_compile_batch_sizes`` the call runs padded up to the nearest of those sizes
        (copies of its last row, cut off the answer), and one larger than the largest in chunks of it.
        """
        rows = _rows(obs)
        compiled = self.config.compile
        if compiled.padded_size(rows) == rows:
            return self._predict(obs, noise_seeds)
        parts = []
        for lo in range(0, rows, compiled.batch_sizes[-1]):
            chunk = list(range(lo, min(rows, lo + compiled.batch_sizes[-1])))
            padded = chunk + chunk[-1:] * (compiled.padded_size(len(chunk)) - len(chunk))
            seeds = None if noise_seeds is None else [noise_seeds[i] for i in padded]
            out = self._predict(select_rows(obs, padded), seeds)
            parts.extend(out.row(i) for i in range(len(chunk)))
        return Prediction.stack(parts)

    def warm_up(self) -> None:
        """Compile every ``torch_compile_batch_sizes`` size now (the constructor calls this), so that
        serving never stops to compile. Two calls each: with CUDA graphs (mode reduce-overhead) the
        first runs the compiled code and the second records the graph."""
        cfg = self.model.config
        height, width = cfg.image_size
        for b in self.config.compile.batch_sizes:
            obs = {
                PIXELS: {camera: np.zeros((b, height, width, 3), np.uint8) for camera in cfg.cameras},
                STATE: np.zeros((b, cfg.state_dim), np.float32),
                INSTRUCTION: ("",) * b,
            }
            for _ in range(2):
                self._predict(obs, list(range(b)))

    @torch.no_grad()
    def _predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None) -> Prediction:
        rows, cfg = _rows(obs), self.model.config
        request = rtc.Request.of(obs, rows, cfg.action_horizon, cfg.action_dim)  # real-time chunking's, or None
        current, state, text = self._condition(obs, rows)
        guide = PrefixGuide.of(request, self.config.rtc, self._model_actions, self.model.device)
        x0 = self.sample(current, state, text, noise_seeds, rtc=guide)
        actions = cfg.env_actions(self.normalizer.unnormalize_actions(x0["action"].cpu().numpy()))
        actions = rtc.commit(actions, request)  # the committed actions exactly, not their round trip
        video = None
        if "video" in x0 and self.config.visualize_future_video:
            video = video_to_uint8(self.model.decode_latents(torch.cat([current, x0["video"]], dim=2)))
            video = self.model.config.output_frames(video)  # upright, as the contract's frames are
        return Prediction(actions=actions, video=video)

    def _model_actions(self, actions: np.ndarray) -> np.ndarray:
        """Env actions -> the normalised ones the model predicts (the inverse of what ``_predict`` sends)."""
        return self.normalizer.normalize_actions(self.model.config.dataset_actions(actions))

    def _condition(self, obs: Mapping[str, Any], batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a model call is conditioned on: the current frame's latent, the normalised state, the text."""
        current = self.model.encode_video(self._frames(obs[PIXELS], batch))
        state = self._state(obs[STATE], batch)
        return current, state, self.prompt_cache.encode(self._instructions(obs[INSTRUCTION], batch))

    @abstractmethod
    def sample(
        self, current: torch.Tensor, state: torch.Tensor, text: torch.Tensor, noise_seeds: Sequence[int] | None = None,
        actions: torch.Tensor | None = None, rtc: PrefixGuide | None = None,
    ) -> dict[str, torch.Tensor]:
        """Denoise an action chunk (and, in joint video mode, the future latents) given the current-frame latent
        (B, C, 1, h, w), normalised state and text embeddings; checks the result is finite. Returns normalised x0
        per modality: ``action`` (B, T, A) and ``video`` (the future latents). ``actions`` (B, T, A), normalised:
        held clean instead of denoised (a world model), where the architecture has that mode. ``rtc``: real-time
        chunking's guidance toward the committed prefix (agents/wam/rtc.py), at every action step."""


def check_finite(x0: Mapping[str, torch.Tensor]) -> None:
    """Refuse a prediction holding NaN or inf: it must never reach an env."""
    for key, value in x0.items():
        if not torch.isfinite(value).all():
            raise NonFiniteOutputError(
                f"the model predicted non-finite {key} values (NaN/inf); no action was sent. Check the "
                "checkpoint, or run with model.encoder_mode.*=fp32 to rule out overflow"
            )


class PromptCache:
    """LRU cache of instruction embeddings (MULTIRUN.prompt_cache_size per model worker):
    an evaluation repeats a handful of instructions thousands of times."""

    def __init__(self, model: WAMModel, size: int):
        self.model, self.size = model, size
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.hits = self.misses = 0

    def encode(self, prompts: list[str]) -> torch.Tensor:
        if self.size <= 0:
            self.misses += len(prompts)
            return self.model.encode_prompt(prompts)
        new = list(dict.fromkeys(p for p in prompts if p not in self._cache))
        if new:
            for prompt, row in zip(new, self.model.encode_prompt(new)):
                self._cache[prompt] = row
        self.misses += len(new)
        self.hits += len(prompts) - len(new)
        rows = []
        for prompt in prompts:
            self._cache.move_to_end(prompt)
            rows.append(self._cache[prompt])
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return torch.stack(rows)


def _rows(obs: Mapping[str, Any]) -> int:
    """The batch size of a model input; one env's observation is refused (stack_rows([obs]) batches it)."""
    n = batch_size(obs)
    if n is None:
        raise ValueError(
            f"state is {np.asarray(obs[STATE]).shape}: a model call takes a batch, state (B, state_dim); "
            "batch one observation with envs.protocol.stack_rows([obs])"
        )
    return n
