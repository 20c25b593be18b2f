"""Real-time chunking inside a flow-matching sampler: guided inpainting of the committed prefix.

Black, Galliker, Levine 2025 (agents/rtc.py has the request side: knobs, entries, soft mask). At each
denoising step of the actions ``x`` at noise level ``sigma`` (Wan's convention: ``x = (1 - sigma) x0 +
sigma noise``, the model predicts ``v = noise - x0``), with target ``Y`` (the current chunk's remaining
actions, in the model's normalised space) and soft mask ``W``::

    x0 = x - sigma v(x)
    g = (Y - x0)^T diag(W) dx0/dx                  (one vector-Jacobian product through the model)
    v <- v - min(beta, (sigma^2 + (1 - sigma)^2) / (sigma (1 - sigma))) g

The weight is the paper's ``(1 - tau) / (tau r_tau^2)`` at ``tau = 1 - sigma`` (their time runs from noise
at 0 to data at 1; ours from noise at 1): infinite at both ends, hence the clip. Each row has its own
target and mask, so rows with different delays share one call; a row with a zero mask gets ``g = 0``
exactly. Only the actions are guided: in joint video mode the video latents are not steered (they see the
actions through attention).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from agents.rtc import Request, RTCConfig


def guidance_weight(sigma: torch.Tensor, beta: float) -> torch.Tensor:
    """The paper's guidance weight at noise level ``sigma`` (tensor), clipped at ``beta``."""
    sigma = sigma.double()
    weight = (sigma**2 + (1 - sigma) ** 2) / (sigma * (1 - sigma))  # inf at sigma 0 or 1: the clip takes it
    return torch.nan_to_num(weight, posinf=beta).clamp(max=beta)


@dataclass
class PrefixGuide:
    """One call's guidance: ``target`` and ``weights`` broadcastable to the action latents (normalised model
    space, the sampler's layout), ``beta`` the clip."""

    target: torch.Tensor
    weights: torch.Tensor
    beta: float

    @classmethod
    def of(cls, request: Request | None, config: RTCConfig, to_model: Callable[[np.ndarray], np.ndarray],
           device: torch.device | str) -> PrefixGuide | None:
        """The guide of a request whose ``(B, H, A)`` env-unit prefix ``to_model`` maps to the model's normalised
        ``(B, H, A)``; None when no row has an action to continue (the plain sampler runs, bit for bit)."""
        if request is None or not request.guides:
            return None
        target = torch.from_numpy(np.ascontiguousarray(to_model(request.prefix), dtype=np.float32)).to(device)
        weights = torch.from_numpy(request.mask(config)).to(device)[..., None]  # (B, H, 1)
        return cls(target, weights, float(config.max_guidance_weight))

    def velocity(self, velocity_of: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                 sigma: torch.Tensor) -> torch.Tensor:
        """The guided velocity at ``x``: ``velocity_of(x)`` is the model's (a function of ``x`` alone, the rest of
        the call held); ``sigma`` the noise level, a scalar or per row (broadcastable to ``x``)."""
        sigma = torch.as_tensor(sigma, device=x.device)
        sigma = sigma.reshape(-1, *([1] * (x.ndim - 1))) if sigma.ndim else sigma
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            v = velocity_of(x)
            x0 = x - sigma.to(v.dtype) * v
            error = ((self.target.to(x0.dtype) - x0) * self.weights.to(x0.dtype)).detach()
            (correction,) = torch.autograd.grad(x0, x, error)
        weight = guidance_weight(sigma, self.beta).to(v.dtype)
        return (v - weight * correction).detach()
