"""Policies for the server tests, built inside model workers (the tests put this folder on PYTHONPATH).

The state policies answer from the state alone, so a test knows every action to expect; a stand-in's
predict sleeps for "device time" and uses no CPU. The marker policies answer from where a bright pixel
arrived in each frame: the orientation tests' eyes inside the server.
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


class MarkerPolicy:
    """Says where each camera's brightest pixel is in the frame the server hands the model: chunk k of a
    row is ``[row / H, col / W]`` per camera, in the model's camera order. An orientation test sends a frame
    with one bright marker and reads where it arrived."""

    action_horizon = HORIZON

    def __init__(self, cameras):
        self.cameras = cameras

    def predict(self, obs, noise_seeds=None):
        where = []
        for camera in self.cameras:
            images = np.asarray(obs["pixels"][camera]).sum(axis=-1)  # (B, H, W)
            _, height, width = images.shape
            flat = images.reshape(len(images), -1).argmax(axis=1)
            where += [flat // width / height, flat % width / width]
        return {"actions": np.repeat(np.stack(where, axis=1)[:, None, :], HORIZON, axis=1).astype(np.float32)}


def make_marker(device: str) -> MarkerPolicy:
    return MarkerPolicy(os.environ.get("WAM_TEST_CAMERAS", "agentview,robot0_eye_in_hand").split(","))


class FramesProbe(MarkerPolicy):
    """Saves the frames a FastWAM of input convention WAM_TEST_CONVENTION (agents/wam/fastwam/inputs.py) would
    be fed, (B, 3, h, w * cameras) float32, to WAM_TEST_PROBE_DIR/<call>.npy, at WAM_TEST_IMAGE_SIZE pixels a
    camera; answers as MarkerPolicy."""

    def __init__(self, cameras):
        from agents.wam.fastwam.inputs import convention

        super().__init__(cameras)
        self.inputs, self.calls = convention(os.environ["WAM_TEST_CONVENTION"]), 0
        self.size = int(os.environ.get("WAM_TEST_IMAGE_SIZE", "224"))

    def predict(self, obs, noise_seeds=None):
        frames = self.inputs.frames(obs["pixels"], self.cameras, (self.size, self.size), len(obs["state"]))
        np.save(Path(os.environ["WAM_TEST_PROBE_DIR"]) / f"{self.calls}.npy", frames.numpy())
        self.calls += 1
        return super().predict(obs, noise_seeds)


def make_frames_probe(device: str) -> FramesProbe:
    return FramesProbe(os.environ.get("WAM_TEST_CAMERAS", "agentview,robot0_eye_in_hand").split(","))


class LingBotVAFramesProbe(MarkerPolicy):
    """Saves the frames LingBot-VA's input convention WAM_TEST_CONVENTION (agents/wam/lingbot_va/inputs.py) hands
    its VAE for each row's observation, (cameras, 3, 1, h, w) float32 as their server's ``_encode_obs`` stacks them,
    to WAM_TEST_PROBE_DIR/<call>.npy; answers as MarkerPolicy."""

    def __init__(self, cameras):
        from agents.wam.lingbot_va.inputs import convention

        super().__init__(cameras)
        self.inputs, self.calls = convention(os.environ["WAM_TEST_CONVENTION"]), 0

    def predict(self, obs, noise_seeds=None):
        video = self.inputs.video({camera: np.asarray(obs["pixels"][camera])[:1] for camera in self.cameras})
        np.save(Path(os.environ["WAM_TEST_PROBE_DIR"]) / f"{self.calls}.npy",
                np.stack([video[camera].numpy() for camera in self.cameras]))
        self.calls += 1
        return super().predict(obs, noise_seeds)


def make_lingbot_va_frames_probe(device: str) -> LingBotVAFramesProbe:
    return LingBotVAFramesProbe(os.environ.get("WAM_TEST_CAMERAS", "agentview,robot0_eye_in_hand").split(","))
