"""Render only what is read (issue 41): lazy envs, the runners that ask for frames, same outcomes.

The suites' own tests (tests/suites/) run :func:`tests.render_check.assert_render_needed_is_identical`
in their venvs; Meta-World's runs here.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("metaworld")

import envs  # noqa: E402
from agents.chunk_queue import ChunkQueueAgent  # noqa: E402
from envs.protocol import PIXELS, PIXELS_RENDERED  # noqa: E402
from tests.render_check import PixelPredictor, assert_render_needed_is_identical  # noqa: E402
from wam_gym.eval.rollout import run_episodes  # noqa: E402

REACH = "wam_gym/MetaWorld-reach-v3"


def test_a_lazy_env_renders_at_reset_and_when_asked_only():
    lazy, eager = envs.make(REACH, image_size=32, lazy_pixels=True), envs.make(REACH, image_size=32)
    try:
        obs, info = lazy.reset(seed=1)
        reference, _ = eager.reset(seed=1)
        assert info[PIXELS_RENDERED] and PIXELS_RENDERED not in eager.reset(seed=1)[1]  # the default: no such key
        action = np.full(lazy.action_space.shape, 0.3, np.float32)
        obs, *_, info = lazy.step(action)
        reference, *_ = eager.step(action)
        assert not info[PIXELS_RENDERED] and all(not f.any() for f in obs[PIXELS].values())  # black, and said so
        lazy.unwrapped.pixels_requested = True
        obs, *_, info = lazy.step(action)
        reference, *_ = eager.step(action)
        assert info[PIXELS_RENDERED] and not lazy.unwrapped.pixels_requested  # one step, then cleared
        for camera, frame in reference[PIXELS].items():
            np.testing.assert_array_equal(obs[PIXELS][camera], frame)
        np.testing.assert_array_equal(obs["state"], reference["state"])
    finally:
        lazy.close()
        eager.close()


@pytest.mark.parametrize("replan", [1, 5])
def test_metaworld_episode_is_identical_rendering_only_what_is_read(replan):
    assert_render_needed_is_identical(REACH, seed=3, steps=30, replan=replan, image_size=32)


def test_the_vectorised_runner_renders_each_env_only_when_its_queue_runs_dry():
    def run(lazy: bool):
        vec = envs.make_vec(REACH, 2, vectorization_mode="sync", image_size=32, lazy_pixels=lazy, max_episode_steps=20)
        predictor = PixelPredictor(vec.single_action_space)
        agent = ChunkQueueAgent(predictor, replan_steps=3, action_space=vec.single_action_space)
        try:
            return run_episodes(vec, agent, seeds=[0, 1, 2], lazy_pixels=lazy), predictor.pixel_means
        finally:
            vec.close()

    (every, every_seen), (needed, needed_seen) = run(False), run(True)
    assert every == needed and every_seen == needed_seen and min(needed_seen) > 0


def test_eval_records_imagination_and_videos_are_identical_either_way(tmp_path, tiny_ckpt):
    """EVALUATION.render=needed (the default) against every_step, imagination score and strided video on."""
    from tests.test_eval import records, run, wam_config
    from wam_gym.utils.video import read_mp4

    runs = {}
    for render in ("every_step", "needed"):
        out = tmp_path / render
        run(wam_config(out, tiny_ckpt, trials=2, max_episode_steps=16, replan_steps=4, imagination_score=True,
                       eval_save_video=True, video_stride=3, render=render,
                       multirun={"batch_invariant": True}))  # actions to the last bit, however requests batch
        runs[render] = out
    every, needed = records(runs["every_step"]), records(runs["needed"])
    varying = {"wall_time_s", "model_s", "env_s"}
    for key, record in every.items():
        assert record["imagine_frames"] > 0
        assert {k: v for k, v in needed[key].items() if k not in varying} == \
               {k: v for k, v in record.items() if k not in varying}
        frames = [read_mp4(runs[render] / record["video"]) for render in runs]
        assert len(frames[0]) == 6  # 16 steps, a frame every 3
        np.testing.assert_array_equal(frames[0], frames[1])
