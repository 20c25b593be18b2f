"""FastWAM's flow-matching schedule, one per modality (their ``WanContinuousFlowMatchScheduler``).

Convention (Wan's, as in :mod:`agents.wam.sampling`): ``x_t = (1 - sigma) x0 + sigma noise``, the model
predicts ``noise - x0`` and is told the timestep ``sigma x num_train_timesteps``. The noise levels are
``sigma = s u / (1 + (s - 1) u)``: for training ``u`` is uniform, for inference ``u = 1, 1 - 1/N, ..., 0``
and each of the N steps is one Euler step. The grid is the one ``sampler=flow_euler`` visits (diffusers'
FlowMatchEuler at the same shift), kept here in FastWAM's own float32 arithmetic so that the timesteps
the model sees are theirs to the last bit.
"""

from __future__ import annotations

import torch

from agents.wam.fastwam.config import FlowScheduleConfig


def shifted(u: torch.Tensor, shift: float) -> torch.Tensor:
    """The noise level of ``u`` in [0, 1] under ``shift``: more of the grid at high noise for shift > 1."""
    return shift * u / (1.0 + (shift - 1.0) * u)


class FlowSchedule:
    def __init__(self, config: FlowScheduleConfig):
        self.config = config
        # The training weight is a bell over the timestep, shifted to 0 at its lowest point on the shifted
        # training grid and scaled to mean 1 there (their normalisation, in float64).
        steps = config.num_train_timesteps
        grid = shifted(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)[:-1], config.train_shift) * steps
        bell = self._bell(grid)
        self._floor = float(bell.min())
        self._mean = float((bell - self._floor).mean())

    def _bell(self, timesteps: torch.Tensor) -> torch.Tensor:
        steps = self.config.num_train_timesteps
        return torch.exp(-2.0 * ((timesteps - steps / 2.0) / steps) ** 2)

    def inference(self, steps: int, shift: float | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(timesteps, deltas), each (steps,) float32: the model's timestep at each step and the change of
        sigma the Euler step makes (negative). ``shift`` overrides the config's ``infer_shift`` (their
        ``sigma_shift``)."""
        if steps < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {steps}")
        shift = self.config.infer_shift if shift is None else float(shift)
        if not shift > 0:
            raise ValueError(f"shift must be > 0, got {shift}")
        sigma = shifted(torch.linspace(1.0, 0.0, steps + 1, device=device, dtype=torch.float32), shift)
        return sigma[:-1] * float(self.config.num_train_timesteps), sigma[1:] - sigma[:-1]

    def sample_timesteps(self, batch: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
        """(batch,) training timesteps: sigma at uniform ``u`` under ``train_shift``, x num_train_timesteps."""
        u = torch.rand(batch, generator=generator, dtype=torch.float32).to(device)
        return shifted(u, self.config.train_shift) * float(self.config.num_train_timesteps)

    def training_weight(self, timesteps: torch.Tensor) -> torch.Tensor:
        """Per-row weight of the flow-matching loss at ``timesteps`` (mean 1 over the training grid)."""
        return (self._bell(timesteps.float()) - self._floor) / (self._mean + 1e-10)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        sigma = (timesteps / float(self.config.num_train_timesteps)).to(x0.dtype).view(-1, *([1] * (x0.ndim - 1)))
        return (1 - sigma) * x0 + sigma * noise


def euler_step(sample: torch.Tensor, velocity: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """One step along the predicted velocity: sigma changes by ``delta``, in the sample's dtype (their step's)."""
    return sample + velocity.to(sample.dtype) * delta.to(sample.dtype)
