"""The index of a LeRobot v3.0 dataset: its episodes (meta/episodes) and every frame's row (data files),
loaded and checked at once, with the lookups from an episode to its rows and video spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot import schema, validate
from training.data.lerobot.layout import INDEX_KEYS, INFO_PATH, REPAIR_HINT, TASKS_PATH, TIMESTAMP_TOLERANCE_S, DatasetError
from training.data.lerobot.tables import column_matrix, read_table


class EpisodeIndex:
    """Every episode's metadata row (``meta``, ordered by episode) and every frame's row (``data``, ordered by
    global index: state, action, the index columns and image cameras' encoded frames as ``image:<camera>``)."""

    def __init__(self, root: Path, info: dict[str, Any], keys: dict[str, str], videos: tuple[str, ...],
                 tasks: list[str], fix: str, hint: str):
        """``keys``: camera -> its feature; ``videos``: the cameras in mp4 files; ``fix``/``hint``: how the
        errors say to repair the dataset."""
        self.root, self.info, self.keys, self.videos, self.tasks = root, info, keys, videos, tasks
        self._fix = fix
        self._load_episodes(hint)
        self._load_data(hint)

    def _load_episodes(self, hint: str) -> None:
        files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{self.root}: no episode metadata under meta/episodes/; re-collect the dataset with: {hint}")
        tables = [read_table(validate.inside(self.root, f), self._fix) for f in files]
        columns = set.intersection(*(set(t.column_names) for t in tables))
        needed = ["episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"]
        types = {c: schema.INTEGER for c in needed}
        for cam in self.videos:
            key = self.keys[cam]
            needed += [f"videos/{key}/{n}" for n in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
            types |= {f"videos/{key}/{n}": schema.INTEGER for n in ("chunk_index", "file_index")}
            types |= {f"videos/{key}/{n}": schema.NUMBER for n in ("from_timestamp", "to_timestamp")}
        lacking = [c for c in needed if c not in columns]
        if lacking:
            raise DatasetError(f"{self.root}: episode metadata lacks columns {lacking}; re-collect the dataset with: {hint}")
        for path, table in zip(files, tables):
            schema.check_columns(table, {**types, "tasks": schema.STRING_LISTS}, path, self._fix)
        meta: dict[str, np.ndarray] = {}
        for col in needed:
            meta[col] = np.concatenate([t.column(col).to_numpy() for t in tables])
        tasks: list[list[str]] = []
        for t in tables:
            tasks += t.column("tasks").to_pylist() if "tasks" in t.column_names else [[] for _ in range(t.num_rows)]
        order = np.argsort(meta["episode_index"], kind="stable")
        meta = {k: v[order] for k, v in meta.items()}
        self.episode_tasks = [tasks[i] for i in order]
        n = int(self.info["total_episodes"])
        if not np.array_equal(meta["episode_index"], np.arange(len(order))) or len(order) != n:
            raise DatasetError(
                f"{self.root}: episode metadata lists {len(order)} episodes, info.json {n} (indices must be 0..{n - 1}); "
                f"the dataset is inconsistent, re-collect it with: {hint}"
            )
        self.meta = meta

    def _data_path(self, chunk: int, file: int) -> Path:
        return validate.path_in(self.root, self.info["data_path"], "data_path", chunk_index=int(chunk),
                                file_index=int(file))

    def _load_data(self, hint: str) -> None:
        pairs = list(dict.fromkeys(zip(self.meta["data/chunk_index"].tolist(), self.meta["data/file_index"].tolist())))
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("state", "action", *INDEX_KEYS)}
        for chunk, file in pairs:
            path = self._data_path(chunk, file)
            if not path.is_file():
                eps = np.flatnonzero((self.meta["data/chunk_index"] == chunk) & (self.meta["data/file_index"] == file))
                raise DatasetError(
                    f"{self.root}: data file {path.relative_to(self.root)} is missing (episodes {span_of(eps)} need it); "
                    f"the dataset is incomplete, re-collect it with: {hint}"
                )
            table = read_table(path, self._fix)
            lacking = [k for k in (LEROBOT_STATE, LEROBOT_ACTION, *INDEX_KEYS) if k not in table.column_names]
            if lacking:
                raise DatasetError(f"{path}: lacks the columns {lacking} (has {table.column_names}); {self._fix}")
            schema.check_columns(table, {**dict.fromkeys(INDEX_KEYS, schema.INTEGER), "timestamp": schema.NUMBER}, path,
                                 self._fix)
            parts["state"].append(column_matrix(table, LEROBOT_STATE, path))
            parts["action"].append(column_matrix(table, LEROBOT_ACTION, path))
            for key in INDEX_KEYS:
                parts[key].append(table.column(key).to_numpy())
            for cam, key in self.keys.items():
                if cam not in self.videos:
                    parts.setdefault(f"image:{cam}", []).append(image_bytes(table, key, path))
        data = {k: np.concatenate(v) for k, v in parts.items()}
        order = np.argsort(data["index"], kind="stable")
        data = {k: v[order] for k, v in data.items()}
        total = int(self.info["total_frames"])
        if not np.array_equal(data["index"], np.arange(total)):
            raise DatasetError(
                f"{self.root}: data files hold {len(order)} frames with index not 0..{total - 1} as info.json says; "
                f"re-collect the dataset with: {hint}"
            )
        data["state"] = data["state"].astype(np.float32, copy=False)
        data["action"] = data["action"].astype(np.float32, copy=False)
        self.data = data
        validate.episode_spans(self.meta, self.data, self.root)
        self._check_rows()

    def _check_rows(self) -> None:
        """What training trusts of every row: finite state and action, a task the tasks table lists."""
        data = self.data

        def frame(row: int) -> str:
            return f"episode {int(data['episode_index'][row])} frame {int(data['frame_index'][row])}"

        validate.finite_rows(data["state"], LEROBOT_STATE, str(self.root), frame)
        validate.finite_rows(data["action"], LEROBOT_ACTION, str(self.root), frame)
        unknown = np.flatnonzero((data["task_index"] < 0) | (data["task_index"] >= len(self.tasks)))
        if len(unknown):
            i = int(unknown[0])
            raise DatasetError(f"{self.root}: {frame(i)} has task_index {int(data['task_index'][i])}, which "
                               f"{TASKS_PATH} does not list (it has {len(self.tasks)} tasks); {validate.FIX_AT_SOURCE}")

    def check_timestamps(self, fps: float, fix: str) -> None:
        """Each frame's ``timestamp`` is ``frame_index / fps`` (LeRobot's rule), to a quarter frame."""
        ts, fi = self.data["timestamp"].astype(np.float64), self.data["frame_index"].astype(np.float64)
        bad = np.flatnonzero(np.abs(ts - fi / fps) > 0.25 / fps)
        if len(bad):
            i = int(bad[0])
            ep = int(self.data["episode_index"][i])
            rate = _rate(self.episode_table(ep)["timestamp"])
            raise DatasetError(f"{self.root}: episode {ep} frame {int(fi[i])} has timestamp {ts[i]:.4f} s but "
                               f"frame_index / fps = {fi[i] / fps:.4f} s with fps={self.info['fps']} from {INFO_PATH}"
                               f"{f' (its timestamps step at {rate:g} fps)' if rate else ''}; {fix}")

    def check_video_spans(self, fps: float, fix: str, snap_starts: bool) -> None:
        """An episode's span of its video file starts on a frame's time (unless ``snap_starts``) and lasts
        ``length / fps``, to half a frame."""
        lengths = self.meta["length"].astype(np.float64)
        stated = self.info["fps"]  # as info.json has it (20, where fps is 20.0)
        for cam in self.videos:
            key = f"videos/{self.keys[cam]}"
            span = self.meta[f"{key}/to_timestamp"].astype(np.float64) - self.meta[f"{key}/from_timestamp"]
            bad = np.flatnonzero(np.abs(span - lengths / fps) > 0.5 / fps)
            starts = self.meta[f"{key}/from_timestamp"].astype(np.float64)
            off = np.flatnonzero(np.abs(starts - np.round(starts * fps) / fps) > TIMESTAMP_TOLERANCE_S)
            if len(off) and not snap_starts:
                ep = int(off[0])
                raise DatasetError(f"{self.root}: episode {ep}'s {key}/from_timestamp {starts[ep]:.6f} s is not a "
                                   f"frame's time (a multiple of 1/fps={1 / fps:.6f} s, within {TIMESTAMP_TOLERANCE_S} s) "
                                   f"in meta/episodes; repair the dataset with: {REPAIR_HINT.format(root=self.root)}")
            if len(bad):
                ep = int(bad[0])
                raise DatasetError(f"{self.root}: episode {ep} has {int(lengths[ep])} frames but its {key} span "
                                   f"(to_timestamp - from_timestamp in meta/episodes) lasts {span[ep]:.4f} s, not "
                                   f"{lengths[ep] / fps:.4f} s at fps={stated} ({int(lengths[ep]) / span[ep]:g} fps); {fix}")

    # -- lookups -----------------------------------------------------------------------------
    @property
    def num_episodes(self) -> int:
        return len(self.meta["episode_index"])

    @property
    def num_frames(self) -> int:
        return len(self.data["index"])

    def check_episode(self, ep: int) -> int:
        ep = int(ep)
        if not 0 <= ep < self.num_episodes:
            raise IndexError(f"episode {ep} out of range: the dataset has {self.num_episodes} episodes")
        return ep

    def episode_table(self, ep: int) -> dict[str, np.ndarray]:
        """state (T, S), action (T, A), task_index, frame_index, timestamp, index, episode_index."""
        ep = self.check_episode(ep)
        lo, hi = int(self.meta["dataset_from_index"][ep]), int(self.meta["dataset_to_index"][ep])
        return {k: v[lo:hi] for k, v in self.data.items()}

    def task_of(self, ep: int) -> str:
        ep = self.check_episode(ep)
        table = self.episode_table(ep)
        if len(table["task_index"]):
            return self.tasks[int(table["task_index"][0])]
        return self.episode_tasks[ep][0]

    def video_file(self, camera: str, ep: int) -> tuple[str, int, int]:
        """(feature, chunk, file) of the mp4 holding the episode's frames of a video camera."""
        key = self.keys[camera]
        return key, int(self.meta[f"videos/{key}/chunk_index"][ep]), int(self.meta[f"videos/{key}/file_index"][ep])

    def video_start(self, ep: int, camera: str) -> float:
        """The episode's ``from_timestamp`` in its video file, in seconds, as meta/episodes records it."""
        return float(self.meta[f"videos/{self.keys[camera]}/from_timestamp"][ep])


def image_bytes(table, key: str, where: str | Path) -> np.ndarray:
    """An image feature's encoded frames (PNG/JPEG bytes), one per row: LeRobot (Hugging Face
    ``datasets``' Image) stores each as a struct of ``bytes`` and ``path``."""
    if key not in table.column_names:
        raise DatasetError(f"{where}: lacks the image column {key!r} that info.json's features list")
    column = table.column(key).combine_chunks()
    if pa.types.is_struct(column.type) and column.type.get_field_index("bytes") >= 0:
        column = column.field("bytes")
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise DatasetError(f"{where}: the image column {key!r} holds {column.type}, not encoded images (bytes, or "
                           f"Hugging Face's struct of bytes and path); {validate.FIX_AT_SOURCE}")
    return np.array(column.to_pylist(), dtype=object)


def _rate(timestamps: np.ndarray) -> float | None:
    """The frame rate an episode's timestamps step at (None for a single frame)."""
    steps = np.diff(timestamps.astype(np.float64))
    return float(1.0 / np.median(steps)) if len(steps) and np.median(steps) > 0 else None


def span_of(indices: np.ndarray) -> str:
    """Episodes as an error names them: ``3``, ``2-5`` or ``none``."""
    indices = [int(i) for i in indices]
    if not indices:
        return "none"
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"
