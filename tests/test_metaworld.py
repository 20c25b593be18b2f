"""Meta-World through the wam_gym contract, with real offscreen rendering."""

import numpy as np
import pytest

metaworld = pytest.importorskip("metaworld")

import gymnasium  # noqa: E402

import envs  # noqa: E402
from agents import MetaWorldExpertAgent, RandomAgent  # noqa: E402
from envs.metaworld import INSTRUCTIONS, SUITE, TASKS  # noqa: E402
from envs.rendering import geoms_of_bodies  # noqa: E402
from tests.conftest import check_registered_env  # noqa: E402
from wam_gym.eval.rollout import run_episodes  # noqa: E402

PICK_PLACE = "wam_gym/MetaWorld-pick-place-v3"


def test_all_mt50_tasks_registered():
    """Our task list is Meta-World's own MT50, each task registered with Meta-World's episode limit."""
    from metaworld.env_dict import MT50_V3

    assert sorted(f"{t}-v3" for t in TASKS) == sorted(MT50_V3)
    ids = [i for i in gymnasium.registry if i.startswith("wam_gym/MetaWorld-")]
    assert sorted(ids) == sorted(SUITE.env_kwargs) == sorted(f"wam_gym/MetaWorld-{name}" for name in MT50_V3)
    for name, env_cls in MT50_V3.items():
        assert gymnasium.spec(f"wam_gym/MetaWorld-{name}").max_episode_steps == env_cls.max_path_length


def test_observation_contract_at_configured_resolution():
    env = gymnasium.make(PICK_PLACE, cameras=("corner", "gripperPOV"), image_size=(48, 64), render_mode="rgb_array")
    obs, info = env.reset(seed=0)
    assert set(obs) == {"pixels", "state", "instruction", "privileged_state"}
    for cam in ("corner", "gripperPOV"):
        assert obs["pixels"][cam].shape == (48, 64, 3) and obs["pixels"][cam].dtype == np.uint8
        assert obs["pixels"][cam].std() > 5  # a real picture, not a blank buffer
    assert obs["state"].shape == (4,) and obs["state"].dtype == np.float32
    assert obs["instruction"] == INSTRUCTIONS["pick-place"]
    assert info["is_success"] is False
    obs, _, terminated, truncated, info = env.step(env.action_space.sample())
    assert isinstance(info["is_success"], bool) and not terminated and not truncated
    np.testing.assert_array_equal(env.render(), obs["pixels"]["corner"])
    env.close()


# One task in the quick run (make test-fast), all 50 (a few seconds each) in make test.
@pytest.mark.parametrize("task", [t if t == "pick-place" else pytest.param(t, marks=pytest.mark.slow) for t in TASKS])
def test_gymnasium_env_checker(task):
    check_registered_env(f"wam_gym/MetaWorld-{task}-v3", render_mode="rgb_array")


def test_seeded_resets_are_reproducible():
    env = gymnasium.make(PICK_PLACE)
    a, _ = env.reset(seed=7)
    b, _ = env.reset(seed=7)
    c, _ = env.reset(seed=8)
    np.testing.assert_array_equal(a["privileged_state"], b["privileged_state"])
    np.testing.assert_array_equal(a["pixels"]["corner"], b["pixels"]["corner"])
    assert not np.allclose(a["privileged_state"][4:7], c["privileged_state"][4:7])  # object moved
    env.close()


@pytest.mark.parametrize("camera", ["corner", "corner2", "corner3", "corner4"])
def test_camera_is_upright(camera):
    """Raising the gripper must move it up in the picture (catches upside-down cameras).

    These are the fixed side views; topview looks straight down and the other two ride on the hand.
    """
    env = gymnasium.make(PICK_PLACE, cameras=(camera,), image_size=96).unwrapped
    env.reset(seed=0)
    model = env._sim.model
    hand_geoms = [g for part in ("hand", "rightclaw", "leftclaw", "rightpad", "leftpad") for g in geoms_of_bodies(model, part)]

    def hand_row() -> float:
        return env._camera_rig.mean_row(env._sim.data, camera, hand_geoms)

    before = hand_row()
    for _ in range(25):
        env.step(np.array([0, 0, 1, 0], np.float32))
    assert hand_row() < before - 2
    env.close()


def test_async_vector_env_batches_pixels_state_and_instructions():
    vec = gymnasium.make_vec(
        PICK_PLACE, num_envs=2, vectorization_mode="async", vector_kwargs={"context": "forkserver"}, image_size=32
    )
    obs, _ = vec.reset(seed=[0, 1])
    assert obs["pixels"]["corner"].shape == (2, 32, 32, 3)
    assert obs["state"].shape == (2, 4)
    assert tuple(obs["instruction"]) == (INSTRUCTIONS["pick-place"],) * 2
    obs, _, _, _, info = vec.step(np.zeros((2, 4), np.float32))
    assert tuple(obs["instruction"]) == (INSTRUCTIONS["pick-place"],) * 2
    assert info["is_success"].shape == (2,)
    vec.close()


def test_fork_after_rendering_fails_clearly():
    parent = gymnasium.make(PICK_PLACE, image_size=32)
    parent.reset(seed=0)  # the parent now holds a GL context
    vec = gymnasium.make_vec(PICK_PLACE, num_envs=1, vectorization_mode="async", vector_kwargs={"context": "fork"})
    with pytest.raises(Exception, match="forkserver"):
        vec.reset(seed=0)
    vec.close(terminate=True)
    parent.close()


# The rollouts below read no pixels: their envs render at reset only (lazy_pixels; the outcomes are the same,
# tests/test_render_needed.py), as a render costs ~20x a step's physics on a CPU.
@pytest.mark.slow  # 50 expert episodes
def test_scripted_expert_solves_five_tasks():
    agent = MetaWorldExpertAgent()
    for task in ("reach", "button-press", "pick-place", "push", "drawer-close"):
        vec = envs.make_vec(f"wam_gym/MetaWorld-{task}-v3", 2, vectorization_mode="sync", cameras=("corner",), image_size=32,
                            lazy_pixels=True)
        results = run_episodes(vec, agent, seeds=list(range(10)), lazy_pixels=True)
        vec.close()
        assert [r.episode for r in results] == list(range(10))
        rate = np.mean([r.success for r in results])
        assert rate >= 0.9, f"{task}: expert success {rate:.0%}"


@pytest.mark.slow  # two full 500-step episodes
def test_random_agent_rarely_succeeds_and_episodes_truncate_at_limit():
    vec = envs.make_vec("wam_gym/MetaWorld-pick-place-v3", 2, vectorization_mode="sync", cameras=("corner",), image_size=16,
                        lazy_pixels=True)
    results = run_episodes(vec, RandomAgent(vec.single_action_space, seed=0), seeds=[0, 1], lazy_pixels=True)
    vec.close()
    assert [r.steps for r in results] == [500, 500] and not any(r.success for r in results)


def test_episode_seeds_fix_episodes_whatever_the_slot():
    """Episode k is the same episode in a 1-env and a 3-env vector (resume relies on it)."""
    agent = MetaWorldExpertAgent()
    runs = []
    for n in (1, 3):
        vec = envs.make_vec("wam_gym/MetaWorld-reach-v3", n, vectorization_mode="sync", cameras=("corner",), image_size=16,
                            lazy_pixels=True)
        runs.append(run_episodes(vec, agent, seeds=[11, 12, 13, 14], lazy_pixels=True))
        vec.close()
    assert runs[0] == runs[1]


def test_bad_inputs_give_clear_errors():
    with pytest.raises(envs.UnknownEnvError, match="Did you mean wam_gym/MetaWorld-pick-place-v3"):
        envs.make("wam_gym/MetaWorld-pick-plase-v3")
    with pytest.raises(ValueError, match="unknown Meta-World camera.*choose from"):
        gymnasium.make(PICK_PLACE, cameras=("front",))
    with pytest.raises(ValueError, match="unknown Meta-World task"):
        envs.metaworld.env.MetaWorldEnv(task="fly")
    env = gymnasium.make(PICK_PLACE, image_size=16)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must have shape \(4,\)"):
        env.step(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.array([0, np.nan, 0, 0], np.float32))
    env.close()
    with pytest.raises(ValueError, match="image_size"):
        gymnasium.make(PICK_PLACE, image_size=(0, 3))
