"""LeRobot v3.0 datasets: write them while collecting, read them for training.

Layout (``codebase_version`` ``"v3.0"``)::

    ROOT/meta/info.json                                   schema, fps, totals, path templates
    ROOT/meta/stats.json                                  per-feature min/max/mean/std/count
    ROOT/meta/tasks.parquet                               task string -> task_index
    ROOT/meta/episodes/chunk-000/file-000.parquet         one row per episode: length, tasks,
                                                          where its rows and video spans are
    ROOT/data/chunk-000/file-000.parquet                  one row per frame (state, action, indices)
    ROOT/videos/observation.images.<camera>/chunk-000/file-000.mp4
                                                          the episodes of one data file, concatenated

An episode's frames in a video file are ``[from_timestamp, to_timestamp)`` of that file; frame
``k`` of the file has presentation time ``k / fps``. Images statistics are per channel, in
[0, 1], shaped ``(3, 1, 1)``; every other feature's are per dimension. Standard deviations
are population ones (``ddof=0``).

Every file is written to a hidden temp file and renamed, so a crash leaves either the old
file or the new one. The writer closes a file after ``episodes_per_file`` episodes and then
rewrites the metadata, ``info.json`` last: what ``info.json`` describes is always complete.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import imageio.v2 as imageio
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wam_gym.utils.publish import atomic_write, atomic_write_text
from wam_gym.utils.video import read_mp4, write_mp4

log = logging.getLogger(__name__)

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
INDEX_KEYS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
STAT_NAMES = ("min", "max", "mean", "std", "count")
DEFAULT_CHUNKS_SIZE = 1000
DEFAULT_EPISODES_PER_FILE = 50
_COLLECT_HINT = "python -m training.collect --env ENV_ID --output {root} --overwrite"


class DatasetError(ValueError):
    """A dataset on disk is missing, incomplete or in a format this reader does not support."""


def video_key(camera: str) -> str:
    return IMAGE_PREFIX + camera


# ----------------------------------------------------------------------------- statistics
def vector_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """min/max/mean/std/count per dimension of ``(T, D)`` values (computed in float64)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    return {
        "min": x.min(axis=0),
        "max": x.max(axis=0),
        "mean": x.mean(axis=0),
        "std": x.std(axis=0),
        "count": np.array([len(x)], dtype=np.int64),
    }


class ImageStats:
    """Per-channel statistics of uint8 RGB frames, accumulated exactly (integer sums)."""

    def __init__(self) -> None:
        self.count = 0  # frames
        self.pixels = 0  # values per channel
        self.sum = np.zeros(3, dtype=np.int64)
        self.sumsq = np.zeros(3, dtype=np.int64)
        self.min = np.full(3, 255, dtype=np.int64)
        self.max = np.zeros(3, dtype=np.int64)

    def add(self, frame: np.ndarray) -> None:
        flat = np.asarray(frame).reshape(-1, 3).astype(np.int64)
        self.count += 1
        self.pixels += len(flat)
        self.sum += flat.sum(axis=0)
        self.sumsq += (flat * flat).sum(axis=0)
        self.min = np.minimum(self.min, flat.min(axis=0))
        self.max = np.maximum(self.max, flat.max(axis=0))

    def result(self) -> dict[str, np.ndarray]:
        """LeRobot's image statistics: values in [0, 1], each of shape (3, 1, 1)."""
        if not self.count:
            raise ValueError("no frames")
        mean = self.sum / self.pixels
        var = np.maximum(self.sumsq / self.pixels - mean * mean, 0.0)

        def shaped(v: np.ndarray) -> np.ndarray:
            return (np.asarray(v, dtype=np.float64) / 255.0).reshape(3, 1, 1)

        return {
            "min": shaped(self.min),
            "max": shaped(self.max),
            "mean": shaped(mean),
            "std": shaped(np.sqrt(var)),
            "count": np.array([self.count], dtype=np.int64),
        }


def pool_stats(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode statistics into the statistics of all their frames.

    Exact for mean and (population) std: ``var = sum_i n_i (var_i + (mean_i - mean)^2) / N``.
    """
    if not parts:
        raise ValueError("no statistics to pool")
    counts = np.array([int(np.asarray(p["count"]).reshape(-1)[0]) for p in parts], dtype=np.float64)
    total = counts.sum()
    shape = (-1,) + (1,) * np.asarray(parts[0]["mean"]).ndim
    w = (counts / total).reshape(shape)
    means = np.stack([np.asarray(p["mean"], dtype=np.float64) for p in parts])
    stds = np.stack([np.asarray(p["std"], dtype=np.float64) for p in parts])
    mean = (w * means).sum(axis=0)
    var = (w * (stds**2 + (means - mean) ** 2)).sum(axis=0)
    return {
        "min": np.min(np.stack([np.asarray(p["min"], dtype=np.float64) for p in parts]), axis=0),
        "max": np.max(np.stack([np.asarray(p["max"], dtype=np.float64) for p in parts]), axis=0),
        "mean": mean,
        "std": np.sqrt(np.maximum(var, 0.0)),
        "count": np.array([int(total)], dtype=np.int64),
    }


def _table_stats(table: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of one episode's non-image features."""
    return {
        STATE_KEY: vector_stats(table["state"]),
        ACTION_KEY: vector_stats(table["action"]),
        **{k: vector_stats(table[k]) for k in INDEX_KEYS},
    }


def _stats_to_json(stats: Mapping[str, Mapping[str, np.ndarray]]) -> str:
    out = {f: {s: np.asarray(v).tolist() for s, v in st.items()} for f, st in stats.items()}
    return json.dumps(out, indent=2) + "\n"


# ----------------------------------------------------------------------------- file helpers
def _atomic_write_parquet(table: pa.Table, path: Path) -> None:
    atomic_write(path, lambda f: pq.write_table(table, f))


def _fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def _column_matrix(table: pa.Table, name: str) -> np.ndarray:
    """A list column (fixed or variable size, one length) as a 2-D float32 array."""
    col = table.column(name).combine_chunks()
    flat = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    return flat.reshape(len(col), -1) if len(col) else flat.reshape(0, 0)


def _tasks_table(tasks: Sequence[str]) -> pa.Table:
    """tasks.parquet as pandas writes LeRobot's DataFrame: the task string is the index."""
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(list(tasks), pa.string())})
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def _read_tasks(path: Path) -> list[str]:
    table = pq.read_table(path)
    names = table.column_names
    text_col = "task" if "task" in names else next((n for n in names if n != "task_index"), None)
    if text_col is None or "task_index" not in names:
        raise DatasetError(f"{path} must have columns task_index and task (has {names})")
    pairs = sorted(zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist()))
    if [i for i, _ in pairs] != list(range(len(pairs))):
        raise DatasetError(f"{path}: task_index must be 0..{len(pairs) - 1}")
    return [t for _, t in pairs]


class _Mp4Stream:
    """Frames pushed one episode at a time into :func:`write_mp4`, which runs in a thread.

    ``write_mp4`` encodes into a hidden temp file and renames it when the stream closes, so a
    half-written video never sits at its final path; :meth:`abort` removes the temp file.
    """

    _END = object()
    _ABORT = object()

    class _Aborted(Exception):
        pass

    def __init__(self, path: Path, fps: float):
        self.path = path
        self.fps = fps
        self.frames = 0
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"mp4:{path.name}", daemon=True)
        self._thread.start()

    def _source(self) -> Iterator[np.ndarray]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if item is self._ABORT:
                raise self._Aborted
            yield item

    def _run(self) -> None:
        try:
            write_mp4(self.path, self._source(), fps=self.fps)
        except self._Aborted:
            pass
        except BaseException as e:  # reported to the writer's thread on its next call
            self._error = e

    def _put(self, item: Any) -> None:
        while True:
            self._check()
            if not self._thread.is_alive():
                raise RuntimeError(f"video encoder for {self.path} stopped unexpectedly")
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"encoding {self.path} failed: {self._error}") from self._error

    def write(self, frames: Sequence[np.ndarray]) -> None:
        for frame in frames:
            self._put(frame)
        self.frames += len(frames)

    def close(self) -> None:
        self._put(self._END)
        self._thread.join()
        self._check()

    def abort(self) -> None:
        if self._thread.is_alive():
            try:
                self._queue.put(self._ABORT, timeout=5)
            except queue.Full:
                return
            self._thread.join(timeout=30)


# ----------------------------------------------------------------------------- writer
class DatasetWriter:
    """Record episodes into a LeRobot v3.0 dataset at ``root``.

    ``add_frame`` once per step (the observation before the action, the action taken, the
    instruction as task), then ``save_episode`` (or ``clear_episode`` to drop it), and
    ``finalize`` at the end; as a context manager it finalizes on exit. ``episodes_per_file``
    episodes share one parquet file and one mp4 per camera; ``chunks_size`` files share a
    chunk directory. An existing dataset at ``root`` is replaced only with ``overwrite=True``.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        fps: float,
        cameras: Sequence[str],
        *,
        robot_type: str = "wam_gym",
        state_names: Sequence[str] | None = None,
        action_names: Sequence[str] | None = None,
        episodes_per_file: int = DEFAULT_EPISODES_PER_FILE,
        chunks_size: int = DEFAULT_CHUNKS_SIZE,
        overwrite: bool = False,
    ):
        if not cameras:
            raise ValueError("at least one camera is required")
        if len(set(cameras)) != len(cameras):
            raise ValueError(f"duplicate cameras in {list(cameras)}")
        if not fps or fps <= 0:
            raise ValueError(f"fps must be positive, got {fps!r}")
        if episodes_per_file < 1 or chunks_size < 1:
            raise ValueError("episodes_per_file and chunks_size must be >= 1")
        self.root = Path(root).expanduser()
        self.fps = float(fps) if float(fps) != int(fps) else int(fps)
        self.cameras = tuple(cameras)
        self.robot_type = robot_type
        self.state_names = list(state_names) if state_names is not None else None
        self.action_names = list(action_names) if action_names is not None else None
        self.episodes_per_file = int(episodes_per_file)
        self.chunks_size = int(chunks_size)
        self._prepare_root(overwrite)

        self._image_shapes: dict[str, tuple[int, int, int]] = {}
        self._state_dim: int | None = None
        self._action_dim: int | None = None
        self._tasks: dict[str, int] = {}
        self._episodes: list[dict[str, Any]] = []  # metadata rows of every saved episode
        self._episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self._total_frames = 0
        self._file_number = 0  # files closed so far
        self._file_rows: list[dict[str, np.ndarray]] = []
        self._file_episodes: list[dict[str, Any]] = []
        self._streams: dict[str, _Mp4Stream] = {}
        self._pending: dict[str, list] = self._empty_episode()
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
        return len(self._pending["state"])

    def add_frame(self, pixels: Mapping[str, np.ndarray], state: Any, action: Any, task: str) -> None:
        """Buffer one step of the current episode."""
        if self._finalized:
            raise RuntimeError("the writer is finalized; make a new DatasetWriter")
        missing = [c for c in self.cameras if c not in pixels]
        if missing:
            raise ValueError(f"pixels lack camera(s) {missing} (have {sorted(pixels)}); the writer records {list(self.cameras)}")
        frames = {}
        for cam in self.cameras:
            img = np.asarray(pixels[cam])
            if img.dtype != np.uint8 or img.ndim != 3 or img.shape[-1] != 3:
                raise ValueError(f"pixels[{cam!r}] must be uint8 (H, W, 3), got {img.dtype} {img.shape}")
            expected = self._image_shapes.setdefault(cam, tuple(img.shape))
            if img.shape != expected:
                raise ValueError(f"pixels[{cam!r}] has shape {img.shape}, earlier frames {expected}")
            frames[cam] = np.array(img, copy=True, order="C")
        state = self._vector(state, "state")
        action = self._vector(action, "action")
        if not isinstance(task, str) or not task:
            raise ValueError(f"task must be a non-empty string, got {task!r}")
        for cam, img in frames.items():
            self._pending["frames"][cam].append(img)
        self._pending["state"].append(state)
        self._pending["action"].append(action)
        self._pending["task"].append(task)

    def clear_episode(self) -> None:
        """Drop the frames buffered since the last ``save_episode``."""
        self._pending = self._empty_episode()

    def save_episode(self) -> int:
        """Write the buffered frames as the next episode; returns its episode_index."""
        if self._finalized:
            raise RuntimeError("the writer is finalized; make a new DatasetWriter")
        pending = self._pending
        length = len(pending["state"])
        if not length:
            raise ValueError("no frames to save: call add_frame first")
        ep = len(self._episodes)
        chunk, file = divmod(self._file_number, self.chunks_size)
        if not self._streams:
            for cam in self.cameras:
                path = self.root / VIDEO_PATH.format(video_key=video_key(cam), chunk_index=chunk, file_index=file)
                self._streams[cam] = _Mp4Stream(path, self.fps)

        task_ids = []
        for t in pending["task"]:
            task_ids.append(self._tasks.setdefault(t, len(self._tasks)))
        frame_index = np.arange(length, dtype=np.int64)
        table = {
            "state": np.stack(pending["state"]),
            "action": np.stack(pending["action"]),
            "timestamp": (frame_index / self.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(length, ep, dtype=np.int64),
            "index": self._total_frames + frame_index,
            "task_index": np.asarray(task_ids, dtype=np.int64),
        }
        stats = _table_stats(table)
        row: dict[str, Any] = {
            "episode_index": ep,
            "tasks": list(dict.fromkeys(pending["task"])),
            "length": length,
            "data/chunk_index": chunk,
            "data/file_index": file,
            "dataset_from_index": self._total_frames,
            "dataset_to_index": self._total_frames + length,
        }
        for cam in self.cameras:
            stream = self._streams[cam]
            image_stats = ImageStats()
            for img in pending["frames"][cam]:
                image_stats.add(img)
            stats[video_key(cam)] = image_stats.result()
            key = video_key(cam)
            row[f"videos/{key}/chunk_index"] = chunk
            row[f"videos/{key}/file_index"] = file
            row[f"videos/{key}/from_timestamp"] = stream.frames / self.fps
            row[f"videos/{key}/to_timestamp"] = (stream.frames + length) / self.fps
            stream.write(pending["frames"][cam])
        row["meta/episodes/chunk_index"] = chunk
        row["meta/episodes/file_index"] = file

        self._file_rows.append(table)
        self._file_episodes.append(row)
        self._episodes.append(row)
        self._episode_stats.append(stats)
        self._total_frames += length
        self._pending = self._empty_episode()
        if len(self._file_episodes) >= self.episodes_per_file:
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
        if self._file_episodes:
            self._close_file()
        self._finalized = True
        return self.root

    def abort(self) -> None:
        """Stop without closing the open file: its temp videos are removed, its episodes lost."""
        for stream in self._streams.values():
            stream.abort()
        self._streams = {}
        self._file_rows, self._file_episodes = [], []
        self._finalized = True

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
    def _prepare_root(self, overwrite: bool) -> None:
        owned = [self.root / d for d in ("meta", "data", "videos")]
        existing = [p for p in owned if p.exists()]
        if existing and not overwrite:
            raise FileExistsError(
                f"{self.root} already holds a dataset ({', '.join(p.name + '/' for p in existing)}); "
                "pass overwrite=True (--overwrite) to replace it, or choose another output"
            )
        for p in existing:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        self.root.mkdir(parents=True, exist_ok=True)

    def _empty_episode(self) -> dict[str, Any]:
        return {"frames": {c: [] for c in self.cameras}, "state": [], "action": [], "task": []}

    def _vector(self, value: Any, name: str) -> np.ndarray:
        v = np.asarray(value, dtype=np.float32)
        if v.ndim != 1 or not len(v):
            raise ValueError(f"{name} must be a 1-D vector, got shape {v.shape}")
        attr = f"_{name}_dim"
        dim = getattr(self, attr)
        if dim is None:
            names = self.state_names if name == "state" else self.action_names
            if names is not None and len(names) != len(v):
                raise ValueError(f"{name} has {len(v)} dims but {len(names)} names were given")
            setattr(self, attr, len(v))
        elif len(v) != dim:
            raise ValueError(f"{name} has {len(v)} dims, earlier frames {dim}")
        return v.copy()

    def _close_file(self) -> None:
        chunk, file = divmod(self._file_number, self.chunks_size)
        for stream in self._streams.values():
            stream.close()
        self._streams = {}
        rows = self._file_rows
        cat = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        data = pa.table(
            {
                STATE_KEY: _fixed_list(cat["state"]),
                ACTION_KEY: _fixed_list(cat["action"]),
                "timestamp": pa.array(cat["timestamp"], pa.float32()),
                "frame_index": pa.array(cat["frame_index"], pa.int64()),
                "episode_index": pa.array(cat["episode_index"], pa.int64()),
                "index": pa.array(cat["index"], pa.int64()),
                "task_index": pa.array(cat["task_index"], pa.int64()),
            }
        )
        _atomic_write_parquet(data, self.root / DATA_PATH.format(chunk_index=chunk, file_index=file))
        _atomic_write_parquet(self._episodes_table(), self.root / EPISODES_PATH.format(chunk_index=chunk, file_index=file))
        self._file_rows, self._file_episodes = [], []
        self._file_number += 1
        self._write_meta()

    def _episodes_table(self) -> pa.Table:
        rows = self._file_episodes
        columns: dict[str, pa.Array] = {}
        for key in rows[0]:
            values = [r[key] for r in rows]
            if key == "tasks":
                columns[key] = pa.array(values, pa.list_(pa.string()))
            elif key.endswith("timestamp"):
                columns[key] = pa.array(values, pa.float64())
            else:
                columns[key] = pa.array(values, pa.int64())
        first = len(self._episodes) - len(rows)
        for feature in self._episode_stats[first]:
            for name in STAT_NAMES:
                values = [self._episode_stats[first + i][feature][name].tolist() for i in range(len(rows))]
                columns[f"stats/{feature}/{name}"] = pa.array(values)
        return pa.table(columns)

    def _features(self) -> dict[str, Any]:
        features: dict[str, Any] = {}
        for cam in self.cameras:
            h, w, c = self._image_shapes[cam]
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
                    "video.fps": self.fps,
                    "video.channels": c,
                    "has_audio": False,
                },
            }
        s, a = self._state_dim, self._action_dim
        features[STATE_KEY] = {"dtype": "float32", "shape": [s], "names": self.state_names or [f"state_{i}" for i in range(s)]}
        features[ACTION_KEY] = {"dtype": "float32", "shape": [a], "names": self.action_names or [f"action_{i}" for i in range(a)]}
        features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
        for key in ("frame_index", "episode_index", "index", "task_index"):
            features[key] = {"dtype": "int64", "shape": [1], "names": None}
        return features

    def _write_meta(self) -> None:
        """tasks, stats, then info.json, describing every closed file."""
        closed = self._episodes[: len(self._episodes) - len(self._file_episodes)]
        n = len(closed)
        frames = sum(e["length"] for e in closed)
        tasks = sorted(self._tasks, key=self._tasks.get)
        _atomic_write_parquet(_tasks_table(tasks), self.root / TASKS_PATH)
        parts = self._episode_stats[:n]
        stats = {f: pool_stats([p[f] for p in parts]) for f in parts[0]}
        atomic_write_text(self.root / STATS_PATH, _stats_to_json(stats))
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": n,
            "total_frames": frames,
            "total_tasks": len({t for e in closed for t in e["tasks"]}),
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{n}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": self._features(),
        }
        atomic_write_text(self.root / INFO_PATH, json.dumps(info, indent=4) + "\n")


# ----------------------------------------------------------------------------- reader
class LeRobotDataset:
    """Read a LeRobot v3.0 dataset (any writer's, as long as its videos are in mp4 files).

    The tabular data of every episode is loaded at construction; video frames are decoded
    per episode on request, seeking to the episode's span of its file, and the last
    ``cache_episodes`` decoded (episode, camera) pairs are kept.
    """

    def __init__(self, root: str | os.PathLike, cache_episodes: int = 8, require_stats: bool = True):
        self.root = Path(root).expanduser()
        self.cache_episodes = int(cache_episodes)
        self._cache: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()
        hint = _COLLECT_HINT.format(root=self.root)
        if not self.root.is_dir():
            raise DatasetError(f"no dataset at {self.root}: the directory does not exist. Collect one with: {hint}")
        info_path = self.root / INFO_PATH
        if not info_path.is_file():
            raise DatasetError(
                f"{self.root} is not a LeRobot v3 dataset: {INFO_PATH} is missing (an interrupted collection "
                f"writes it only once its first file is complete). Collect one with: {hint}"
            )
        try:
            self._info = json.loads(info_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatasetError(f"{info_path} is not valid JSON ({e}); re-collect the dataset with: {hint}") from e
        version = self._info.get("codebase_version")
        if version != CODEBASE_VERSION:
            raise DatasetError(
                f"{self.root}: unsupported codebase_version {version!r}; this reader supports {CODEBASE_VERSION!r} only "
                "(LeRobot converts v2.1 datasets with python -m lerobot.datasets.v30.convert_dataset_v21_to_v30)"
            )
        missing = [k for k in ("fps", "features", "data_path", "total_episodes", "total_frames") if k not in self._info]
        if missing:
            raise DatasetError(f"{info_path} lacks {missing}; re-collect the dataset with: {hint}")
        features = self._info["features"]
        images = [k for k, f in features.items() if f.get("dtype") == "image"]
        if images:
            raise DatasetError(f"{self.root}: image features stored in parquet ({images}) are not supported; only video features")
        self._cameras = tuple(
            k[len(IMAGE_PREFIX) :] for k, f in features.items() if k.startswith(IMAGE_PREFIX) and f.get("dtype") == "video"
        )
        for key in (STATE_KEY, ACTION_KEY):
            if key not in features:
                raise DatasetError(f"{self.root}: features lack {key!r} (have {sorted(features)})")

        tasks_path = self.root / TASKS_PATH
        if not tasks_path.is_file():
            raise DatasetError(f"{self.root}: {TASKS_PATH} is missing; re-collect the dataset with: {hint}")
        self._tasks = _read_tasks(tasks_path)
        self._load_episodes(hint)
        self._load_data(hint)
        self._check_videos(hint)
        self._stats: dict[str, dict[str, np.ndarray]] | None = None
        stats_path = self.root / STATS_PATH
        if stats_path.is_file():
            raw = json.loads(stats_path.read_text())
            self._stats = {f: {k: np.asarray(v) for k, v in st.items()} for f, st in raw.items()}
        elif require_stats:
            raise DatasetError(
                f"{self.root}: {STATS_PATH} is missing; recompute it with: python -m training.collect --stats-only {self.root}"
            )

    # -- loading -----------------------------------------------------------------------------
    def _load_episodes(self, hint: str) -> None:
        files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{self.root}: no episode metadata under meta/episodes/; re-collect the dataset with: {hint}")
        tables = [pq.read_table(f) for f in files]
        columns = set.intersection(*(set(t.column_names) for t in tables))
        needed = ["episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"]
        for cam in self._cameras:
            key = video_key(cam)
            needed += [f"videos/{key}/{n}" for n in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        lacking = [c for c in needed if c not in columns]
        if lacking:
            raise DatasetError(f"{self.root}: episode metadata lacks columns {lacking}; re-collect the dataset with: {hint}")
        meta: dict[str, np.ndarray] = {}
        for col in needed:
            meta[col] = np.concatenate([t.column(col).to_numpy() for t in tables])
        tasks: list[list[str]] = []
        for t in tables:
            tasks += t.column("tasks").to_pylist() if "tasks" in t.column_names else [[] for _ in range(t.num_rows)]
        order = np.argsort(meta["episode_index"], kind="stable")
        meta = {k: v[order] for k, v in meta.items()}
        self._episode_tasks = [tasks[i] for i in order]
        n = int(self._info["total_episodes"])
        if not np.array_equal(meta["episode_index"], np.arange(len(order))) or len(order) != n:
            raise DatasetError(
                f"{self.root}: episode metadata lists {len(order)} episodes, info.json {n} (indices must be 0..{n - 1}); "
                f"the dataset is inconsistent, re-collect it with: {hint}"
            )
        self._meta = meta

    def _data_path(self, chunk: int, file: int) -> Path:
        return self.root / self._info["data_path"].format(chunk_index=int(chunk), file_index=int(file))

    def _video_path(self, camera: str, ep: int) -> Path:
        key = video_key(camera)
        template = self._info.get("video_path") or VIDEO_PATH
        chunk = int(self._meta[f"videos/{key}/chunk_index"][ep])
        file = int(self._meta[f"videos/{key}/file_index"][ep])
        return self.root / template.format(video_key=key, chunk_index=chunk, file_index=file)

    def _load_data(self, hint: str) -> None:
        pairs = list(dict.fromkeys(zip(self._meta["data/chunk_index"].tolist(), self._meta["data/file_index"].tolist())))
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("state", "action", *INDEX_KEYS)}
        for chunk, file in pairs:
            path = self._data_path(chunk, file)
            if not path.is_file():
                eps = np.flatnonzero((self._meta["data/chunk_index"] == chunk) & (self._meta["data/file_index"] == file))
                raise DatasetError(
                    f"{self.root}: data file {path.relative_to(self.root)} is missing (episodes {_span(eps)} need it); "
                    f"the dataset is incomplete, re-collect it with: {hint}"
                )
            table = pq.read_table(path)
            parts["state"].append(_column_matrix(table, STATE_KEY))
            parts["action"].append(_column_matrix(table, ACTION_KEY))
            for key in INDEX_KEYS:
                parts[key].append(table.column(key).to_numpy())
        data = {k: np.concatenate(v) for k, v in parts.items()}
        order = np.argsort(data["index"], kind="stable")
        data = {k: v[order] for k, v in data.items()}
        total = int(self._info["total_frames"])
        if not np.array_equal(data["index"], np.arange(total)):
            raise DatasetError(
                f"{self.root}: data files hold {len(order)} frames with index not 0..{total - 1} as info.json says; "
                f"re-collect the dataset with: {hint}"
            )
        data["state"] = data["state"].astype(np.float32, copy=False)
        data["action"] = data["action"].astype(np.float32, copy=False)
        data["timestamp"] = data["timestamp"].astype(np.float32, copy=False)
        self._data = data

    def _check_videos(self, hint: str) -> None:
        for cam in self._cameras:
            seen: set[Path] = set()
            for ep in range(self.num_episodes):
                path = self._video_path(cam, ep)
                if path in seen:
                    continue
                if not path.is_file():
                    key = video_key(cam)
                    same = (self._meta[f"videos/{key}/chunk_index"] == self._meta[f"videos/{key}/chunk_index"][ep]) & (
                        self._meta[f"videos/{key}/file_index"] == self._meta[f"videos/{key}/file_index"][ep]
                    )
                    episodes = _span(np.flatnonzero(same))
                    raise DatasetError(
                        f"{self.root}: video file {path.relative_to(self.root)} is missing (episodes {episodes} need it); "
                        f"the dataset is incomplete, re-collect it with: {hint}"
                    )
                seen.add(path)

    # -- properties --------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        return self._info

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        if self._stats is None:
            raise DatasetError(
                f"{self.root}: {STATS_PATH} is missing; recompute it with: python -m training.collect --stats-only {self.root}"
            )
        return self._stats

    @property
    def stats_path(self) -> Path:
        return self.root / STATS_PATH

    @property
    def fps(self) -> float:
        return self._info["fps"]

    @property
    def cameras(self) -> tuple[str, ...]:
        return self._cameras

    @property
    def num_episodes(self) -> int:
        return len(self._meta["episode_index"])

    @property
    def num_frames(self) -> int:
        return len(self._data["index"])

    @property
    def episode_lengths(self) -> np.ndarray:
        return self._meta["length"].astype(np.int64)

    @property
    def episode_starts(self) -> np.ndarray:
        """Global index of every episode's first frame (``dataset_from_index``)."""
        return self._meta["dataset_from_index"].astype(np.int64)

    @property
    def tasks(self) -> list[str]:
        return list(self._tasks)

    def image_shape(self, camera: str) -> tuple[int, int, int]:
        """(H, W, 3) of a camera's stored frames."""
        self._check_camera(camera)
        shape = self._info["features"][video_key(camera)]["shape"]
        if shape[-1] != 3 and shape[0] == 3:  # (C, H, W) as some LeRobot writers store it
            shape = [*shape[1:], shape[0]]
        return tuple(int(s) for s in shape)

    # -- access ------------------------------------------------------------------------------
    def _check_episode(self, ep: int) -> int:
        ep = int(ep)
        if not 0 <= ep < self.num_episodes:
            raise IndexError(f"episode {ep} out of range: the dataset has {self.num_episodes} episodes")
        return ep

    def _check_camera(self, camera: str) -> None:
        if camera not in self._cameras:
            raise ValueError(f"camera {camera!r} is not in the dataset; it has {list(self._cameras)}")

    def episode_table(self, ep: int) -> dict[str, np.ndarray]:
        """state (T, S), action (T, A), task_index, frame_index, timestamp, index, episode_index."""
        ep = self._check_episode(ep)
        lo, hi = int(self._meta["dataset_from_index"][ep]), int(self._meta["dataset_to_index"][ep])
        return {k: v[lo:hi] for k, v in self._data.items()}

    def task_of(self, ep: int) -> str:
        ep = self._check_episode(ep)
        table = self.episode_table(ep)
        if len(table["task_index"]):
            return self._tasks[int(table["task_index"][0])]
        return self._episode_tasks[ep][0]

    def episode_frames(self, ep: int, camera: str) -> np.ndarray:
        """The episode's frames of one camera, uint8 (T, H, W, 3), read-only (cached); decodes only its span."""
        ep = self._check_episode(ep)
        self._check_camera(camera)
        key = (ep, camera)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        frames = self._decode(ep, camera)
        frames.setflags(write=False)
        if self.cache_episodes > 0:
            self._cache[key] = frames
            while len(self._cache) > self.cache_episodes:
                self._cache.popitem(last=False)
        return frames

    def _decode(self, ep: int, camera: str) -> np.ndarray:
        path = self._video_path(camera, ep)
        vkey = video_key(camera)
        fps = float(self.fps)
        start = int(round(float(self._meta[f"videos/{vkey}/from_timestamp"][ep]) * fps))
        length = int(self._meta["length"][ep])
        frames = _read_span(path, start, length, fps)
        if frames is None:  # seeking failed or came up short: decode the file from its start
            log.warning("seeking in %s failed; decoding the whole file for episode %d", path, ep)
            try:
                frames = read_mp4(path)[start : start + length]
            except (ValueError, FileNotFoundError) as e:
                raise DatasetError(f"{path}: {e}; re-collect the dataset with: {_COLLECT_HINT.format(root=self.root)}") from e
        if len(frames) != length:
            raise DatasetError(
                f"{path} holds {start + len(frames)} frames but episode {ep} needs frames {start}..{start + length - 1}; "
                f"the video is truncated, re-collect the dataset with: {_COLLECT_HINT.format(root=self.root)}"
            )
        return frames


def _read_span(path: Path, start: int, length: int, fps: float) -> np.ndarray | None:
    """Frames ``start .. start + length - 1`` of a video, seeking by time; None if that fails.

    The seek goes half a frame before the first wanted frame: ffmpeg then decodes from the
    preceding keyframe and drops every frame before that time, so rounding of the timestamp
    can neither skip the first frame nor include the one before it.
    """
    seek = max(0.0, (start - 0.5) / fps)
    params = ["-ss", f"{seek:.6f}"] if start > 0 else []
    try:
        reader = imageio.get_reader(path, format="FFMPEG", input_params=params)
    except Exception:  # imageio raises OSError/RuntimeError/ValueError depending on the file
        return None
    frames = []
    try:
        for _ in range(length):
            frames.append(np.asarray(reader.get_next_data(), dtype=np.uint8))
    except (IndexError, StopIteration):
        pass
    except Exception:
        return None
    finally:
        reader.close()
    if len(frames) != length:
        return None
    return np.stack(frames)


def _span(indices: np.ndarray) -> str:
    indices = [int(i) for i in indices]
    if not indices:
        return "none"
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"


# ----------------------------------------------------------------------------- recompute
def compute_stats(root: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """Recompute ``meta/stats.json`` from the data and video files; returns the statistics.

    Numeric features from the parquet files; images per channel from the decoded videos
    (each video file is read once, front to back).
    """
    ds = LeRobotDataset(root, cache_episodes=0, require_stats=False)
    parts = [_table_stats(ds.episode_table(ep)) for ep in range(ds.num_episodes)]
    stats = {f: pool_stats([p[f] for p in parts]) for f in parts[0]}
    for cam in ds.cameras:
        stats[video_key(cam)] = pool_stats(_video_file_stats(ds, cam))
    atomic_write_text(ds.root / STATS_PATH, _stats_to_json(stats))
    return stats


def _video_file_stats(ds: LeRobotDataset, camera: str) -> list[dict[str, np.ndarray]]:
    """Per-episode image statistics of one camera, reading each video file sequentially."""
    vkey = video_key(camera)
    by_file: dict[Path, list[tuple[int, int, int]]] = {}
    for ep in range(ds.num_episodes):
        start = int(round(float(ds._meta[f"videos/{vkey}/from_timestamp"][ep]) * float(ds.fps)))
        by_file.setdefault(ds._video_path(camera, ep), []).append((start, start + int(ds.episode_lengths[ep]), ep))
    results: dict[int, dict[str, np.ndarray]] = {}
    for path, spans in by_file.items():
        spans.sort()
        accumulators = {ep: ImageStats() for _, _, ep in spans}
        last = spans[-1][1]
        reader = imageio.get_reader(path, format="FFMPEG")
        try:
            k = 0
            for frame in reader.iter_data():
                if k >= last:
                    break
                for lo, hi, ep in spans:
                    if lo <= k < hi:
                        accumulators[ep].add(np.asarray(frame, dtype=np.uint8))
                k += 1
        finally:
            reader.close()
        for lo, hi, ep in spans:
            if accumulators[ep].count != hi - lo:
                raise DatasetError(
                    f"{path} ends before episode {ep}'s frames {lo}..{hi - 1}; the video is truncated, "
                    f"re-collect the dataset with: {_COLLECT_HINT.format(root=ds.root)}"
                )
            results[ep] = accumulators[ep].result()
    return [results[ep] for ep in range(ds.num_episodes)]
