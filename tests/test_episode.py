"""The one episode runner (agents.episode.run_episode) and the one agent factory, on a stand-in env."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from agents import MetaWorldExpertAgent, RandomAgent, check_agent_fits_env, make_agent, run_episode
from envs.protocol import IS_SUCCESS, STATE


class CountingEnv:
    """Reward 1 a step; succeeds at step ``succeed_at``, terminates at ``end_at``."""

    def __init__(self, succeed_at: int = 3, end_at: int = 5, limit: int | None = None):
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.spec = None if limit is None else gymnasium.envs.registration.EnvSpec("Counting-v0", max_episode_steps=limit)
        self.succeed_at, self.end_at = succeed_at, end_at
        self.t, self.seeds = 0, []

    def reset(self, seed=None, options=None):
        self.t = 0
        self.seeds.append(seed)
        return {STATE: np.zeros(2, np.float32)}, {IS_SUCCESS: False}

    def step(self, action):
        self.t += 1
        obs = {STATE: np.full(2, self.t, np.float32)}
        return obs, 1.0, self.t >= self.end_at, False, {IS_SUCCESS: self.t == self.succeed_at, "t": self.t}


def test_counts_steps_reward_and_success_at_any_step():
    env = CountingEnv(succeed_at=2, end_at=4)
    seen = []
    episode = run_episode(env, make_agent("random", action_space=env.action_space, seed=0), seed=9,
                          after_act=lambda obs, action: seen.append(float(obs[STATE][0])))
    assert (episode.steps, episode.reward, episode.success, episode.seed) == (4, 4.0, True, 9)
    assert episode.info["t"] == 4 and env.seeds == [9]
    assert seen == [0.0, 1.0, 2.0, 3.0]  # each action with the observation it answers


def test_step_limit_is_max_steps_else_the_registered_one():
    assert run_episode(CountingEnv(end_at=100), RandomAgent(CountingEnv().action_space), max_steps=7).steps == 7
    assert run_episode(CountingEnv(end_at=100, limit=6), RandomAgent(CountingEnv().action_space)).steps == 6


def test_observe_sees_every_observation_and_can_abandon_before_acting():
    env = CountingEnv(end_at=3)
    infos = []
    run_episode(env, RandomAgent(env.action_space), observe=lambda obs, info: infos.append(info.get("t")))
    assert infos == [None, 1, 2, 3]  # the reset's, then every step's

    class Stop(Exception):
        pass

    def stop(obs, info):
        raise Stop

    env = CountingEnv()
    with pytest.raises(Stop):
        run_episode(env, RandomAgent(env.action_space), observe=stop)
    assert env.t == 0  # not one step


def test_agent_factory():
    space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    assert isinstance(make_agent("expert"), MetaWorldExpertAgent)
    a, b = make_agent("random", action_space=space, seed=3), make_agent("random", action_space=space, seed=3)
    np.testing.assert_array_equal(a.act({STATE: np.zeros(4)}), b.act({STATE: np.zeros(4)}))
    with pytest.raises(ValueError, match="choose one of"):
        make_agent("oracle")
    with pytest.raises(ValueError, match="predictor"):
        make_agent("wam")
    check_agent_fits_env("expert", "wam_gym/MetaWorld-reach-v3")
    with pytest.raises(ValueError, match="--agent random"):
        check_agent_fits_env("expert", "wam_gym/Robosuite-Lift-v0")
