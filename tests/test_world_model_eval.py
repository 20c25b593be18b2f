"""Policies ranked inside the world model (issue 42): the success detector, the world model started
from the simulator's resets, and the agreement figure's arithmetic and command."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import envs
from envs.protocol import IS_SUCCESS, PIXELS, PRIVILEGED_STATE
from tests.test_world_model import SIZE, ckpt, data  # noqa: F401 - fixtures
from wam_gym.world_model.env import WorldModelEnv
from wam_gym.world_model.evaluate import PolicySpec, agreement, main, pairwise_agreement
from wam_gym.world_model.success_detector import DetectorConfig, SuccessDetector, collect, train

pytestmark = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="needs wam_gym[metaworld]")
REACH = "wam_gym/MetaWorld-reach-v3"


def detector_that_says(solved: bool, folder) -> str:
    """A detector with a constant answer: its last layer's bias alone decides."""
    detector = SuccessDetector(DetectorConfig(tasks=[REACH], image_size=[SIZE, SIZE]))
    with torch.no_grad():
        last = detector.net[-1]
        last.weight.zero_()
        last.bias.fill_(20.0 if solved else -20.0)
    return str(detector.save(folder, {"held_out_accuracy": 1.0, "held_out_balanced_accuracy": 1.0}))


def test_the_detector_learns_from_the_simulators_labels_and_reloads(tmp_path):
    config = DetectorConfig(tasks=[REACH], image_size=[SIZE, SIZE], episodes=3, noise=[0.0], max_steps=60,
                            train_steps=40, batch_size=32)
    frames, replays = collect(config)
    assert frames.solved.any() and not frames.solved.all()  # the expert reaches the goal; a reset is unsolved
    assert frames.pixels.shape[1:] == (SIZE, 2 * SIZE, 3)  # two cameras side by side
    assert len(replays) == 6 and all(len(r.actions) == len(r.solved) == 60 for r in replays)  # expert, random
    detector, metrics = train(config, frames)
    assert 0 <= metrics["held_out_balanced_accuracy"] <= 1 and metrics["held_out_frames"] > 0
    loaded = SuccessDetector.load(detector.save(tmp_path / "detector", metrics))
    np.testing.assert_allclose(loaded.probability(frames.pixels[:8]), detector.probability(frames.pixels[:8]))
    with pytest.raises(FileNotFoundError, match="python -m wam_gym.world_model --detector DIR"):
        SuccessDetector.load(tmp_path)


def test_an_imagined_episode_starts_where_the_simulator_does_and_its_detector_ends_it(ckpt, tmp_path):  # noqa: F811
    real = envs.make(REACH, image_size=SIZE)
    world = WorldModelEnv(checkpoint=str(ckpt), start_from=REACH, privileged_from_simulator=True,
                          success_detector=detector_that_says(True, tmp_path / "yes"), num_inference_steps=2)
    obs, _ = world.reset(seed=3)
    reference, _ = real.reset(seed=3)
    for camera in obs[PIXELS]:
        np.testing.assert_array_equal(obs[PIXELS][camera], reference[PIXELS][camera])
    action = np.full(4, 0.2, np.float32)
    for step in range(world.steps_per_call):
        obs, reward, terminated, _, info = world.step(action)
        reference, *_ = real.step(action)
        np.testing.assert_allclose(obs[PRIVILEGED_STATE], reference[PRIVILEGED_STATE], atol=1e-6)
        imagined = step == world.steps_per_call - 1
        assert terminated == imagined and info[IS_SUCCESS] == imagined and reward == float(imagined)
    never = WorldModelEnv(checkpoint=str(ckpt), start_from=REACH, num_inference_steps=2,
                          success_detector=detector_that_says(False, tmp_path / "no"))
    never.reset(seed=3)
    assert not never.step(np.zeros((never.steps_per_call, 4), np.float32))[2]
    real.close(), world.close(), never.close()


def test_agreement_arithmetic():
    assert PolicySpec.parse("wam=ckpt/a+noise=0.5") == PolicySpec("wam", "ckpt/a", 0.5)
    with pytest.raises(ValueError, match="wam=CKPT"):
        PolicySpec.parse("wam")
    with pytest.raises(ValueError, match=r"--policy 'random\+noise=-1': \+noise= must be >= 0"):
        PolicySpec.parse("random+noise=-1")  # training.collect's --agent reads the same suffix the same way
    assert pairwise_agreement(np.array([0.1, 0.5, 0.9]), np.array([0.2, 0.3, 0.8])) == 1.0
    assert pairwise_agreement(np.array([0.1, 0.5, 0.9]), np.array([0.8, 0.3, 0.2])) == 0.0
    assert pairwise_agreement(np.array([0.1, 0.5]), np.array([0.3, 0.3])) == 0.5  # a tie counts half
    outcomes = {name: {"simulator": {"t": list(trials)}, "world_model": {"t": list(trials)}}
                for name, trials in (("a", [0, 0, 0, 1]), ("b", [0, 1, 1, 0]), ("c", [1, 1, 1, 1]))}
    summary = agreement(outcomes, resamples=200)
    assert summary["spearman"]["value"] == pytest.approx(1.0) and summary["pearson"]["value"] == pytest.approx(1.0)
    assert summary["pairwise_agreement"]["value"] == 1.0 and summary["policies"] == 3
    low, high = summary["spearman"]["interval_95"]
    assert low <= 1.0 <= high + 1e-9


def test_the_command_writes_the_figure(ckpt, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "out"
    main(["--world-model", str(ckpt), "--detector", detector_that_says(False, tmp_path / "no"), "--policy", "expert",
          "--policy", "random", "--task", REACH, "--trials", "2", "--steps", "20", "--inference-steps", "2",
          "--output", str(out)])
    result = json.loads((out / "results.json").read_text())
    assert set(result["outcomes"]) == {"expert", "random"} and (out / "scatter.png").stat().st_size > 0
    assert len(result["outcomes"]["expert"]["simulator"][REACH]) == 2
    assert "| expert |" in capsys.readouterr().out
    assert "| expert |" in (out / "summary.md").read_text()  # what was printed, kept


def test_a_detector_is_trained_on_the_frames_the_world_model_imagines_for_replayed_episodes(ckpt, tmp_path):  # noqa: F811
    from wam_gym.world_model.evaluate import imagine, train_detector
    from wam_gym.world_model.success_detector import SuccessDetector

    config = DetectorConfig(tasks=[REACH], image_size=[SIZE, SIZE], episodes=1, noise=[0.0], max_steps=40)
    _, replays = collect(config)
    frames = imagine(replays, str(ckpt), inference_steps=2, shift=3.0)
    world = WorldModelEnv(checkpoint=str(ckpt), start_from=REACH)
    per_call, stride = world.steps_per_call, world.frame_stride
    calls = len(replays[0].actions) // per_call
    assert len(frames.pixels) == 2 * calls * (per_call // stride)  # expert and random, every imagined frame
    first = replays[0].solved[[c * per_call + k * stride - 1 for c in range(calls) for k in range(1, per_call // stride + 1)]]
    np.testing.assert_array_equal(frames.solved[: len(first)], first)  # labelled by the step each frame shows
    metrics = train_detector(str(ckpt), [REACH], tmp_path / "detector", 2, 3.0, episodes=2, train_steps=10, say=lambda m: None)
    assert "imagined_held_out_balanced_accuracy" in metrics
    assert SuccessDetector.load(tmp_path / "detector").config.image_size == [SIZE, SIZE]
    world.close()


def test_the_imagination_bound_scores_the_vae_round_trip_of_the_true_future_against_copying(ckpt):  # noqa: F811
    import runpy

    from wam_gym.utils.metrics import per_frame_ssim
    from wam_gym.world_model.env import model_config
    from wam_gym.world_model.success_detector import as_the_world_model_draws

    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "imagination_bound.py"))
    cameras = tuple(model_config(ckpt).cameras)
    frames = script["expert_frames"](REACH, 1000, cameras, (SIZE, SIZE), 20)
    assert frames.shape == (20, SIZE, len(cameras) * SIZE, 3)  # the reset and 19 steps before the limit, cameras side by side
    result = script["bound"](str(ckpt), [REACH], seeds=1, steps=20)
    stride = result["frame_stride"]
    first = result["offsets"][1]
    assert first["frames"] == 20 - stride
    drawn = as_the_world_model_draws(frames, ckpt)
    assert first["vae_ssim"] == pytest.approx(per_frame_ssim(drawn[stride:], frames[stride:]).mean(), abs=1e-6)
    assert first["copy_ssim"] == pytest.approx(per_frame_ssim(frames[:-stride], frames[stride:]).mean(), abs=1e-6)


def test_the_scatters_error_bars_are_each_rates_wilson_interval_over_all_its_episodes():
    from wam_gym.utils.stats import wilson
    from wam_gym.world_model.evaluate import _wilson_bars, rates

    outcomes = {"a": {"simulator": {"t1": [True, True], "t2": [True, False]}},
                "b": {"simulator": {"t1": [False, False], "t2": [False, True]}}}
    centre = rates(outcomes, "simulator")
    bars = _wilson_bars(outcomes, "simulator", centre)
    low, high = wilson(3, 4)
    np.testing.assert_allclose(bars[:, 0], [0.75 - low, high - 0.75])
    assert bars.shape == (2, 2) and (bars >= 0).all()
