"""The imagination score: how well a WAM's predicted future frames match what the env then renders.

At every replan the model predicts ``1 + F`` frames with its action chunk (frame 0 reconstructs
the current observation, frame ``k`` is its imagination of env step ``k * frame_stride`` after the
replan; the model was trained on clips ``t, t+s, ..., t+F*s``, training/data/clips.py). The
actor's :class:`ImaginationScore` keeps the predicted frames of the chunk being executed and,
when the env reaches step ``k * frame_stride`` of that chunk, scores frame ``k`` against the
observation the env returned there (PSNR capped at :data:`~wam_gym.utils.metrics.PSNR_CAP_DB`,
and SSIM), the cameras tiled in the model's order at the model's image size, as the model's input
convention gives them to it (``ModelConfig.input_frames``: its resize or crop), turned upright as the
model's predicted frames are (``output_frames``). Alongside, the same scores for
the "copy the current frame" predictor (the replan's real current frame, as the model saw it),
so a reader sees whether the model predicts motion at all: a model that does beats the copy.

A replan scores the mean over its future frames that were reached before the next replan or
the episode's end; frames never reached (``k * frame_stride`` past the next replan, or past
the last step) are not scored, so ``replan_steps < frame_stride`` scores nothing. An episode
scores the mean over its replans with a scored frame.

When it runs (``EVALUATION.imagination_score``, see :func:`imagination_spec`): only for
``EVALUATION.agent=wam`` with a joint-video model; off, the actor builds no scorer and the model
workers decode no frames for it. The predicted frames never leave the actor that received them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.chunk_queue import ChunkQueueAgent
from envs.protocol import PIXELS

logger = logging.getLogger(__name__)

# The fields an EpisodeRecord carries (None when not computed; imagine_frames 0 when on but nothing was reached).
RECORD_FIELDS = ("imagine_psnr", "imagine_ssim", "copy_psnr", "copy_ssim", "imagine_frames")
TRAIN_CONFIG = "train_config.json"  # training.run_dir.RUN_CONFIG: next to the final checkpoint/ of a training run


@dataclass(frozen=True)
class ImaginationSpec:
    """What an actor needs to score predicted frames (picklable)."""

    model: Any  # the checkpoint's ModelConfig: its cameras, image size and input convention
    frame_stride: int  # env steps between predicted frames
    stride_source: str = "default"  # where frame_stride came from (a train_config.json, or the model's default)

    @property
    def record(self) -> dict[str, Any]:
        """What summary.json says of how predicted frames were scored."""
        return {"cameras": list(self.model.cameras), "image_size": list(self.model.image_size),
                "frame_stride": self.frame_stride, "stride_source": self.stride_source}


def imagination_spec(evaluation, model, ckpt: Path | None) -> ImaginationSpec | None:
    """The scorer's settings for this evaluation, or None when it does not run.

    ``EVALUATION.imagination_score``: null scores whenever predicted frames are decoded anyway
    (``visualize_future_video=true``) by a joint-video model; true makes the model workers decode
    them for it (refused for an action-only model); false never scores.
    """
    setting = evaluation.imagination_score
    if setting is False or evaluation.agent != "wam" or model is None:
        return None
    joint = (evaluation.video_mode or model.video_mode) == "joint"
    if setting is None and not (joint and evaluation.visualize_future_video):
        return None
    if not joint:
        raise ValueError("EVALUATION.imagination_score=true needs a model that predicts video (video_mode=joint); "
                         f"this one runs video_mode={evaluation.video_mode or model.video_mode}: set "
                         "EVALUATION.imagination_score=null (or false), or evaluate a joint checkpoint")
    stride, source = frame_stride(model, ckpt)
    return ImaginationSpec(model, stride, source)


def frame_stride(model, ckpt: Path | None) -> tuple[int, str]:
    """``(env steps between predicted frames, where that came from)``: ``dataset.frame_stride`` of
    the training run's ``train_config.json`` (in the checkpoint dir, or its parent: training saves
    ``<output_dir>/checkpoint/`` beside ``<output_dir>/train_config.json``; a resume's
    ``train_config.resumed-N.json`` wins over it) when it describes this model's geometry, else
    the model's default (``action_horizon // num_future_frames``)."""
    for folder in () if ckpt is None else (ckpt, ckpt.parent):
        for path in _train_configs(folder):
            try:
                record = json.loads(path.read_text())
                saved_model, stride = record.get("model") or {}, (record.get("dataset") or {}).get("frame_stride")
            except (OSError, ValueError, AttributeError) as exc:
                logger.warning("imagination score: cannot read %s (%s); using the default frame stride", path, exc)
                continue
            same = all(saved_model.get(k) == getattr(model, k) for k in ("action_horizon", "num_future_frames"))
            if not same:  # another model's run (a checkpoint copied next to an unrelated run): not ours
                continue
            if isinstance(stride, int) and not isinstance(stride, bool) and stride >= 1:
                return stride, str(path)
            return model.default_frame_stride, f"default ({path} leaves dataset.frame_stride null)"
    return model.default_frame_stride, "default (action_horizon // num_future_frames; no train_config.json found)"


def _train_configs(folder: Path) -> list[Path]:
    """The run's config records, newest first (a resumed run's settings replace the original's)."""
    resumed = sorted(folder.glob("train_config.resumed-*.json"),
                     key=lambda p: int(p.stem.rsplit("-", 1)[-1]) if p.stem.rsplit("-", 1)[-1].isdigit() else -1)
    original = [folder / TRAIN_CONFIG] if (folder / TRAIN_CONFIG).is_file() else []
    return [*reversed(resumed), *original]


class ImaginationScore:
    """The scorer of one episode of env 0 of ``agent`` (a :class:`~agents.chunk_queue.ChunkQueueAgent`):
    :meth:`after_act` and :meth:`observe` are :func:`agents.run_episode`'s hooks; :meth:`result`
    gives the episode's :data:`RECORD_FIELDS`."""

    def __init__(self, spec: ImaginationSpec, agent: ChunkQueueAgent):
        self.spec, self.agent = spec, agent
        self._calls = agent.num_model_calls
        self._future: np.ndarray | None = None  # (F, H, W, 3): frames 1..F of the chunk being executed
        self._current: np.ndarray | None = None  # (H, W, 3): the real frame that chunk was predicted from
        self._since = 0  # env steps since that replan
        self._frames: list[np.ndarray] = []  # the current replan's scored frames: [model psnr, ssim, copy psnr, ssim]
        self._replans: list[np.ndarray] = []  # per replan with a scored frame: its mean row
        self.frames_scored = 0

    def after_act(self, obs: Mapping[str, Any], action) -> None:
        calls = self.agent.num_model_calls
        if calls == self._calls:
            return
        self._calls = calls
        self._close_replan()
        prediction = self.agent.last_prediction.get(0)
        video = None if prediction is None else prediction.video
        if video is None or len(video) < 2:  # no frames this time: nothing to score until the next replan
            self._future = self._current = None
            return
        self._future, self._current, self._since = np.asarray(video[1:]), self.real_frame(obs), 0

    def reads_pixels(self) -> bool:
        """Whether the next observation is a frame this scorer compares with the prediction."""
        return self._target(self._since + 1) is not None

    def observe(self, obs: Mapping[str, Any], info=None) -> None:
        if self._future is None:
            return
        self._since += 1
        k = self._target(self._since)
        if k is not None:
            self._score(self._future[k - 1], self.real_frame(obs))

    def _target(self, since: int) -> int | None:
        """Which predicted frame (1..F) the observation ``since`` steps after the replan is, if any."""
        if self._future is None:
            return None
        k, rest = divmod(since, self.spec.frame_stride)
        return k if rest == 0 and 1 <= k <= len(self._future) else None

    def _score(self, predicted: np.ndarray, real: np.ndarray) -> None:
        from wam_gym.utils.metrics import PSNR_CAP_DB, per_frame_psnr, per_frame_ssim

        if predicted.shape != real.shape:
            raise ValueError(f"imagination score: the predicted frame is {predicted.shape}, the env's (tiled at the "
                             f"model's size) {real.shape}; set EVALUATION.imagination_score=false")
        guesses, truth = np.stack([predicted, self._current]), np.stack([real, real])
        psnr = np.minimum(per_frame_psnr(guesses, truth), PSNR_CAP_DB)
        ssim = per_frame_ssim(guesses, truth)
        self._frames.append(np.array([psnr[0], ssim[0], psnr[1], ssim[1]]))
        self.frames_scored += 1

    def _close_replan(self) -> None:
        if self._frames:  # a replan none of whose frames was reached scores nothing
            self._replans.append(np.mean(self._frames, axis=0))
        self._frames = []

    def result(self) -> dict[str, Any]:
        """The episode's scores (means over its replans); None scores when no frame was reached."""
        self._close_replan()
        self._future = self._current = None
        if not self._replans:
            return {**dict.fromkeys(RECORD_FIELDS[:4]), "imagine_frames": 0}
        means = np.mean(self._replans, axis=0)
        return {**{name: float(v) for name, v in zip(RECORD_FIELDS[:4], means)}, "imagine_frames": self.frames_scored}

    def real_frame(self, obs: Mapping[str, Any]) -> np.ndarray:
        """The env's cameras as the model sees them, upright: (H, W * cameras, 3) uint8, at the model's size."""
        from agents.wam.frames import video_to_uint8

        model, pixels = self.spec.model, obs[PIXELS]
        x = model.input_frames({c: np.asarray(pixels[c])[None] for c in model.cameras}, 1)
        return model.output_frames(video_to_uint8(x[:, :, None]))[0, 0]  # as the policy's predicted frames are
