"""Few-step ODE samplers for rectified-flow World Action Models (Wan convention).

Convention: ``x_t = (1 - sigma) * x0 + sigma * noise`` with ``sigma`` in [0, 1]; the model
predicts the velocity ``v = noise - x0`` and takes ``sigma * 1000`` as its timestep input.
All modalities (``{"video": (B, C, F, H, W), "action": (B, T, A)}``) share one sigma
schedule and one model call per step, but each keeps its own scheduler, because multistep
solvers store per-sample history.

The solver math is diffusers'; this module only configures the schedulers and, for DDIM
(a variance-preserving solver), converts between flow and VP space.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import numpy as np
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    UniPCMultistepScheduler,
)

from agents.wam.inference_config import MOT_SAMPLER, MOT_SHIFT, SAMPLERS, SamplerConfig  # noqa: F401 (SAMPLERS re-exported)

# denoise(latents, sigma) -> velocity per key; sigma is a float32 0-d tensor on the noise device.
Denoiser = Callable[[dict[str, torch.Tensor], torch.Tensor], Mapping[str, torch.Tensor]]
Scheduler = (
    FlowMatchEulerDiscreteScheduler
    | UniPCMultistepScheduler
    | DPMSolverMultistepScheduler
    | DDIMScheduler
)


def _base_grid(n: int) -> list[float]:
    # Wan's unshifted grid 1, 1 - 1/n, ..., 1/n: starts at pure noise, and never asks the
    # model about sigma = 0 (the last step jumps there from the x0 prediction).
    return np.linspace(1.0, 0.0, n + 1)[:-1].tolist()


def _flow_euler(cfg: SamplerConfig) -> FlowMatchEulerDiscreteScheduler:
    return FlowMatchEulerDiscreteScheduler(shift=cfg.shift)


def _ddim(cfg: SamplerConfig) -> DDIMScheduler:
    # DDIM's training grid is exactly the N flow sigmas we visit (t = N-1 ... 0), so its
    # integer "prev = t - T // N" arithmetic lands on the next visited sigma for any N and
    # the shift is honoured. FlowMatchEuler computes the shifted sigmas (ascending here).
    fm = _flow_euler(cfg)
    fm.set_timesteps(sigmas=_base_grid(cfg.num_inference_steps))
    sigma = fm.sigmas[:-1].flip(0).double().numpy()
    # Flow -> VP: sqrt(abar) = (1 - sigma) / r, r^2 = (1 - sigma)^2 + sigma^2. At sigma = 1,
    # abar = 0 exactly (beta = 1): the first step starts from pure noise.
    abar = (1.0 - sigma) ** 2 / ((1.0 - sigma) ** 2 + sigma**2)
    betas = 1.0 - abar / np.concatenate([[1.0], abar[:-1]])
    return DDIMScheduler(
        num_train_timesteps=cfg.num_inference_steps,
        trained_betas=betas,
        prediction_type="sample",  # we feed x0 = x_flow - sigma * v
        clip_sample=False,
        set_alpha_to_one=True,  # last step goes to abar = 1, i.e. sigma = 0
        timestep_spacing="trailing",
        steps_offset=0,
    )


def _make_scheduler(cfg: SamplerConfig) -> Scheduler:
    if cfg.name == "flow_euler":
        return _flow_euler(cfg)
    if cfg.name == "unipc":
        # Set flow_shift explicitly: UniPC.from_config(flow_match.config) silently drops `shift`.
        return UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=cfg.shift
        )
    if cfg.name == "dpmpp":
        return DPMSolverMultistepScheduler(
            algorithm_type="dpmsolver++",
            prediction_type="flow_prediction",
            use_flow_sigmas=True,
            flow_shift=cfg.shift,
        )
    return _ddim(cfg)


class FlowSampler:
    """Integrates the probability-flow ODE from noise (sigma ~ 1) to data (sigma = 0).

    ``sigmas`` (float32, CPU, length ``num_inference_steps``, decreasing) are the values
    passed to ``denoise``. UniPC and DPM++ use their built-in flow grids, which differ from
    the others' by at most 1e-3 before shifting (UniPC starts at 1 - 1e-6, DPM++ at 0.999).
    """

    def __init__(self, config: SamplerConfig | None = None) -> None:
        self.config = (config or SamplerConfig()).with_defaults(MOT_SAMPLER, MOT_SHIFT)
        self._template = _make_scheduler(self.config)
        probe = self._fresh(torch.device("cpu"))
        if isinstance(probe, DDIMScheduler):
            abar = probe.alphas_cumprod[probe.timesteps].double()
            a, b = abar.sqrt(), (1.0 - abar).sqrt()
            self.sigmas = (b / (a + b)).float()
            # x_flow = r * x_vp with r = 1 / (sqrt(abar) + sqrt(1 - abar)).
            self._vp_to_flow = (1.0 / (a + b)).float()
        else:
            # The solver's own float sigmas, not `timesteps`: UniPC/DPM++ store those as
            # int64 (sigma * 1000 truncated), which would feed the model a different sigma.
            self.sigmas = probe.sigmas[:-1].float().cpu()
            self._vp_to_flow = None

    @property
    def num_inference_steps(self) -> int:
        return len(self.sigmas)

    def _fresh(self, device: torch.device) -> Scheduler:
        sched = copy.deepcopy(self._template)
        if isinstance(sched, FlowMatchEulerDiscreteScheduler):
            sched.set_timesteps(sigmas=_base_grid(self.config.num_inference_steps), device=device)
        else:
            sched.set_timesteps(self.config.num_inference_steps, device=device)
        if hasattr(sched, "set_begin_index"):
            # Index steps by count, not by looking the timestep up: UniPC/DPM++ int timesteps
            # repeat near sigma = 1 (e.g. UniPC, 250 steps, shift 5: 999, 999, ...), and a
            # repeated first timestep makes diffusers start at index 1, skipping a step.
            sched.set_begin_index(0)
        return sched

    def sample(
        self, denoise: Denoiser, noise: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Denoise all modalities jointly; returns the final x0 per key in the noise dtype.

        ``denoise(latents, sigma)`` gets float32 flow-space latents (cast inside if the model
        runs in bf16) and must return the velocity ``noise - x0`` for every key. Runs in the
        caller's grad mode.
        """
        if not noise:
            raise ValueError("noise must hold at least one modality")
        flat = [k for k, n in noise.items() if n.ndim < 2]
        if flat:
            # UniPC's update einsums over (batch, order, channel, ...): it needs ndim >= 2.
            raise ValueError(f"noise tensors must be (B, ...) with ndim >= 2; got 1-D {flat}")
        device = next(iter(noise.values())).device
        scheds = {k: self._fresh(device) for k in noise}
        # Solver state: flow-space latents, or VP-space ones for DDIM (equal at sigma = 1).
        state = {k: n.float() for k, n in noise.items()}
        x0: dict[str, torch.Tensor] = {}
        for i in range(self.num_inference_steps):
            sigma = self.sigmas[i].to(device)
            scale = 1.0 if self._vp_to_flow is None else self._vp_to_flow[i].to(device)
            latents = {k: x * scale for k, x in state.items()}
            velocity = denoise(latents, sigma)
            missing = set(noise) - set(velocity)
            if missing:
                raise KeyError(f"denoise returned no velocity for {sorted(missing)}")
            for k, sched in scheds.items():
                v = velocity[k].float()
                if self._vp_to_flow is None:
                    state[k] = sched.step(v, sched.timesteps[i], state[k]).prev_sample
                else:
                    out = sched.step(latents[k] - sigma * v, int(sched.timesteps[i]), state[k])
                    state[k], x0[k] = out.prev_sample, out.pred_original_sample
        # Flow solvers end at sigma = 0, where the state is the x0 estimate; DDIM's last
        # x0 prediction is the same quantity without a VP round trip.
        final = state if self._vp_to_flow is None else x0
        return {k: final[k].to(noise[k].dtype) for k in noise}
