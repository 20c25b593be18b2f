"""Policies for the server tests, built inside model workers (the tests put this folder on PYTHONPATH).

Each answers from the state alone, so a test knows every action to expect; a stand-in's predict
sleeps for "device time" and uses no CPU.
"""

import os
import time
from pathlib import Path

import numpy as np

HORIZON = 4


class StatePolicy:
    """Chunk k of a row is its state + k (action_dim = state_dim), after ``delay_s`` of device time."""

    action_horizon = HORIZON

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s

    def predict(self, obs, noise_seeds=None):
        time.sleep(self.delay_s)
        state = np.asarray(obs["state"], np.float32)
        return {"actions": state[:, None, :] + np.arange(HORIZON, dtype=np.float32)[None, :, None]}


def make_slow(device: str) -> StatePolicy:
    return StatePolicy(float(os.environ.get("WAM_TEST_DELAY_S", "1.0")))


def make_gated(device: str) -> StatePolicy:
    """Loads only once the file WAM_TEST_GATE exists: a model still loading, for as long as a test needs."""
    while not Path(os.environ["WAM_TEST_GATE"]).exists():
        time.sleep(0.05)
    return StatePolicy()
