"""Read a LeRobot v3.0 dataset for training: :class:`LeRobotDataset`, composed of the dataset's index
(:class:`~training.data.lerobot.episodes.EpisodeIndex`: episodes, rows, lookups) and its frame reader
(:class:`~training.data.lerobot.frames.FrameReader`: video spans and image columns, decoded)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot import provenance, schema, validate
from training.data.lerobot.episodes import EpisodeIndex, image_bytes
from training.data.lerobot.frames import FrameReader, decode_image, same_rate
from training.data.lerobot.layout import (
    CODEBASE_VERSION,
    COLLECT_HINT,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    DatasetError,
    camera_of,
)
from training.data.lerobot.tables import read_tasks

__all__ = ["LeRobotDataset", "decode_image", "image_bytes"]  # convert reads image columns with these two


class LeRobotDataset:
    """Read a LeRobot v3.0 dataset (any writer's, as long as its videos are in mp4 files).

    The tabular data of every episode is loaded at construction (``index``); video frames are decoded
    per episode on request (``frames``), seeking to the episode's span of its file, turned upright from the
    orientation info.json records (``training.data.lerobot.provenance``), and the last
    ``cache_episodes`` (episode, camera) pairs are kept.
    """

    def __init__(self, root: str | os.PathLike, cache_episodes: int = 8, require_stats: bool = True,
                 snap_starts: bool = False):
        """``snap_starts``: take an episode's video span starting off the frame grid (LeRobot's aggregate_datasets
        writes such after joining drifted datasets) at the nearest frame instead of refusing it; the repair
        (``convert``) opens so, and confirms each such start against the file's timestamps."""
        self.root = Path(root).expanduser()
        self.cache_episodes = int(cache_episodes)
        self.snap_starts = snap_starts
        hint = COLLECT_HINT.format(root=self.root)
        fix = f"re-collect the dataset with: {hint}"
        self.info = _open_info(self.root, hint, fix)
        self.fps = self.info["fps"]
        # camera -> its feature: observation.images.<camera> in mp4s ("video") or in the data files ("image",
        # encoded PNG/JPEG bytes), or a lone camera under observation.image (pusht-style), named "image".
        features = self.info["features"]
        keys = {camera_of(k): k for k, f in features.items() if camera_of(k) and f["dtype"] in ("video", "image")}
        self.cameras = tuple(keys)
        self.video_cameras = tuple(c for c in self.cameras if features[keys[c]]["dtype"] == "video")
        orientations = provenance.recorded_orientations(self.info, keys, self.root)
        _check_features(self.root, self.info, keys.values(), fix)
        tasks_path = validate.inside(self.root, self.root / TASKS_PATH)
        if not tasks_path.is_file():
            raise DatasetError(f"{self.root}: {TASKS_PATH} is missing; {fix}")
        tasks = read_tasks(tasks_path, fix)
        validate.tasks_named(tasks, str(tasks_path))
        self.index = EpisodeIndex(self.root, self.info, keys, self.video_cameras, tasks, fix, hint)
        self.frames = FrameReader(self.index, self.info, orientations, self.cache_episodes)
        self.frames.check_files(hint)
        self._check_timing(hint)
        self.stats_path = self.root / STATS_PATH
        self._stats = _stored_stats(self.root, require_stats)

    def _check_timing(self, hint: str) -> None:
        """fps is how frames are found (frame k of a file is at k / fps): one wrong rate trains
        on shifted frames without a sound. So info.json's fps must agree with every video
        feature's ``video.fps``, the episodes' timestamps and each mp4's own header."""
        fps = float(self.fps)
        fix = f"set fps in {INFO_PATH} to the rate the data was recorded at, or re-collect the dataset with: {hint}"
        for cam in self.video_cameras:
            key = self.feature_key(cam)
            declared = self.info["features"][key].get("info", {}).get("video.fps")
            if declared is not None and not same_rate(float(declared), fps):
                raise DatasetError(f"{self.root}: {INFO_PATH} has fps={self.fps} but features['{key}'].info['video.fps']="
                                   f"{declared}; {fix}")
        self.index.check_timestamps(fps, fix)
        self.index.check_video_spans(fps, fix, self.snap_starts)
        self.frames.check_headers(fps, fix)

    # -- what the dataset is -----------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What makes this dataset this one, wherever it lies: its totals and a hash of its
        ``meta/info.json`` (schema, fps, totals); a resume compares it (training.run_dir)."""
        canonical = json.dumps(self.info, sort_keys=True, separators=(",", ":")).encode()
        return {"total_episodes": int(self.info["total_episodes"]), "total_frames": int(self.info["total_frames"]),
                "info_sha256": hashlib.sha256(canonical).hexdigest()[:16]}

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        if self._stats is None:
            raise DatasetError(
                f"{self.root}: {STATS_PATH} is missing; recompute it with: python -m training.collect --stats-only {self.root}"
            )
        return self._stats

    def feature_key(self, camera: str) -> str:
        """The camera's feature in info.json and stats.json (``observation.images.<camera>``, or
        ``observation.image`` for a lone camera)."""
        self.frames.check_camera(camera)
        return self.index.keys[camera]

    @property
    def num_episodes(self) -> int:
        return self.index.num_episodes

    @property
    def num_frames(self) -> int:
        return self.index.num_frames

    @property
    def episode_lengths(self) -> np.ndarray:
        return self.index.meta["length"].astype(np.int64)

    @property
    def episode_starts(self) -> np.ndarray:
        """Global index of every episode's first frame (``dataset_from_index``)."""
        return self.index.meta["dataset_from_index"].astype(np.int64)

    @property
    def tasks(self) -> list[str]:
        return list(self.index.tasks)

    def orientation(self, camera: str) -> str:
        """How the camera's frames are stored (``envs.orientation``); refused, naming the fix, when unknown."""
        return self.frames.orientation(camera)

    def image_shape(self, camera: str) -> tuple[int, int, int]:
        """(H, W, 3) of a camera's stored frames."""
        shape = self.info["features"][self.feature_key(camera)]["shape"]
        if shape[-1] != 3 and shape[0] == 3:  # (C, H, W) as some LeRobot writers store it
            shape = [*shape[1:], shape[0]]
        return tuple(int(s) for s in shape)

    # -- access ------------------------------------------------------------------------------
    def episode_table(self, ep: int) -> dict[str, np.ndarray]:
        """state (T, S), action (T, A), task_index, frame_index, timestamp, index, episode_index."""
        return self.index.episode_table(ep)

    def task_of(self, ep: int) -> str:
        return self.index.task_of(ep)

    def episode_frames(self, ep: int, camera: str) -> np.ndarray:
        """The episode's frames of one camera **upright**, however stored: every reader for a model takes them
        here. uint8 (T, H, W, 3), read-only (cached); decodes only its span."""
        return self.frames.episode_frames(ep, camera)

    def video_span(self, ep: int, camera: str) -> tuple[Path, int, int]:
        """Where the episode's frames of one camera are: (mp4 file, its first frame there, frame count)."""
        return self.frames.video_span(ep, camera)

    def video_start(self, ep: int, camera: str) -> float:
        """The episode's ``from_timestamp`` in its video file, in seconds, as meta/episodes records it."""
        ep = self.index.check_episode(ep)
        self.frames.check_camera(camera)
        return self.index.video_start(ep, camera)

    def video_files(self, camera: str) -> dict[Path, list[tuple[int, int, int]]]:
        """Each mp4 of a camera with the spans its episodes occupy: ``(first frame, end frame, episode)``,
        in file order (for reading each file once, front to back)."""
        return self.frames.video_files(camera)

    def stored_frames(self, ep: int, camera: str) -> np.ndarray:
        """The episode's frames of one camera as stored, however turned (uncached): for tools that copy or check
        pixels (convert, check, statistics); models read :meth:`episode_frames`."""
        return self.frames.stored_frames(ep, camera)


def _open_info(root: Path, hint: str, fix: str) -> dict[str, Any]:
    """The dataset's ``meta/info.json``, refused unless a v3.0 one with what reading needs."""
    if not root.is_dir():
        raise DatasetError(f"no dataset at {root}: the directory does not exist. Collect one with: {hint}")
    info_path = validate.inside(root, root / INFO_PATH)
    if not info_path.is_file():
        raise DatasetError(
            f"{root} is not a LeRobot v3 dataset: {INFO_PATH} is missing (an interrupted collection "
            f"writes it only once its first file is complete). Collect one with: {hint}"
        )
    info = schema.load_info(info_path, (), fix)
    version = info.get("codebase_version")
    if version != CODEBASE_VERSION:
        raise DatasetError(
            f"{root}: unsupported codebase_version {version!r}; this reader supports {CODEBASE_VERSION!r} only "
            f"(convert a v2.1 dataset with: python -m training.datasets convert {root} {root}-v30)"
        )
    missing = [k for k in ("fps", "features", "data_path", "total_episodes", "total_frames") if k not in info]
    if missing:
        raise DatasetError(f"{info_path} lacks {missing}; {fix}")
    return info


def _check_features(root: Path, info: dict[str, Any], camera_keys, fix: str) -> None:
    """State and action are features, and every camera's frames are images (H, W, 3) or (3, H, W)."""
    features = info["features"]
    for key in (LEROBOT_STATE, LEROBOT_ACTION):
        if key not in features:
            raise DatasetError(f"{root}: features lack {key!r} (have {sorted(features)})")
    for key in camera_keys:
        shape = features[key].get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and 3 in (shape[0], shape[-1])):
            raise DatasetError(f"{root / INFO_PATH}: features[{key!r}].shape is {shape}, not an image's [height, width, 3] "
                               f"(or [3, height, width]); {fix}")


def _stored_stats(root: Path, required: bool) -> dict[str, dict[str, np.ndarray]] | None:
    """``meta/stats.json`` as written, or None where it is missing and not ``required``."""
    stats_path = validate.inside(root, root / STATS_PATH)
    stats_fix = f"recompute it with: python -m training.collect --stats-only {root}"
    if stats_path.is_file():
        return schema.load_stats(stats_path, stats_fix)
    if required:
        raise DatasetError(f"{root}: {STATS_PATH} is missing; {stats_fix}")
    return None
