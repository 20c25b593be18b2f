"""robosuite through the wam_gym contract, with real offscreen rendering (run in .venv-robosuite)."""


import numpy as np
import pytest

pytest.importorskip("robosuite")

import gymnasium  # noqa: E402

from envs.robosuite import INSTRUCTIONS, SUITE, TASKS  # noqa: E402
from tests.conftest import check_registered_env, made_without_importing_envs

LIFT = "wam_gym/Robosuite-Lift-v0"
UP = np.array([0, 0, 0.5, 0, 0, 0, -1], np.float32)  # +z at half scale, gripper open


@pytest.fixture(scope="module")
def lift():
    env = gymnasium.make(LIFT, render_mode="rgb_array")
    yield env
    env.close()


def test_tasks_registered_with_limits():
    ids = sorted(i for i in gymnasium.registry if i.startswith("wam_gym/Robosuite-"))
    assert ids == sorted(SUITE.env_kwargs) and len(ids) == len(TASKS)
    assert gymnasium.spec(LIFT).max_episode_steps == 400
    assert gymnasium.spec("wam_gym/Robosuite-Stack-v0").max_episode_steps == 500


def test_observation_contract(lift):
    obs, info = lift.reset(seed=0)
    assert set(obs) == {"pixels", "state", "instruction"}
    for cam in ("agentview", "robot0_eye_in_hand"):
        frame = obs["pixels"][cam]
        assert frame.shape == (128, 128, 3) and frame.dtype == np.uint8 and frame.std() > 5
    assert obs["state"].shape == (9,) and obs["state"].dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(obs["state"][3:7]), 1.0, atol=1e-4)  # a unit quaternion
    assert obs["instruction"] == INSTRUCTIONS["Lift"] and isinstance(obs["instruction"], str)
    assert lift.observation_space.contains(obs) and info["is_success"] is False
    assert lift.action_space.shape == (7,)
    obs, reward, terminated, truncated, info = lift.step(lift.action_space.sample())
    assert isinstance(info["is_success"], bool) and not terminated and not truncated
    np.testing.assert_array_equal(lift.render(), obs["pixels"]["agentview"])


def test_image_size_and_cameras_are_configurable():
    env = gymnasium.make(LIFT, cameras=("frontview",), image_size=(48, 64))
    obs, _ = env.reset(seed=0)
    assert set(obs["pixels"]) == {"frontview"} and obs["pixels"]["frontview"].shape == (48, 64, 3)
    env.close()


def test_cameras_are_upright(lift):
    from tests.render_check import assert_robosuite_cameras_upright

    assert_robosuite_cameras_upright(lift.unwrapped, UP)


def test_seeded_resets_are_reproducible(lift):
    env = lift.unwrapped
    a, _ = lift.reset(seed=7)
    state_a = env._sim.sim.get_state().flatten()
    lift.reset(seed=8)
    state_c = env._sim.sim.get_state().flatten()
    b, _ = lift.reset(seed=7)
    np.testing.assert_array_equal(state_a, env._sim.sim.get_state().flatten())
    np.testing.assert_array_equal(a["state"], b["state"])
    np.testing.assert_array_equal(a["pixels"]["agentview"], b["pixels"]["agentview"])
    assert not np.allclose(state_a, state_c)  # another seed, another cube placement


@pytest.mark.parametrize("task", TASKS)
def test_gymnasium_env_checker(task):
    check_registered_env(f"wam_gym/Robosuite-{task}-v0", render_mode="rgb_array", image_size=64)


def test_make_needs_no_import_of_envs():
    out = made_without_importing_envs(LIFT, "agentview", image_size=32)
    assert out.startswith("(32, 32, 3) ") and out.strip().endswith("True")


def test_bad_inputs_give_clear_errors(lift):
    with pytest.raises(ValueError, match=r"unknown camera.*'nocam'.*agentview"):
        gymnasium.make(LIFT, cameras=("nocam",))
    with pytest.raises(ValueError, match="unknown robosuite task.*Lift"):
        gymnasium.make(LIFT, task="Fly")
    lift.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must have shape \(7,\)"):
        lift.step(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        lift.step(np.full(7, np.nan, np.float32))


def test_async_vector_env_steps():
    vec = gymnasium.make_vec(
        LIFT, num_envs=2, vectorization_mode="async", vector_kwargs={"context": "forkserver"}, image_size=32
    )
    obs, _ = vec.reset(seed=[0, 1])
    assert obs["pixels"]["agentview"].shape == (2, 32, 32, 3) and obs["state"].shape == (2, 9)
    assert not np.allclose(obs["state"][0], obs["state"][1])  # seeds 0 and 1: different initial arms
    for _ in range(3):
        obs, _, _, _, info = vec.step(np.zeros((2, 7), np.float32))
    assert tuple(obs["instruction"]) == (INSTRUCTIONS["Lift"],) * 2 and info["is_success"].shape == (2,)
    vec.close()


def test_software_rendering_skips_shadows(lift):
    """Shadow maps cost ~25x in software GL; the camera rig turns them off."""
    lift.reset(seed=0)
    quality = lift.unwrapped._camera_rig.model.vis.quality
    assert quality.shadowsize == 0 and quality.offsamples == 0


def test_rendering_only_what_is_read_changes_nothing():
    """Issue 41: the same seed, render-everything or render-needed, gives the same actions and outcome."""
    from tests.render_check import assert_render_needed_is_identical

    assert_render_needed_is_identical(LIFT, seed=0, steps=40, replan=8)
