"""FastWAM as a served policy: a batch of observations in, action chunks (and predicted frames) out.

:class:`FastWAMPolicy` is :class:`~agents.wam.policy.WAMPolicy` (batching, padding to compiled sizes,
the prompt cache, per-row noise seeds, the finiteness check, and the input/output convention the model's
config gives: for FastWAM its checkpoint's ``inputs``, :mod:`agents.wam.fastwam.inputs`) around FastWAM's own
inference: its Euler steps on its own schedules (:mod:`agents.wam.fastwam.sampling`: ``action_only`` runs
their ``infer_action``, ``joint`` their ``infer_joint``), from the noise their code draws for each row's seed.

    policy = WAMPolicy.from_checkpoint("ckpt/fastwam_libero")   # a directory the converter wrote: a FastWAMPolicy
    chunk = policy.predict(obs, noise_seeds=[0, 1]).actions           # (B, 32, 7), LIBERO's units
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agents.wam.fastwam.model import FastWAM
from agents.wam.fastwam.sampling import sample_actions, sample_joint, their_row_noise
from agents.wam.inference_config import SamplerConfig
from agents.wam.policy import WAMPolicy, check_finite
from agents.wam.rtc import PrefixGuide

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
    def _sampler(config: SamplerConfig) -> FastWAMSteps:
        return FastWAMSteps(config)

    # ----------------------------------------------------------------- their inference
    @torch.no_grad()
    def sample(
        self, current: torch.Tensor, state: torch.Tensor, text: torch.Tensor, noise_seeds: Sequence[int] | None = None,
        actions: torch.Tensor | None = None, rtc: PrefixGuide | None = None,
    ) -> dict[str, torch.Tensor]:
        """Normalised x0: ``action`` (B, T, A) and, in joint mode, ``video`` (the future latents); ``rtc``: the
        action steps guided toward the committed prefix (real-time chunking)."""
        if actions is not None:
            raise ValueError("a FastWAM predicts actions with the video; it has no world-model mode that holds "
                             "given actions (EVALUATION.agent=world_model takes a MoT checkpoint)")
        model, cfg = self.model, self.model.config
        steps, shift = self.sampler.config.num_inference_steps, self.sampler.config.shift
        noise = self._their_noise(current, noise_seeds)
        if cfg.video_mode == "joint":
            future, x0 = sample_joint(model, current, text, state, noise["video"], noise["action"], steps, shift, rtc)
            prediction = {"action": x0, "video": future}
        else:
            prediction = {"action": sample_actions(model, current, text, state, noise["action"], steps, shift, rtc)}
        check_finite(prediction)
        return prediction

    def _their_noise(self, current: torch.Tensor, seeds: Sequence[int] | None) -> dict[str, torch.Tensor]:
        """Each row's noise as their code draws it for the row's seed (their_row_noise: the video's with the
        current frame, from a generator of its own); without seeds, each row's seed from the policy's generator."""
        cfg, (batch, c, _, h, w) = self.model.config, current.shape
        if seeds is None:
            seeds = torch.randint(2**62, (batch,), generator=self.generator).tolist()
        if len(seeds) != batch:
            raise ValueError(f"{len(seeds)} noise seeds for a batch of {batch}")
        video = (c, cfg.latent_frames, h, w) if cfg.video_mode == "joint" else None
        rows = [their_row_noise(int(seed), (cfg.action_horizon, cfg.action_dim), video) for seed in seeds]
        return {key: torch.stack([row[key] for row in rows]).to(self.model.device) for key in rows[0]}
