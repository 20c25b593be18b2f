"""The MoT as a served policy: :class:`~agents.wam.policy.WAMPolicy` around the MoT's denoising, both experts
stepped together by a few-step flow sampler (:class:`~agents.wam.sampling.FlowSampler`).

    policy = MoTPolicy(build_model(preset("tiny")))     # or WAMPolicy.from_checkpoint("outputs/run/checkpoint")
    chunk = policy.predict(obs, noise_seeds=[0, 1]).actions
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agents.wam.inference_config import SamplerConfig
from agents.wam.mot.model import MoTWAM
from agents.wam.policy import WAMPolicy, check_finite
from agents.wam.rtc import PrefixGuide
from agents.wam.sampling import FlowSampler


class MoTPolicy(WAMPolicy):
    model: MoTWAM

    @staticmethod
    def _sampler(config: SamplerConfig) -> FlowSampler:
        """What steps the model from noise to data (null name and shift: the MoT's own)."""
        return FlowSampler(config)

    @torch.no_grad()
    def sample(
        self, current: torch.Tensor, state: torch.Tensor, text: torch.Tensor, noise_seeds: Sequence[int] | None = None,
        actions: torch.Tensor | None = None, rtc: PrefixGuide | None = None,
    ) -> dict[str, torch.Tensor]:
        """Denoise an action chunk (and, in joint video mode, the future latents) given the
        current-frame latent (B, C, 1, h, w), normalised state and text embeddings; checks
        the result is finite. Returns normalised x0 per modality (``video``: the future latents, also
        for a model that denoises their change, ``model.video_target=change``; with
        ``future_video=expected`` the first step's estimate of them, from pure noise).

        ``actions`` (B, T, A), normalised, are held clean (noise level 0) instead: only the future
        latents are denoised (the world model, :mod:`agents.wam.mot.world_model`), and x0 has no ``action``.

        ``rtc``: each step's action velocity is guided toward the committed prefix (real-time chunking,
        agents/wam/rtc.py); None is the plain sampler."""
        model, cfg = self.model, self.model.config
        batch = current.shape[0]
        joint = cfg.video_mode == "joint"
        held = actions is not None
        shapes = {} if held else {"action": (cfg.action_horizon, cfg.action_dim)}
        if joint:
            c, _, h, w = current.shape[1:]
            shapes["video"] = (c, cfg.latent_frames - 1, h, w)
        noise = self._noise(batch, shapes, noise_seeds)
        cross_kv = {} if self.config.inference_cross_kv_reuse else None
        expected = [] if joint and not held and self.config.future_video == "expected" else None
        clean = torch.zeros(batch, device=model.device)

        def denoise(x: dict[str, torch.Tensor], sigma: torch.Tensor) -> dict[str, torch.Tensor]:
            sigmas = sigma.expand(batch)
            latents = torch.cat([current, x["video"]], dim=2) if joint else current
            if held or rtc is None:
                action, action_sigma = (actions, clean) if held else (x["action"], sigmas)
                video_v, action_v = model(latents, sigmas, action, action_sigma, state, text, cross_kv=cross_kv)
            else:
                video_v, action_v = self._guided(rtc, x["action"], sigma, latents, state, text, cross_kv)
            if expected == []:  # the first step, from pure noise: its x0 estimate is the expected future
                expected.append(x["video"] - sigma * video_v)
            velocity = {} if held else {"action": action_v}
            if joint:
                velocity["video"] = video_v
            return velocity

        x0 = self.sampler.sample(denoise, noise)
        if expected:
            x0["video"] = expected[0]
        check_finite(x0)
        if joint:
            x0["video"] = model.future_latents(current, x0["video"])
        return x0

    def _guided(self, rtc: PrefixGuide, action: torch.Tensor, sigma: torch.Tensor, latents: torch.Tensor,
                state: torch.Tensor, text: torch.Tensor, cross_kv: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(video velocity, guided action velocity) of one step: the model once, with the gradient the guide reads."""
        sigmas, video = sigma.expand(action.shape[0]), []

        def action_velocity(a: torch.Tensor) -> torch.Tensor:
            video_v, action_v = self.model(latents, sigmas, a, sigmas, state, text, cross_kv=cross_kv)
            video.append(video_v.detach())
            return action_v

        action_v = rtc.velocity(action_velocity, action, sigma)
        return video[0], action_v

    def _noise(self, batch: int, shapes: dict[str, tuple[int, ...]], seeds: Sequence[int] | None) -> dict:
        if seeds is None:
            return {k: torch.randn((batch, *s), generator=self.generator).to(self.model.device) for k, s in shapes.items()}
        if len(seeds) != batch:
            raise ValueError(f"{len(seeds)} noise seeds for a batch of {batch}")
        rows = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        return {k: torch.stack([torch.randn(s, generator=g) for g in rows]).to(self.model.device) for k, s in shapes.items()}
