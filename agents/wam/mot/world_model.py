"""The WAM as a world model: given the current frame and an action chunk, imagine what follows.

UnifoLM-WMA's simulation mode: the same MoT weights, with the actions given clean (noise
level 0) instead of denoised, so only the future video is sampled. A model trained with
``world_model_prob > 0`` has seen exactly this; with ``action_expert.predict_state`` it also
reads off the state after each action.

``WorldModel.predict`` takes a contract observation plus ``action`` (B, T, A) in env units and
returns the imagined frames; it is a drop-in policy for the inference broker, so one broker
can serve imagination to many :class:`wam_gym.world_model.env.WorldModelEnv` copies.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from agents.wam.frames import video_to_uint8
from agents.wam.mot.policy import MoTPolicy
from agents.wam.policy import Prediction, _rows
from envs.protocol import ACTION

logger = logging.getLogger(__name__)


class WorldModel(MoTPolicy):
    """Action-conditioned video prediction with a WAM checkpoint (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.model.config.video_mode != "joint" or self.model.config.num_future_frames == 0:
            raise ValueError(
                "a world model must predict video: load the checkpoint with video_mode=joint and num_future_frames > 0"
            )

    @property
    def predicts_state(self) -> bool:
        return self.model.action_expert.state_out is not None

    def _actions(self, actions: Any, batch: int) -> torch.Tensor:
        """(B, n, A) env-unit actions, n <= horizon, padded by repeating the last -> normalised (B, T, A)."""
        cfg = self.model.config
        actions = np.asarray(actions)
        shape_ok = actions.ndim == 3 and actions.shape[0] == batch and actions.shape[2] == cfg.action_dim
        if not (shape_ok and 1 <= actions.shape[1] <= cfg.action_horizon):
            raise ValueError(
                f"action is {actions.dtype} {actions.shape}; the world model needs float (B, n, {cfg.action_dim}) "
                f"with B={batch} and 1 <= n <= action_horizon={cfg.action_horizon}"
            )
        if not np.all(np.isfinite(actions)):
            raise ValueError("action contains NaN or inf; the world model imagines only finite actions")
        pad = cfg.action_horizon - actions.shape[1]
        actions = np.concatenate([actions, np.repeat(actions[:, -1:], pad, axis=1)], axis=1)
        return torch.from_numpy(self.normalizer.normalize_actions(actions)).to(self.model.device)

    @torch.no_grad()
    def predict(self, obs: Mapping[str, Any], noise_seeds: Sequence[int] | None = None) -> Prediction:
        """Imagine the future of a batch of observations under ``obs["action"]`` (B, n, A).

        Returns the given actions (padded to the horizon), ``video`` (B, 1 + F, H, W * cameras, 3)
        uint8 (frame 0 reconstructs the present) and, with a state head, ``states`` (B, T, S) in
        env units (else None).
        """
        batch = _rows(obs)
        current, state, text = self._condition(obs, batch)
        actions = self._actions(obs[ACTION], batch)
        future = self.sample(current, state, text, noise_seeds, actions=actions)["video"]
        latents = torch.cat([current, future], dim=2)
        states = None
        if self.predicts_state:
            zero = torch.zeros(batch, device=self.model.device)
            _, _, next_states = self.model(latents, zero, actions, zero, state, text, return_state=True)
            states = self.normalizer.unnormalize_state(next_states.cpu().numpy())
        video = self.model.config.output_frames(video_to_uint8(self.model.decode_latents(latents)))
        return Prediction(actions=self.normalizer.unnormalize_actions(actions.cpu().numpy()), video=video, states=states)
