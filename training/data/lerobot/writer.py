"""Write a LeRobot v3.0 dataset while collecting: :class:`DatasetWriter`.

Every file is written to a hidden temp file and renamed, so a crash leaves either the old
file or the new one. The writer closes a file once it reaches its size (or ``episodes_per_file``) and then
rewrites the metadata, ``info.json`` last: what ``info.json`` describes is always complete.

The writer composes three parts: :class:`_EpisodeBuffer` (the episode being recorded, checked frame by
frame), :class:`_OpenFile` (the parquet rows and per-camera mp4 streams of the file being filled) and
:func:`_write_meta` (tasks, stats and ``info.json`` of the closed files).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot import provenance
from training.data.lerobot.layout import (
    CODEBASE_VERSION,
    DATA_PATH,
    DEFAULT_CHUNKS_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_EPISODES_PER_FILE,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    EPISODES_PATH,
    INFO_PATH,
    STAT_NAMES,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    video_key,
)
from training.data.lerobot.stats import ImageStats, pool_stats, stats_to_json, table_stats
from training.data.lerobot.tables import fixed_list, tasks_table, write_parquet
from training.data.lerobot.video import DEFAULT_GOP, Mp4Stream
from wam_gym.utils.publish import atomic_write_text, check_destination, writer_lock

log = logging.getLogger(__name__)


class DatasetWriter:
    """Record episodes into a LeRobot v3.0 dataset at ``root``.

    ``add_frame`` once per step (the observation before the action, the action taken, the
    instruction as task), then ``save_episode`` (or ``clear_episode`` to drop it), and
    ``finalize`` at the end; as a context manager it finalizes on exit. Episodes share one parquet
    file and one mp4 per camera until the data reaches ``data_files_size_in_mb`` or a camera's
    video ``video_files_size_in_mb`` (LeRobot's rule and defaults; ``episodes_per_file`` caps the
    count too); ``chunks_size`` files share a chunk directory. In the mp4s every episode starts on
    a keyframe and keyframes are at most ``video_gop`` frames apart (None: one encode per file with
    the encoder's default spacing), so random access decodes little. An existing dataset at
    ``root`` is replaced only with ``overwrite=True``. ``orientations`` (camera -> ``envs.orientation``
    name; None: all upright, as our envs render) and ``suites`` (the benchmark suites the episodes come
    from) are recorded in ``info.json`` (``training.data.lerobot.provenance``).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        fps: float,
        cameras: Sequence[str],
        *,
        robot_type: str = provenance.OURS,
        state_names: Sequence[str] | None = None,
        action_names: Sequence[str] | None = None,
        episodes_per_file: int | None = DEFAULT_EPISODES_PER_FILE,
        data_files_size_in_mb: float = DEFAULT_DATA_FILE_SIZE_IN_MB,
        video_files_size_in_mb: float = DEFAULT_VIDEO_FILE_SIZE_IN_MB,
        chunks_size: int = DEFAULT_CHUNKS_SIZE,
        video_gop: int | None = DEFAULT_GOP,
        orientations: Mapping[str, str] | None = None,
        suites: Sequence[str] = (),
        overwrite: bool = False,
    ):
        _check_arguments(cameras, fps, episodes_per_file, chunks_size, data_files_size_in_mb, video_files_size_in_mb)
        self.root = Path(root).expanduser()
        self.fps = float(fps) if float(fps) != int(fps) else int(fps)
        self.cameras = tuple(cameras)
        self.orientations = provenance.writer_orientations(self.cameras, orientations)
        self.suites = tuple(suites)
        self.robot_type = robot_type
        self.state_names = list(state_names) if state_names is not None else None
        self.action_names = list(action_names) if action_names is not None else None
        self.episodes_per_file = None if episodes_per_file is None else int(episodes_per_file)
        self.data_files_size_in_mb, self.video_files_size_in_mb = data_files_size_in_mb, video_files_size_in_mb
        if video_gop is not None and int(video_gop) < 1:
            raise ValueError(f"video_gop must be >= 1 (frames between keyframes) or None, got {video_gop!r}")
        self.video_gop = video_gop
        self.chunks_size = int(chunks_size)
        # One writer per dataset, from here to finalize/abort: a second collect (or convert) into the same
        # root is refused, naming this one, instead of deleting its files under it.
        self._lock = ExitStack()
        self._lock.enter_context(writer_lock(self.root))
        try:
            _prepare_root(self.root, overwrite)
        except BaseException:
            self._lock.close()
            raise

        self._tasks: dict[str, int] = {}
        self._episodes: list[dict[str, Any]] = []  # metadata rows of every saved episode
        self._episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self._total_frames = 0
        self._pending = _EpisodeBuffer(self.cameras, self.state_names, self.action_names)
        self._file = _OpenFile(self.root, self.fps, self.cameras, self.video_gop, self.chunks_size,
                               (self.episodes_per_file, data_files_size_in_mb, video_files_size_in_mb))
        self._finalized = False

    # -- public API ------------------------------------------------------------------------
    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    @property
    def num_frames(self) -> int:
        return self._total_frames

    @property
    def pending_frames(self) -> int:
        return len(self._pending.state)

    def add_frame(self, pixels: Mapping[str, np.ndarray], state: Any, action: Any, task: str) -> None:
        """Buffer one step of the current episode."""
        if self._finalized:
            raise RuntimeError("the writer is finalized; make a new DatasetWriter")
        self._pending.add(pixels, state, action, task)

    def clear_episode(self) -> None:
        """Drop the frames buffered since the last ``save_episode``."""
        self._pending.clear()

    def save_episode(self) -> int:
        """Write the buffered frames as the next episode; returns its episode_index."""
        if self._finalized:
            raise RuntimeError("the writer is finalized; make a new DatasetWriter")
        pending = self._pending
        length = len(pending.state)
        if not length:
            raise ValueError("no frames to save: call add_frame first")
        ep = len(self._episodes)
        task_ids = [self._tasks.setdefault(t, len(self._tasks)) for t in pending.task]
        table = pending.table(ep, self._total_frames, self.fps, task_ids)
        stats = table_stats(table)
        row = self._file.add_episode(ep, pending, table, stats, self._total_frames)
        self._episodes.append(row)
        self._episode_stats.append(stats)
        self._total_frames += length
        pending.clear()
        if self._file.full():
            self._close_file()
        return ep

    def finalize(self) -> Path:
        """Close the open file and write the metadata (``info.json`` last). Idempotent."""
        if self._finalized:
            return self.root
        if self.pending_frames:
            log.warning("discarding %d frames of an episode that was never saved", self.pending_frames)
            self.clear_episode()
        if not self._episodes:
            self.abort()
            raise ValueError(f"no episodes were saved; nothing was written to {self.root}")
        if self._file.episodes:
            self._close_file()
        self._finalized = True
        self._lock.close()
        return self.root

    def abort(self) -> None:
        """Stop without closing the open file: its temp videos are removed, its episodes lost."""
        self._file.abort()
        self._finalized = True
        self._lock.close()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
            return
        # Interrupted: keep the episodes already saved (complete files), drop the rest.
        if self._episodes and not self._finalized:
            try:
                self.finalize()
            except Exception:
                log.exception("could not finalize %s after an error", self.root)
                self.abort()
        else:
            self.abort()

    # -- internals ---------------------------------------------------------------------------
    def _close_file(self) -> None:
        """Write the open file's parquet files and mp4s, then the metadata that now describes it."""
        self._file.close()
        closed = len(self._episodes) - len(self._file.episodes)
        _write_meta(self, self._episodes[:closed], self._episode_stats[:closed])


def _check_arguments(cameras, fps, episodes_per_file, chunks_size, data_files_size_in_mb, video_files_size_in_mb) -> None:
    """Refuse a layout no dataset can have, before anything is locked or deleted."""
    if not cameras:
        raise ValueError("at least one camera is required")
    if len(set(cameras)) != len(cameras):
        raise ValueError(f"duplicate cameras in {list(cameras)}")
    if not fps or fps <= 0:
        raise ValueError(f"fps must be positive, got {fps!r}")
    if (episodes_per_file is not None and episodes_per_file < 1) or chunks_size < 1:
        raise ValueError("episodes_per_file (or None) and chunks_size must be >= 1")
    if min(data_files_size_in_mb, video_files_size_in_mb) <= 0:
        raise ValueError("data_files_size_in_mb and video_files_size_in_mb must be > 0")


def _prepare_root(root: Path, overwrite: bool) -> None:
    """The project's one rule (``check_destination``): an empty or new root is written, anything else only
    with ``overwrite``, which replaces a dataset's own entries (a file or link at the root, or its meta/,
    data/ and videos/) and nothing else there."""
    check_destination(root, overwrite)
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        root.unlink()
    for p in (root / d for d in ("meta", "data", "videos")):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    root.mkdir(parents=True, exist_ok=True)


class _EpisodeBuffer:
    """The frames of the episode being recorded, each checked as it arrives, and the image shapes and
    vector sizes the first frame fixed for the whole dataset (``info.json``'s features)."""

    def __init__(self, cameras: tuple[str, ...], state_names: list[str] | None, action_names: list[str] | None):
        self.cameras = cameras
        self.names = {"state": state_names, "action": action_names}
        self.image_shapes: dict[str, tuple[int, int, int]] = {}
        self.dims: dict[str, int | None] = {"state": None, "action": None}
        self.clear()

    def clear(self) -> None:
        self.frames: dict[str, list[np.ndarray]] = {c: [] for c in self.cameras}
        self.state: list[np.ndarray] = []
        self.action: list[np.ndarray] = []
        self.task: list[str] = []

    def add(self, pixels: Mapping[str, np.ndarray], state: Any, action: Any, task: str) -> None:
        missing = [c for c in self.cameras if c not in pixels]
        if missing:
            raise ValueError(f"pixels lack camera(s) {missing} (have {sorted(pixels)}); the writer records {list(self.cameras)}")
        frames = {}
        for cam in self.cameras:
            img = np.asarray(pixels[cam])
            if img.dtype != np.uint8 or img.ndim != 3 or img.shape[-1] != 3:
                raise ValueError(f"pixels[{cam!r}] must be uint8 (H, W, 3), got {img.dtype} {img.shape}")
            expected = self.image_shapes.setdefault(cam, tuple(img.shape))
            if img.shape != expected:
                raise ValueError(f"pixels[{cam!r}] has shape {img.shape}, earlier frames {expected}")
            frames[cam] = np.array(img, copy=True, order="C")
        state = self._vector(state, "state")
        action = self._vector(action, "action")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task must be a non-empty string (the instruction training conditions on), got {task!r}")
        for cam, img in frames.items():
            self.frames[cam].append(img)
        self.state.append(state)
        self.action.append(action)
        self.task.append(task)

    def _vector(self, value: Any, name: str) -> np.ndarray:
        v = np.asarray(value, dtype=np.float32)
        if v.ndim != 1 or not len(v):
            raise ValueError(f"{name} must be a 1-D vector, got shape {v.shape}")
        if not np.isfinite(v).all():  # refused here, where it enters, not later by every reader
            raise ValueError(f"{name} must be finite, got {v.tolist()} (frame {len(self.state)} of the "
                             f"episode); drop the episode with clear_episode()")
        dim = self.dims[name]
        if dim is None:
            names = self.names[name]
            if names is not None and len(names) != len(v):
                raise ValueError(f"{name} has {len(v)} dims but {len(names)} names were given")
            self.dims[name] = len(v)
        elif len(v) != dim:
            raise ValueError(f"{name} has {len(v)} dims, earlier frames {dim}")
        return v.copy()

    def table(self, ep: int, first_index: int, fps: float, task_ids: list[int]) -> dict[str, np.ndarray]:
        """The episode's data columns, as the parquet file holds them."""
        length = len(self.state)
        frame_index = np.arange(length, dtype=np.int64)
        return {
            "state": np.stack(self.state),
            "action": np.stack(self.action),
            "timestamp": (frame_index / fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(length, ep, dtype=np.int64),
            "index": first_index + frame_index,
            "task_index": np.asarray(task_ids, dtype=np.int64),
        }


class _OpenFile:
    """The file being filled: its episodes' data rows and metadata rows in memory, each camera's frames
    streaming into its mp4, until ``full`` says to ``close`` it (LeRobot's rotation)."""

    def __init__(self, root: Path, fps: float, cameras: tuple[str, ...], video_gop: int | None, chunks_size: int,
                 limits: tuple[int | None, float, float]):
        # No reference back to the writer: a writer dropped without finalize/abort (convert on a broken source)
        # is freed at once, and its lock with it, only while nothing it holds points back at it.
        self.root, self.fps, self.cameras, self.video_gop, self.chunks_size = root, fps, cameras, video_gop, chunks_size
        self.episodes_per_file, self.data_files_size_in_mb, self.video_files_size_in_mb = limits
        self.number = 0  # files closed so far
        self.rows: list[dict[str, np.ndarray]] = []
        self.episodes: list[dict[str, Any]] = []
        self.stats: list[dict[str, dict[str, np.ndarray]]] = []
        self.streams: dict[str, Mp4Stream] = {}

    def location(self) -> tuple[int, int]:
        """(chunk_index, file_index) of this file."""
        return divmod(self.number, self.chunks_size)

    def add_episode(self, ep: int, pending: _EpisodeBuffer, table: dict, stats: dict, first_index: int) -> dict[str, Any]:
        """Append an episode: its rows kept, its frames encoded, its image stats added to ``stats``;
        returns its metadata row (the episodes parquet's columns, in their order)."""
        length = len(table["state"])
        chunk, file = self.location()
        if not self.streams:
            for cam in self.cameras:
                path = self.root / VIDEO_PATH.format(video_key=video_key(cam), chunk_index=chunk, file_index=file)
                self.streams[cam] = Mp4Stream(path, self.fps, self.video_gop)
        row: dict[str, Any] = {
            "episode_index": ep,
            "tasks": list(dict.fromkeys(pending.task)),
            "length": length,
            "data/chunk_index": chunk,
            "data/file_index": file,
            "dataset_from_index": first_index,
            "dataset_to_index": first_index + length,
        }
        for cam in self.cameras:
            stream, key = self.streams[cam], video_key(cam)
            image_stats = ImageStats()
            for img in pending.frames[cam]:
                image_stats.add(img)
            stats[key] = image_stats.result()
            row[f"videos/{key}/chunk_index"] = chunk
            row[f"videos/{key}/file_index"] = file
            row[f"videos/{key}/from_timestamp"] = stream.frames / self.fps
            row[f"videos/{key}/to_timestamp"] = (stream.frames + length) / self.fps
            stream.write(pending.frames[cam])
        row["meta/episodes/chunk_index"] = chunk
        row["meta/episodes/file_index"] = file
        self.rows.append(table)
        self.episodes.append(row)
        self.stats.append(stats)
        return row

    def full(self) -> bool:
        """Close the open file (its parquet and every camera's mp4) once its data or a camera's video
        has reached its size, as LeRobot rotates files (or after ``episodes_per_file`` episodes). The
        data is counted as it sits in memory, uncompressed: the parquet file comes out smaller. A
        video counts once its episodes are encoded (one encode per file, video_gop=None: by data alone)."""
        if self.episodes_per_file is not None and len(self.episodes) >= self.episodes_per_file:
            return True
        data_mb = sum(v.nbytes for table in self.rows for v in table.values()) / 2**20
        video_mb = max((stream.encoded_bytes() for stream in self.streams.values()), default=0) / 2**20
        return data_mb >= self.data_files_size_in_mb or video_mb >= self.video_files_size_in_mb

    def close(self) -> None:
        """Finish the mp4s, write the data and episodes parquet files, and start the next file."""
        chunk, file = self.location()
        for stream in self.streams.values():
            stream.close()
        self.streams = {}
        cat = {k: np.concatenate([r[k] for r in self.rows]) for k in self.rows[0]}
        data = pa.table(
            {
                LEROBOT_STATE: fixed_list(cat["state"]),
                LEROBOT_ACTION: fixed_list(cat["action"]),
                "timestamp": pa.array(cat["timestamp"], pa.float32()),
                "frame_index": pa.array(cat["frame_index"], pa.int64()),
                "episode_index": pa.array(cat["episode_index"], pa.int64()),
                "index": pa.array(cat["index"], pa.int64()),
                "task_index": pa.array(cat["task_index"], pa.int64()),
            }
        )
        root = self.root
        write_parquet(data, root / DATA_PATH.format(chunk_index=chunk, file_index=file))
        write_parquet(_episodes_table(self.episodes, self.stats), root / EPISODES_PATH.format(chunk_index=chunk, file_index=file))
        self.rows, self.episodes, self.stats = [], [], []
        self.number += 1

    def abort(self) -> None:
        """Drop the file: its temp videos removed, its episodes lost."""
        for stream in self.streams.values():
            stream.abort()
        self.streams = {}
        self.rows, self.episodes, self.stats = [], [], []

    def __del__(self) -> None:
        # A writer dropped without finalize/abort (an error mid-convert): its encoder threads would wait for frames
        # forever, and a process later forked with them idle inherits their state.
        self.abort()


def _episodes_table(rows: list[dict[str, Any]], stats: list[dict[str, dict[str, np.ndarray]]]) -> pa.Table:
    """The episodes parquet of one file: each episode's metadata row, then its per-feature stats."""
    columns: dict[str, pa.Array] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if key == "tasks":
            columns[key] = pa.array(values, pa.list_(pa.string()))
        elif key.endswith("timestamp"):
            columns[key] = pa.array(values, pa.float64())
        else:
            columns[key] = pa.array(values, pa.int64())
    for feature in stats[0]:
        for name in STAT_NAMES:
            columns[f"stats/{feature}/{name}"] = pa.array([s[feature][name].tolist() for s in stats])
    return pa.table(columns)


def _features(writer: DatasetWriter, pending: _EpisodeBuffer) -> dict[str, Any]:
    """``info.json``'s features: every camera's video, then the state, action and index columns."""
    features: dict[str, Any] = {}
    for cam in writer.cameras:
        h, w, c = pending.image_shapes[cam]
        features[video_key(cam)] = {
            "dtype": "video",
            "shape": [h, w, c],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": h,
                "video.width": w,
                "video.codec": "h264",
                "video.pix_fmt": "yuv420p" if h % 2 == 0 and w % 2 == 0 else "yuv444p",
                "video.is_depth_map": False,
                "video.fps": writer.fps,
                "video.channels": c,
                "has_audio": False,
                provenance.ORIENTATION_KEY: writer.orientations[cam],
            },
        }
    s, a = pending.dims["state"], pending.dims["action"]
    state_names = writer.state_names or [f"state_{i}" for i in range(s)]
    action_names = writer.action_names or [f"action_{i}" for i in range(a)]
    features[LEROBOT_STATE] = {"dtype": "float32", "shape": [s], "names": state_names}
    features[LEROBOT_ACTION] = {"dtype": "float32", "shape": [a], "names": action_names}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in ("frame_index", "episode_index", "index", "task_index"):
        features[key] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _write_meta(writer: DatasetWriter, closed: list[dict[str, Any]], parts: list[dict[str, dict[str, np.ndarray]]]) -> None:
    """tasks, stats, then info.json, describing the ``closed`` episodes (every closed file's) and their stats."""
    n = len(closed)
    tasks = sorted(writer._tasks, key=writer._tasks.get)
    write_parquet(tasks_table(tasks), writer.root / TASKS_PATH)
    stats = {f: pool_stats([p[f] for p in parts]) for f in parts[0]}
    atomic_write_text(writer.root / STATS_PATH, stats_to_json(stats))
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": writer.robot_type,
        "total_episodes": n,
        "total_frames": sum(e["length"] for e in closed),
        "total_tasks": len({t for e in closed for t in e["tasks"]}),
        "chunks_size": writer.chunks_size,
        "data_files_size_in_mb": writer.data_files_size_in_mb,
        "video_files_size_in_mb": writer.video_files_size_in_mb,
        "fps": writer.fps,
        "splits": {"train": f"0:{n}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH,
        "features": _features(writer, writer._pending),
        **provenance.suites_entry(writer.suites),
    }
    atomic_write_text(writer.root / INFO_PATH, json.dumps(info, indent=4) + "\n")
