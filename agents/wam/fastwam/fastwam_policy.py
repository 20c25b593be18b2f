"""FastWAM as a served policy: a batch of observations in, action chunks (and predicted frames) out.

:class:`FastWAMPolicy` is :class:`~agents.wam.wam_policy.WAMPolicy` (batching, padding to compiled sizes,
the prompt cache, per-row noise seeds, the finiteness check, and the input/output convention the model's
config gives: for FastWAM its checkpoint's ``inputs``, :mod:`agents.wam.fastwam.inputs`) around FastWAM's own
inference: its Euler steps on its own schedules (:mod:`agents.wam.fastwam.sampling`: ``action_only`` runs
their ``infer_action``, ``joint`` their ``infer_joint``).

    policy = FastWAMPolicy.from_checkpoint("ckpt/fastwam_libero")   # a directory the converter wrote
    chunk = policy.predict(obs, noise_seeds=[0, 1]).actions           # (B, 32, 7), LIBERO's units
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agents.wam.fastwam.model import FastWAM
from agents.wam.fastwam.sampling import sample_actions, sample_joint
from agents.wam.inference_config import SamplerConfig
from agents.wam.wam_policy import WAMPolicy, check_finite

EULER = "flow_euler"  # the only sampler FastWAM takes: their Euler steps on their shifted grid


@dataclass
class FastWAMSteps:
    """How many Euler steps, and the shift replacing both schedules' (their ``sigma_shift``; None: theirs)."""

    config: SamplerConfig

    def __post_init__(self) -> None:
        if self.config.name not in (None, EULER):
            raise ValueError(f"EVALUATION.sampler={self.config.name}: a FastWAM steps with Euler on its own schedules "
                             f"(their infer_action); set EVALUATION.sampler=null or {EULER}")
        self.config = SamplerConfig(EULER, self.config.num_inference_steps, self.config.shift)


class FastWAMPolicy(WAMPolicy):
    model: FastWAM

    @staticmethod
    def _load_model(path: str | Path, **overrides: Any) -> FastWAM:
        from agents.wam.fastwam.checkpoint import load_fastwam

        return load_fastwam(path, **overrides)

    @staticmethod
    def _sampler(config: SamplerConfig) -> FastWAMSteps:
        return FastWAMSteps(config)

    # ----------------------------------------------------------------- their inference
    @torch.no_grad()
    def sample(
        self, current: torch.Tensor, state: torch.Tensor, text: torch.Tensor, noise_seeds: Sequence[int] | None = None,
        actions: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Normalised x0: ``action`` (B, T, A) and, in joint mode, ``video`` (the future latents)."""
        if actions is not None:
            raise ValueError("a FastWAM predicts actions with the video; it has no world-model mode that holds "
                             "given actions (EVALUATION.agent=world_model takes a MoT checkpoint)")
        model, cfg = self.model, self.model.config
        steps, shift = self.sampler.config.num_inference_steps, self.sampler.config.shift
        shapes = {"action": (cfg.action_horizon, cfg.action_dim)}
        if cfg.video_mode == "joint":
            c, _, h, w = current.shape[1:]
            shapes["video"] = (c, cfg.latent_frames - 1, h, w)
        noise = self._noise(current.shape[0], shapes, noise_seeds)
        if cfg.video_mode == "joint":
            future, x0 = sample_joint(model, current, text, state, noise["video"], noise["action"], steps, shift)
            prediction = {"action": x0, "video": future}
        else:
            prediction = {"action": sample_actions(model, current, text, state, noise["action"], steps, shift)}
        check_finite(prediction)
        return prediction
