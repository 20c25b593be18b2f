"""The imagination score (wam_gym/eval/imagination.py) on synthetic frames: an env whose frames
are known, an agent whose "predicted" frames are chosen, run through agents.run_episode's hooks."""

from __future__ import annotations

import json

import imageio.v3 as iio
import numpy as np
import pytest

from agents import run_episode
from agents.policy import Prediction
from agents.wam.mot.config import MoTConfig
from wam_gym.eval.imagination import ImaginationScore, ImaginationSpec, frame_stride
from wam_gym.utils.metrics import PSNR_CAP_DB

SIZE = 16
CAMERAS = ("wrist", "corner")  # the model's order; the env lists them the other way round


def scene(t: int, camera: str, static: bool = False) -> np.ndarray:
    """What ``camera`` renders at step ``t``: a bright square that moves one pixel a step (or stays)."""
    image = np.full((SIZE, SIZE, 3), 40 if camera == "corner" else 90, np.uint8)
    x = 2 if static else 2 + t
    image[4:9, x:x + 5] = 230
    return image


def tiled(t: int, static: bool = False) -> np.ndarray:
    return np.concatenate([scene(t, c, static) for c in CAMERAS], axis=1)


class SceneEnv:
    def __init__(self, static: bool = False):
        self.static, self.t = static, 0

    def _obs(self):
        return {"pixels": {c: scene(self.t, c, self.static) for c in reversed(CAMERAS)}, "state": np.zeros(2)}

    def reset(self, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, False, {}


class FramesAgent:
    """Replans every ``replan`` steps; its "prediction" at step t is ``predict(t)`` (1 + F frames)."""

    def __init__(self, predict, replan: int):
        self.predict, self.replan = predict, replan
        self.num_model_calls, self.last_prediction, self.t = 0, {}, 0

    def reset(self):
        self.t = 0

    def act(self, obs):
        if self.t % self.replan == 0:
            self.num_model_calls += 1
            self.last_prediction[0] = Prediction(np.zeros((self.replan, 2), np.float32), self.predict(self.t))
        self.t += 1
        return np.zeros(2, np.float32)


def score(predict, *, stride=2, replan=4, steps=8, static=False) -> dict:
    agent = FramesAgent(predict, replan)
    scorer = ImaginationScore(ImaginationSpec(MoTConfig(cameras=CAMERAS, image_size=(SIZE, SIZE)), stride), agent)
    run_episode(SceneEnv(static), agent, max_steps=steps, observe=scorer.observe, after_act=scorer.after_act)
    return scorer.result()


def truth(t: int, stride: int = 2, frames: int = 4, static: bool = False) -> np.ndarray:
    """The frames the env renders at t, t + stride, ..., t + frames * stride (a perfect prediction)."""
    return np.stack([tiled(t + k * stride, static) for k in range(frames + 1)])


def test_a_perfect_prediction_scores_the_cap_and_beats_the_copy_of_a_moving_scene():
    result = score(truth)
    assert result["imagine_psnr"] == PSNR_CAP_DB and result["imagine_ssim"] == pytest.approx(1.0)
    assert result["copy_psnr"] < 40 and result["copy_ssim"] < 0.99
    assert result["imagine_frames"] == 4  # 2 replans x frames 1, 2 (steps 2, 4 after each)


def test_the_copy_baseline_wins_on_a_static_scene():
    noisy = np.random.default_rng(0).integers(0, 256, (5, SIZE, 2 * SIZE, 3), dtype=np.uint8)
    result = score(lambda t: noisy, static=True)
    assert result["copy_psnr"] == PSNR_CAP_DB and result["copy_ssim"] == pytest.approx(1.0)
    assert result["imagine_psnr"] < 20 and result["imagine_ssim"] < 0.5


def test_frames_past_the_next_replan_or_the_end_are_not_scored():
    def right_then_wrong(t):  # frames 1, 2 right; 3, 4 (past the next replan, 4 steps later) garbage
        frames = truth(t)
        frames[3:] = 0
        return frames

    result = score(right_then_wrong)
    assert result["imagine_psnr"] == PSNR_CAP_DB and result["imagine_frames"] == 4
    # One replan of 8 steps: all four frames reached (step 8 is the episode's last observation).
    assert score(truth, replan=8, steps=8)["imagine_frames"] == 4
    assert score(truth, replan=8, steps=7)["imagine_frames"] == 3  # frame 4 (step 8) never rendered
    assert score(truth, stride=2, replan=1, steps=8) == dict.fromkeys(  # a replan every step: nothing reached
        ("imagine_psnr", "imagine_ssim", "copy_psnr", "copy_ssim"), None) | {"imagine_frames": 0}


def test_the_stride_comes_from_the_training_run_when_it_recorded_one(tmp_path):
    from agents.wam.mot.config import preset

    model = preset("tiny")
    ckpt = tmp_path / "run" / "checkpoint"
    ckpt.mkdir(parents=True)
    assert frame_stride(model, ckpt)[0] == model.default_frame_stride == 4
    record = {"model": {"action_horizon": 16, "num_future_frames": 4}, "dataset": {"frame_stride": 3}}
    (ckpt.parent / "train_config.json").write_text(json.dumps(record))
    assert frame_stride(model, ckpt) == (3, str(ckpt.parent / "train_config.json"))
    (ckpt.parent / "train_config.resumed-1.json").write_text(json.dumps({**record, "dataset": {"frame_stride": 2}}))
    assert frame_stride(model, ckpt)[0] == 2  # a resume's settings are the newest
    other = {"model": {"action_horizon": 32, "num_future_frames": 8}, "dataset": {"frame_stride": 1}}
    (ckpt / "train_config.json").write_text(json.dumps(other))  # another model's run: ignored
    assert frame_stride(model, ckpt)[0] == 2


def test_the_demo_report_shows_the_imagination_score_beside_the_copy_baseline(tmp_path):
    from wam_gym.demo import Demo, DemoConfig
    from wam_gym.eval.results import task_slug
    from wam_gym.utils.video import write_mp4

    tasks = ["wam_gym/MetaWorld-reach-v3", "wam_gym/MetaWorld-push-v3"]
    scores = {"imagine_psnr": 21.5, "imagine_ssim": 0.8, "copy_psnr": 20.0, "copy_ssim": 0.75, "episodes": 1, "frames": 6}
    for agent in ("wam", "expert", "random"):
        imagination = {"imagination": scores} if agent == "wam" else {}
        rate = {"success_rate": 0.5, "success_rate_ci95": [0.1, 0.9]}
        results = {"tasks": {t: {**rate, **imagination} for t in tasks}, "overall": {**rate, **imagination}}
        if agent == "wam":
            results["imagination"] = {"cameras": ["corner"], "image_size": [16, 16], "frame_stride": 4}
        (tmp_path / "eval" / agent).mkdir(parents=True)
        (tmp_path / "eval" / agent / "results.json").write_text(json.dumps(results))
    # A rollout video whose imagined half (right) at step t shows exactly what the env renders at t + 4.
    brightness = np.arange(40) * 6
    video = np.zeros((40, 16, 32, 3), np.uint8)
    video[:, :, :16] = brightness[:, None, None, None]
    video[:-4, :, 16:] = brightness[4:, None, None, None]
    write_mp4(tmp_path / "eval" / "wam" / "videos" / task_slug(tasks[0]) / "00000.mp4", video)
    (tmp_path / "train" / "checkpoint").mkdir(parents=True)  # the demo replans every 8 steps: replans fall on frames
    (tmp_path / "train" / "checkpoint" / "wam_config.json").write_text(json.dumps({"action_horizon": 32}))
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "fit_vae.json").write_text(json.dumps(
        {"held_out_psnr": 26.1, "mean_image_psnr": 19.0, "steps": 400, "train_s": 200.0}))

    report = Demo(DemoConfig(output=str(tmp_path), tasks=tasks)).report()
    assert report["imagination"] == scores and report["tasks"][0]["imagination"] == scores
    markdown = (tmp_path / "report.md").read_text()
    assert "| wam_gym/MetaWorld-reach-v3 | 21.50 | 20.00 | 0.800 | 0.750 | 6 |" in markdown
    assert "beats copying the current frame (PSNR) on 2 of 2 tasks" in markdown
    assert "reconstructs held-out demo clips at 26.1 dB PSNR; predicting the mean image scores 19.0 dB" in markdown
    assert report["strip"] == "imagination_strip.png" and "![real vs imagined](imagination_strip.png)" in markdown
    strip = iio.imread(tmp_path / "imagination_strip.png")
    assert strip.shape == (32, 6 * 16, 3)  # real over imagined, 6 columns of one 16x16 camera
    real, imagined = strip[:16].astype(int), strip[16:].astype(int)
    assert np.abs(real - imagined).max() <= 8  # the same steps (up to the mp4's compression)
    assert real[:, -16:].mean() > real[:, :16].mean() + 100  # columns run through the episode


def test_a_model_drawing_another_orientation_is_scored_upright_camera_by_camera():
    """A FastWAM LIBERO checkpoint sees and draws its frames mirrored (its convention); its predicted frames
    leave it upright (ModelConfig.output_frames), each camera in its own place, and the real frame they are
    scored against is the model's view turned the same way: the scene as the env rendered it."""
    from agents.wam.fastwam.config import preset
    from agents.wam.fastwam.inputs import convention
    from agents.wam.frames import video_to_uint8

    model = preset("fastwam_tiny", cameras=CAMERAS, image_size=(SIZE, SIZE), inputs=convention("fastwam_libero"))
    pixels = {c: scene(0, c)[None] for c in CAMERAS}
    drawn = video_to_uint8(model.input_frames(pixels, 1)[:, :, None])  # (1, 1, H, 2W, 3), as the model sees it
    assert np.array_equal(drawn[0, 0, :, :SIZE], scene(0, "wrist")[:, ::-1])  # its own frame: mirrored
    assert np.array_equal(model.output_frames(drawn)[0, 0], tiled(0))  # out upright, the cameras in their places
    scorer = ImaginationScore(ImaginationSpec(model, 2), FramesAgent(lambda t: None, 4))
    assert np.array_equal(scorer.real_frame({"pixels": {c: scene(0, c) for c in CAMERAS}}), tiled(0))
