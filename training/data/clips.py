"""Training samples for a WAM: a short clip from the current frame on, plus an action chunk.

Sample ``(episode, t)``:

* ``video``: float32 ``(3, 1 + num_future_frames, H, W * len(cameras))`` in [-1, 1], frames
  ``t, t + s, ..., t + num_future_frames * s`` (``s = frame_stride``; past the episode's end
  the last frame repeats), cameras side by side in the given order, each resized to
  ``image_size`` with bilinear antialiasing when stored at another size: made by
  :func:`agents.wam.frames.model_frames`, or by the ``convention``'s ``input_frames`` (the model's):
  the same function :class:`agents.wam.WAMPolicy` applies to observations at inference, and on the
  same upright frames (``LeRobotDataset.episode_frames`` turns them from the orientation the dataset
  records; a dataset that records none from elsewhere is refused at construction).
* ``state``: float32 ``(S,)``; ``actions``: float32 ``(action_horizon, A)``, actions
  ``t .. t + action_horizon - 1`` (the last action repeats past the end, flagged in
  ``action_is_pad``). ``next_states``: float32 ``(action_horizon, S)``, the state after each
  of those actions (frames ``t + 1 ..``, the last repeating), for world-model training. All
  normalised by :class:`agents.wam.normalization.Normalizer` built from the dataset's
  ``meta/stats.json`` (state mean/std, actions min/max -> [-1, 1]).
* ``instruction``, ``index`` (the frame's global ``index`` in the dataset: stable across runs
  and processes, so caches key on it), ``episode``, ``frame``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from agents.wam.frames import model_frames
from training.data.lerobot import LeRobotDataset

if TYPE_CHECKING:
    from agents.wam.config import ModelConfig


class ClipDataset(Dataset):
    """Every (episode, frame) of a :class:`LeRobotDataset` as a clip sample (see module doc)."""

    def __init__(
        self,
        dataset: LeRobotDataset | str | os.PathLike,
        cameras: Sequence[str] | None = None,
        image_size: int | Sequence[int] | None = (64, 64),
        action_horizon: int = 16,
        num_future_frames: int = 4,
        frame_stride: int = 1,
        stats_normalize: bool = True,
        normalization: str | None = None,
        episodes: Sequence[int] | None = None,
        load_video: bool = True,
        convention: ModelConfig | None = None,
    ):
        """``convention``: the model config whose input/output convention the samples follow (its
        ``input_frames``, ``dataset_actions`` and ``dataset_stats``: what its policy inverts at inference);
        None: wam_gym's own (:func:`~agents.wam.frames.model_frames`, env actions as they are)."""
        self.dataset = dataset if isinstance(dataset, LeRobotDataset) else LeRobotDataset(dataset, require_stats=stats_normalize)
        self.convention = convention
        ds = self.dataset
        self.cameras = _cameras(ds, cameras)
        self.image_size: tuple[int, int] = _image_size(ds, self.cameras, image_size)
        checks = (
            ("action_horizon", action_horizon, 1),
            ("num_future_frames", num_future_frames, 0),
            ("frame_stride", frame_stride, 1),
        )
        for name, value, low in checks:
            if int(value) != value or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        self.action_horizon = int(action_horizon)
        self.num_future_frames = int(num_future_frames)
        self.frame_stride = int(frame_stride)
        self.stats_normalize = bool(stats_normalize)
        # False when the latents come from a cache: no decoding at all (``video`` is empty).
        self.load_video = bool(load_video)
        self.normalizer = _normalizer(ds, normalization, convention) if self.stats_normalize else None

        eps = np.arange(ds.num_episodes) if episodes is None else np.asarray(sorted({int(e) for e in episodes}), dtype=np.int64)
        bad = [int(e) for e in eps if not 0 <= e < ds.num_episodes]
        if bad:
            raise ValueError(f"episodes {bad} out of range: the dataset has {ds.num_episodes}")
        self.episodes = eps
        lengths = ds.episode_lengths[eps]
        # position p -> (episode, frame): the episode is the last whose first position <= p
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self._starts = ds.episode_starts

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def sample_index(self, episode: int, frame: int) -> int:
        """The global ``index`` of ``frame`` of ``episode`` (the value samples carry as ``index``)."""
        ep = int(episode)
        length = int(self.dataset.episode_lengths[ep])
        if not 0 <= frame < length:
            raise IndexError(f"frame {frame} out of range: episode {ep} has {length} frames")
        return int(self._starts[ep] + frame)

    def locate(self, position: int) -> tuple[int, int]:
        """(episode, frame) of the sample at ``position`` (0 .. len - 1)."""
        if not 0 <= position < len(self):
            raise IndexError(f"sample {position} out of range: {len(self)} samples")
        k = int(np.searchsorted(self._offsets, position, side="right") - 1)
        return int(self.episodes[k]), int(position - self._offsets[k])

    def __getitem__(self, position: int) -> dict[str, Any]:
        position = int(position)
        if position < 0:
            position += len(self)
        ep, t = self.locate(position)
        ds = self.dataset
        table = ds.episode_table(ep)
        length = len(table["index"])
        action_ids = t + np.arange(self.action_horizon)
        is_pad = action_ids >= length
        actions = table["action"][np.minimum(action_ids, length - 1)]
        state = table["state"][t]
        next_states = table["state"][np.minimum(action_ids + 1, length - 1)]
        if self.convention is not None:
            actions = self.convention.dataset_actions(actions)
        if self.normalizer is not None:
            state = self.normalizer.normalize_state(state)
            next_states = self.normalizer.normalize_state(next_states)
            actions = self.normalizer.normalize_actions(actions)
        return {
            "video": self.video(ep, t) if self.load_video else torch.zeros(0),
            "state": torch.from_numpy(np.asarray(state, dtype=np.float32).copy()),
            "actions": torch.from_numpy(np.asarray(actions, dtype=np.float32).copy()),
            "action_is_pad": torch.from_numpy(is_pad),
            "next_states": torch.from_numpy(np.asarray(next_states, dtype=np.float32).copy()),
            "instruction": ds.tasks[int(table["task_index"][t])],
            "index": int(table["index"][t]),
            "episode": ep,
            "frame": t,
        }

    def video(self, ep: int, t: int) -> torch.Tensor:
        """The clip's frames (3, 1 + num_future_frames, H, W * cameras) in [-1, 1] (see the module doc)."""
        length = int(self.dataset.episode_lengths[ep])
        frame_ids = np.minimum(t + self.frame_stride * np.arange(self.num_future_frames + 1), length - 1)
        pixels = {cam: self.dataset.episode_frames(ep, cam)[frame_ids] for cam in self.cameras}  # (F, H, W, 3) uint8
        if self.convention is None:
            frames = model_frames(pixels, self.cameras, self.image_size, len(frame_ids))  # (F, 3, H, W * cams)
        else:
            frames = self.convention.input_frames(pixels, len(frame_ids))
        return frames.permute(1, 0, 2, 3).contiguous()


def _cameras(ds: LeRobotDataset, cameras: Sequence[str] | None) -> tuple[str, ...]:
    """The cameras a clip carries (all of the dataset's by default), each known to the dataset."""
    chosen = tuple(cameras) if cameras is not None else ds.cameras
    if not chosen:
        raise ValueError(f"no cameras: the dataset at {ds.root} has {list(ds.cameras)}")
    missing = [c for c in chosen if c not in ds.cameras]
    if missing:
        raise ValueError(f"camera(s) {missing} are not in the dataset at {ds.root}; it has {list(ds.cameras)}")
    for camera in chosen:  # an unknown orientation is refused here, before training, not in a loader worker
        ds.orientation(camera)
    return chosen


def _image_size(ds: LeRobotDataset, cameras: tuple[str, ...], image_size) -> tuple[int, int]:
    """(H, W) the frames are resized to: ``image_size`` as an int or a pair, or the first camera's own."""
    if image_size is None:
        image_size = ds.image_shape(cameras[0])[:2]
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(int(s) for s in image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (H, W), got {image_size!r}")
    return size


def _normalizer(ds: LeRobotDataset, normalization: str | None, convention: ModelConfig | None):
    """The dataset's statistics as a Normalizer, of the actions in the model's units under ``convention``."""
    from agents.wam.normalization import Normalizer

    normalizer = Normalizer.from_stats_file(ds.stats_path, normalization)
    if convention is None:
        return normalizer
    stats = convention.dataset_stats(normalizer.stats)
    return Normalizer.from_stats(stats, normalizer.mode, source=str(ds.stats_path))
