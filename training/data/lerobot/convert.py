"""Convert a LeRobot v2.1 dataset to v3.0, or lay out a v3.0 one again, validating as it goes.

v2.1 (much public robot data): one parquet and one mp4 per camera per episode
(``data/chunk-XXX/episode_XXXXXX.parquet``, ``videos/chunk-XXX/<key>/episode_XXXXXX.mp4``),
``meta/episodes.jsonl``, ``meta/tasks.jsonl``, ``meta/episodes_stats.jsonl``. Each episode is
checked before it is written: its data file, the state and action columns with info.json's shapes,
finite values and statistics, timestamps within LeRobot's tolerance of ``frame_index / fps``, and
every frame of every camera decoded (mp4s, or images in the data files) and counted. The first
problem is one :class:`DatasetError` naming the episode and the field, and nothing is left at the
destination: the new dataset is written into a hidden staging directory next to it and renamed
into place only when complete. Features other than the cameras, state, action and the indices
are not carried over (the result lists them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot.layout import INDEX_KEYS, INFO_PATH, DatasetError, camera_of
from training.data.lerobot.reader import LeRobotDataset, decode_image, image_bytes
from training.data.lerobot.tables import column_matrix
from training.data.lerobot.writer import DatasetWriter
from wam_gym.utils.publish import atomic_dir
from wam_gym.utils.video import read_mp4

TIMESTAMP_TOLERANCE_S = 1e-4  # LeRobot's default tolerance_s between a timestamp and frame_index / fps
Episode = tuple[np.ndarray, np.ndarray, list[str], dict[str, np.ndarray]]  # state, action, task per frame, frames


def convert(src: str | os.PathLike, dst: str | os.PathLike, **layout: Any) -> dict:
    """Write ``src`` (v2.1, or v3.0 to lay it out again) as a v3.0 dataset at ``dst``; returns a summary.
    ``layout``: DatasetWriter's file knobs (``data_files_size_in_mb``, ``video_files_size_in_mb``,
    ``episodes_per_file``, ``video_gop``)."""
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if dst.exists():
        raise DatasetError(f"{dst} exists: convert into a new directory (nothing is written over a dataset)")
    info = _info(src)
    source = _V30(src) if info.get("codebase_version") == "v3.0" else _V21(src, info)
    with atomic_dir(dst) as staging:
        writer = DatasetWriter(staging, info["fps"], source.cameras, robot_type=info.get("robot_type") or "unknown",
                               state_names=_names(info, LEROBOT_STATE), action_names=_names(info, LEROBOT_ACTION),
                               **layout)
        frames = 0
        for state, action, tasks, images in source.episodes():
            for t in range(len(state)):
                writer.add_frame({c: images[c][t] for c in source.cameras}, state[t], action[t], tasks[t])
            writer.save_episode()
            frames += len(state)
        writer.finalize()
    return {"source": str(src), "version": info.get("codebase_version"), "destination": str(dst),
            "episodes": source.num_episodes, "frames": frames, "cameras": list(source.cameras),
            "dropped_features": source.dropped}


def _info(src: Path) -> dict[str, Any]:
    path = src / INFO_PATH
    if not path.is_file():
        raise DatasetError(f"{src} is not a LeRobot dataset: {INFO_PATH} is missing")
    try:
        info = json.loads(path.read_text())
    except ValueError as exc:
        raise DatasetError(f"{path} is not valid JSON ({exc})") from None
    version = info.get("codebase_version")
    if version not in ("v2.0", "v2.1", "v3.0"):
        raise DatasetError(f"{src}: codebase_version {version!r}; this converts v2.0/v2.1 (and lays out v3.0) datasets")
    missing = [k for k in ("fps", "features", "total_episodes") if k not in info]
    if missing:
        raise DatasetError(f"{path} lacks {missing}")
    for key in (LEROBOT_STATE, LEROBOT_ACTION):
        if key not in info["features"]:
            raise DatasetError(f"{src}: features lack {key!r} (have {sorted(info['features'])})")
    return info


def _names(info: dict[str, Any], key: str) -> list[str] | None:
    names = info["features"][key].get("names")
    if isinstance(names, dict):  # LeRobot's {"motors": [...]}
        names = next(iter(names.values()), None)
    shape = info["features"][key].get("shape") or [0]
    return list(names) if isinstance(names, list) and len(names) == int(np.prod(shape)) else None


class _V30:
    """A v3.0 dataset, read (and validated) by LeRobotDataset, episode by episode."""

    def __init__(self, root: Path):
        self.ds = LeRobotDataset(root, cache_episodes=0)
        self.cameras, self.num_episodes = self.ds.cameras, self.ds.num_episodes
        self.dropped: list[str] = []

    def episodes(self) -> Iterator[Episode]:
        for ep in range(self.num_episodes):
            table = self.ds.episode_table(ep)
            tasks = [self.ds.tasks[int(i)] for i in table["task_index"]]
            yield table["state"], table["action"], tasks, {c: self.ds.episode_frames(ep, c) for c in self.cameras}


class _V21:
    """A v2.x dataset: per-episode files, checked one episode at a time."""

    def __init__(self, root: Path, info: dict[str, Any]):
        self.root, self.info, self.fps = root, info, float(info["fps"])
        features = info["features"]
        self.keys = {camera_of(k): k for k, f in features.items() if camera_of(k) and f.get("dtype") in ("video", "image")}
        self.cameras = tuple(self.keys)
        kept = {LEROBOT_STATE, LEROBOT_ACTION, *INDEX_KEYS, *self.keys.values()}
        self.dropped = sorted(k for k in features if k not in kept)
        self.tasks = {int(r["task_index"]): r["task"] for r in self._jsonl("meta/tasks.jsonl")}
        self.lengths = {int(r["episode_index"]): int(r["length"]) for r in self._jsonl("meta/episodes.jsonl")}
        self.stats = {int(r["episode_index"]): r.get("stats", {}) for r in self._jsonl("meta/episodes_stats.jsonl", False)}
        self.num_episodes = int(info["total_episodes"])
        if sorted(self.lengths) != list(range(self.num_episodes)):
            raise DatasetError(f"{root}: meta/episodes.jsonl lists episodes {_span(sorted(self.lengths))}, info.json "
                               f"total_episodes={self.num_episodes}")

    def _jsonl(self, name: str, required: bool = True) -> list[dict[str, Any]]:
        path = self.root / name
        if not path.is_file():
            if required:
                raise DatasetError(f"{self.root}: {name} is missing (a v2.1 dataset has it)")
            return []
        try:
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except ValueError as exc:
            raise DatasetError(f"{path}: not JSON lines ({exc})") from None

    def _path(self, template_key: str, ep: int, **extra: str) -> Path:
        chunk = ep // int(self.info.get("chunks_size", 1000))
        template = self.info[template_key]
        return self.root / template.format(episode_chunk=chunk, episode_index=ep, **extra)

    def episodes(self) -> Iterator[Episode]:
        for ep in range(self.num_episodes):
            yield self._episode(ep)

    def _episode(self, ep: int) -> Episode:
        path = self._path("data_path", ep)
        if not path.is_file():
            raise DatasetError(f"episode {ep}: its data file {path.relative_to(self.root)} is missing")
        table = pq.read_table(path)
        length = self.lengths[ep]
        if table.num_rows != length:
            raise DatasetError(f"episode {ep}: {path.name} holds {table.num_rows} frames, meta/episodes.jsonl says {length}")
        vectors = {key: self._vector(table, key, ep) for key in (LEROBOT_STATE, LEROBOT_ACTION)}
        self._check_timestamps(table, ep)
        self._check_stats(ep)
        task_index = table.column("task_index").to_numpy() if "task_index" in table.column_names else np.zeros(length, int)
        unknown = sorted({int(i) for i in task_index} - set(self.tasks))
        if unknown:
            raise DatasetError(f"episode {ep}: task_index {unknown} is not in meta/tasks.jsonl")
        frames = {camera: self._frames(table, camera, ep, length) for camera in self.cameras}
        return vectors[LEROBOT_STATE], vectors[LEROBOT_ACTION], [self.tasks[int(i)] for i in task_index], frames

    def _vector(self, table, key: str, ep: int) -> np.ndarray:
        if key not in table.column_names:
            raise DatasetError(f"episode {ep}: the data file lacks {key!r}")
        values = column_matrix(table, key)
        expected = int(np.prod(self.info["features"][key].get("shape") or [values.shape[1]]))
        if values.shape[1] != expected:
            raise DatasetError(f"episode {ep}: {key} has {values.shape[1]} values a frame, info.json's shape says {expected}")
        if not np.isfinite(values).all():
            frame = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])
            raise DatasetError(f"episode {ep}: {key} is not finite at frame {frame}")
        return values

    def _check_timestamps(self, table, ep: int) -> None:
        if "timestamp" not in table.column_names or "frame_index" not in table.column_names:
            raise DatasetError(f"episode {ep}: the data file lacks timestamp or frame_index")
        ts = table.column("timestamp").to_numpy().astype(np.float64)
        fi = table.column("frame_index").to_numpy().astype(np.float64)
        bad = np.flatnonzero(np.abs(ts - fi / self.fps) > TIMESTAMP_TOLERANCE_S)
        if len(bad):
            k = int(bad[0])
            raise DatasetError(f"episode {ep}: frame {int(fi[k])} has timestamp {ts[k]:.6f} s, frame_index / fps = "
                               f"{fi[k] / self.fps:.6f} s at fps={self.info['fps']} (LeRobot's tolerance: "
                               f"{TIMESTAMP_TOLERANCE_S} s)")

    def _check_stats(self, ep: int) -> None:
        for feature, stats in self.stats.get(ep, {}).items():
            for name, value in stats.items():
                if not np.isfinite(np.asarray(value, dtype=np.float64)).all():
                    raise DatasetError(f"episode {ep}: meta/episodes_stats.jsonl {feature} {name} is not finite")

    def _frames(self, table, camera: str, ep: int, length: int) -> np.ndarray:
        key = self.keys[camera]
        if self.info["features"][key]["dtype"] == "image":
            frames = np.stack([decode_image(data, f"episode {ep} {key} frame {i}")
                               for i, data in enumerate(image_bytes(table, key, f"episode {ep}'s data file"))])
        else:
            path = self._path("video_path", ep, video_key=key)
            if not path.is_file():
                raise DatasetError(f"episode {ep}: {key}'s video {path.relative_to(self.root)} is missing")
            try:
                frames = read_mp4(path)
            except ValueError as exc:
                raise DatasetError(f"episode {ep}: {key}'s video {path.relative_to(self.root)} does not decode ({exc})") from None
        if len(frames) < length:
            raise DatasetError(f"episode {ep}: {key} has {len(frames)} frames, the episode {length}")
        return frames[:length]


def _span(indices: list[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if indices else "none"
