"""The rendering checks every suite's tests share, each run in the suite's own venv.

Render-everything against render-needed (issue 41): the same seed gives the same episode.
Every suite's test calls :func:`assert_render_needed_is_identical`. The
stand-in model reads every pixel it is sent (its actions are a function of each camera's mean
and the state), so a black or stale frame reaching it would change the actions, and with them
the rewards, the success and the step count. Numpy only: the suites' venvs have no model.
"""

from __future__ import annotations

import numpy as np

import envs
from agents import run_episode
from agents.chunk_queue import ChunkQueueAgent
from agents.policy import Prediction
from agents.predictor import Predictor
from envs.protocol import PIXELS, PIXELS_RENDERED, STATE

HORIZON = 8


class PixelPredictor(Predictor):
    """Chunks that depend on every pixel and the state: (B, HORIZON, A) in the action space's middle half."""

    def __init__(self, action_space):
        self.low, self.high = action_space.low, action_space.high
        self.action_horizon = HORIZON
        self.cost = None
        self.on_wait = None
        self.pixel_means: list[float] = []  # of every frame it was sent: a black frame would show here

    def predict(self, obs, noise_seeds=None) -> Prediction:
        means = np.stack([np.asarray(obs[PIXELS][c], np.float64).mean(axis=(1, 2, 3)) for c in sorted(obs[PIXELS])], 1)
        self.pixel_means.extend(means.ravel().tolist())
        phase = means.sum(1) / 255.0 + np.asarray(obs[STATE], np.float64).sum(1)
        steps, dims = np.arange(HORIZON), np.arange(self.low.shape[0])
        wave = np.sin(phase[:, None, None] * (1 + steps[None, :, None]) + dims[None, None, :])
        middle, half = (self.low + self.high) / 2, (self.high - self.low) / 4
        return Prediction((middle + half * wave).astype(np.float32))


def trajectory(env_id: str, lazy: bool, *, seed: int, steps: int, replan: int, **kwargs) -> dict:
    """One episode of the stand-in model: its actions, outcome, model calls and renders."""
    env = envs.make(env_id, lazy_pixels=lazy, **kwargs)
    predictor = PixelPredictor(env.action_space)
    agent = ChunkQueueAgent(predictor, replan_steps=replan, action_space=env.action_space)
    actions, renders = [], []
    try:
        episode = run_episode(env, agent, seed=seed, max_steps=steps, lazy_pixels=lazy,
                              observe=lambda obs, info: renders.append(info.get(PIXELS_RENDERED, True)),
                              after_act=lambda obs, action: actions.append(np.array(action)))
    finally:
        env.close()
    return {"actions": np.stack(actions), "steps": episode.steps, "reward": episode.reward,
            "success": episode.success, "calls": agent.num_model_calls, "pixel_means": predictor.pixel_means,
            "renders": sum(renders)}


def assert_render_needed_is_identical(env_id: str, *, seed: int = 0, steps: int = 40, replan: int = 8,
                                      **kwargs) -> dict:
    """Both modes give one episode; render-needed renders the reset and one step per replan."""
    every = trajectory(env_id, False, seed=seed, steps=steps, replan=replan, **kwargs)
    needed = trajectory(env_id, True, seed=seed, steps=steps, replan=replan, **kwargs)
    np.testing.assert_array_equal(needed["actions"], every["actions"])
    for key in ("steps", "reward", "success", "calls", "pixel_means"):
        assert needed[key] == every[key], key
    assert min(every["pixel_means"]) > 0  # the model saw real frames
    assert every["renders"] == every["steps"] + 1  # the reset and every step
    # the reset, then the observation of each later replan (plus the last one, when the step limit
    # ends the episode on a replan step: the runner cannot know that nobody will read it)
    assert every["calls"] <= needed["renders"] <= every["calls"] + 1, (needed["renders"], every["calls"])
    return needed


def assert_robosuite_cameras_upright(env, up) -> None:
    """Segmentation in a robosuite env's own frames (LIBERO's too): the table low in agentview, the fingers at the
    bottom of the wrist view, and the gripper moving up in agentview while ``up`` (an action) raises it."""
    from envs.rendering import geoms_of_bodies

    env.reset(seed=0)
    model, data = env._sim.sim.model._model, env._sim.sim.data._data
    gripper, table = geoms_of_bodies(model, "gripper0"), geoms_of_bodies(model, "table")

    def rows(camera, geoms):
        return env._camera_rig.mean_row(data, camera, geoms)

    assert rows("agentview", table) > env.height / 2
    assert rows("robot0_eye_in_hand", gripper) > env.height / 2
    before, z0 = rows("agentview", gripper), env._sim_state()[2]
    for _ in range(5):  # a few cm: more leaves the frame
        env.step(up)
    assert env._sim_state()[2] > z0 + 0.02  # it did rise
    assert rows("agentview", gripper) < before - 3
