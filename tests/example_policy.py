"""An example Policy for ``EVALUATION.agent=python EVALUATION.policy=tests.example_policy:make_policy``.

Any object with an ``action_horizon`` and ``predict(obs, noise_seeds=None)`` is a Policy
(agents/policy.py); ``make_policy(device)`` is called once in each model worker.
"""

import numpy as np


class StatePolicy:
    action_horizon = 4  # actions per predicted chunk
    num_inference_steps = 1  # optional: denoising steps per call, counted in the results' cost columns

    def predict(self, obs, noise_seeds=None):
        state = np.asarray(obs["state"], np.float32)  # (B, state_dim); obs["pixels"][camera] is (B, H, W, 3) uint8
        action = np.clip(-state[:, :4], -1.0, 1.0)  # (B, 4): Meta-World's xyz + gripper, from the state alone
        return {"actions": np.repeat(action[:, None], self.action_horizon, axis=1)}  # (B, horizon, 4)


def make_policy(device: str) -> StatePolicy:
    return StatePolicy()  # a torch model would be built and moved to `device` here
