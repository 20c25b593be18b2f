"""LingBot-VA's flow-matching schedule (their wan_va/utils/scheduler.py ``FlowMatchScheduler`` as their server
builds it: ``sigma_min=0``, ``extra_one_step=True``, 1000 training timesteps).

N inference steps visit the noise levels u = 1, 1 - 1/N, ..., 1/N, shifted by the SNR shift s to
sigma = s u / (1 + (s - 1) u); the timestep the model sees is sigma x 1000. An Euler step moves a sample
along the predicted velocity to the next level (0 after the last). Their server then runs one more call
at timestep 0 on the denoised sample, only to write it into the KV cache (:mod:`agents.wam.lingbot_va.sampling`).
Computed in float32 in their order of operations.

Training (:mod:`agents.wam.lingbot_va.objective`) uses the same schedule at 1000 levels (their trainer's
``set_timesteps(1000, training=True)``): a level is drawn per latent frame, and its loss is weighted by
:meth:`FlowSchedule.training_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class FlowSchedule:
    """The noise levels of one stream's denoising, and the timesteps the model sees at each."""

    sigmas: torch.Tensor  # (N,) float32, from 1 down, each step's level
    timesteps: torch.Tensor  # (N,) float32, sigmas x 1000

    @classmethod
    def build(cls, steps: int, shift: float) -> FlowSchedule:
        if steps < 1 or not shift > 0:
            raise ValueError(f"a flow schedule needs steps >= 1 and shift > 0, got steps={steps}, shift={shift}")
        u = torch.linspace(1.0, 0.0, steps + 1)[:-1]
        sigmas = shift * u / (1 + (shift - 1) * u)
        return cls(sigmas, sigmas * NUM_TRAIN_TIMESTEPS)

    @classmethod
    def training(cls, shift: float) -> FlowSchedule:
        """The 1000 levels training draws from (level 0 is pure noise, the last the least noisy)."""
        return cls.build(NUM_TRAIN_TIMESTEPS, shift)

    def training_weights(self) -> torch.Tensor:
        """(N,) their loss weight of each level (``linear_timesteps_weights``): a bell over the timestep,
        exp(-2 ((t - N/2) / N)^2), moved to 0 at its lowest and scaled to sum to N."""
        n = len(self)
        bell = torch.exp(-2 * ((self.timesteps - n / 2) / n) ** 2)
        shifted = bell - bell.min()
        return shifted * (n / shifted.sum())

    def __len__(self) -> int:
        return self.sigmas.numel()

    def step(self, sample: torch.Tensor, velocity: torch.Tensor, index: int) -> torch.Tensor:
        """Euler step ``index`` from level sigmas[index] to the next (0 after the last)."""
        following = self.sigmas[index + 1] if index + 1 < len(self) else 0
        return sample + velocity * (following - self.sigmas[index])
