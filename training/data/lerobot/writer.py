"""Write a LeRobot v3.0 dataset while collecting: :class:`DatasetWriter`.

Every file is written to a hidden temp file and renamed, so a crash leaves either the old
file or the new one. The writer closes a file once it reaches its size (or ``episodes_per_file``) and then
rewrites the metadata, ``info.json`` last: what ``info.json`` describes is always complete.
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
            self._prepare_root(overwrite)
        except BaseException:
            self._lock.close()
            raise

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
        self._streams: dict[str, Mp4Stream] = {}
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
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task must be a non-empty string (the instruction training conditions on), got {task!r}")
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
                self._streams[cam] = Mp4Stream(path, self.fps, self.video_gop)

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
        stats = table_stats(table)
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
        if self._file_full():
            self._close_file()
        return ep

    def _file_full(self) -> bool:
        """Close the open file (its parquet and every camera's mp4) once its data or a camera's video
        has reached its size, as LeRobot rotates files (or after ``episodes_per_file`` episodes). The
        data is counted as it sits in memory, uncompressed: the parquet file comes out smaller. A
        video counts once its episodes are encoded (one encode per file, video_gop=None: by data alone)."""
        if self.episodes_per_file is not None and len(self._file_episodes) >= self.episodes_per_file:
            return True
        data_mb = sum(v.nbytes for table in self._file_rows for v in table.values()) / 2**20
        video_mb = max((stream.encoded_bytes() for stream in self._streams.values()), default=0) / 2**20
        return data_mb >= self.data_files_size_in_mb or video_mb >= self.video_files_size_in_mb

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
        self._lock.close()
        return self.root

    def abort(self) -> None:
        """Stop without closing the open file: its temp videos are removed, its episodes lost."""
        for stream in self._streams.values():
            stream.abort()
        self._streams = {}
        self._file_rows, self._file_episodes = [], []
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
    def _prepare_root(self, overwrite: bool) -> None:
        """The project's one rule (``check_destination``): an empty or new root is written, anything else only
        with ``overwrite``, which replaces a dataset's own entries (a file or link at the root, or its meta/,
        data/ and videos/) and nothing else there."""
        check_destination(self.root, overwrite)
        if self.root.is_symlink() or (self.root.exists() and not self.root.is_dir()):
            self.root.unlink()
        for p in (self.root / d for d in ("meta", "data", "videos")):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
        self.root.mkdir(parents=True, exist_ok=True)

    def _empty_episode(self) -> dict[str, Any]:
        return {"frames": {c: [] for c in self.cameras}, "state": [], "action": [], "task": []}

    def _vector(self, value: Any, name: str) -> np.ndarray:
        v = np.asarray(value, dtype=np.float32)
        if v.ndim != 1 or not len(v):
            raise ValueError(f"{name} must be a 1-D vector, got shape {v.shape}")
        if not np.isfinite(v).all():  # refused here, where it enters, not later by every reader
            raise ValueError(f"{name} must be finite, got {v.tolist()} (frame {len(self._pending['state'])} of the "
                             f"episode); drop the episode with clear_episode()")
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
                LEROBOT_STATE: fixed_list(cat["state"]),
                LEROBOT_ACTION: fixed_list(cat["action"]),
                "timestamp": pa.array(cat["timestamp"], pa.float32()),
                "frame_index": pa.array(cat["frame_index"], pa.int64()),
                "episode_index": pa.array(cat["episode_index"], pa.int64()),
                "index": pa.array(cat["index"], pa.int64()),
                "task_index": pa.array(cat["task_index"], pa.int64()),
            }
        )
        write_parquet(data, self.root / DATA_PATH.format(chunk_index=chunk, file_index=file))
        write_parquet(self._episodes_table(), self.root / EPISODES_PATH.format(chunk_index=chunk, file_index=file))
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
                    provenance.ORIENTATION_KEY: self.orientations[cam],
                },
            }
        s, a = self._state_dim, self._action_dim
        state_names = self.state_names or [f"state_{i}" for i in range(s)]
        action_names = self.action_names or [f"action_{i}" for i in range(a)]
        features[LEROBOT_STATE] = {"dtype": "float32", "shape": [s], "names": state_names}
        features[LEROBOT_ACTION] = {"dtype": "float32", "shape": [a], "names": action_names}
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
        write_parquet(tasks_table(tasks), self.root / TASKS_PATH)
        parts = self._episode_stats[:n]
        stats = {f: pool_stats([p[f] for p in parts]) for f in parts[0]}
        atomic_write_text(self.root / STATS_PATH, stats_to_json(stats))
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": n,
            "total_frames": frames,
            "total_tasks": len({t for e in closed for t in e["tasks"]}),
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": self.data_files_size_in_mb,
            "video_files_size_in_mb": self.video_files_size_in_mb,
            "fps": self.fps,
            "splits": {"train": f"0:{n}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": self._features(),
            **provenance.suites_entry(self.suites),
        }
        atomic_write_text(self.root / INFO_PATH, json.dumps(info, indent=4) + "\n")
