"""Convert a LeRobot v2.1 dataset to v3.0, or lay out a v3.0 one again, validating as it goes.

v2.1 (much public robot data): one parquet and one mp4 per camera per episode
(``data/chunk-XXX/episode_XXXXXX.parquet``, ``videos/chunk-XXX/<key>/episode_XXXXXX.mp4``),
``meta/episodes.jsonl``, ``meta/tasks.jsonl``, ``meta/episodes_stats.jsonl``. Each episode is
checked before it is written: its data file, the state and action columns with info.json's shapes,
finite values and statistics, timestamps within LeRobot's tolerance of ``frame_index / fps``, and
every frame of every camera decoded (mp4s, or images in the data files) and counted.

Videos are decoded front to back, never by seeking, and each frame is taken by its place in the
file: a source whose video timeline drifts from ``frame / fps`` (which makes a reader that seeks
by time return neighbouring frames) comes out exact, with no frame shifted, and the summary's
``timeline`` says which files drifted and by how much. This is how a drifting dataset is repaired. The first
problem is one :class:`DatasetError` naming the episode and the field, and nothing is left at the
destination: the new dataset is written into a hidden staging directory next to it and renamed
into place only when complete. Features other than the cameras, state, action and the indices
are not carried over (the result lists them).

Frames keep their pixels and the source's orientation is recorded (``provenance``), which the
reader turns upright: ``frames`` states it (``--frames``; LIBERO datasets made by openpi's and
LeRobot's converters are ``mirrored``), or the source records it; a source that does neither is
refused before anything is written. The suites a source of ours records are carried over.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from envs.orientation import check_orientation
from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot import provenance, schema, validate
from training.data.lerobot.layout import INDEX_KEYS, INFO_PATH, TIMESTAMP_TOLERANCE_S, DatasetError, camera_of
from training.data.lerobot.reader import LeRobotDataset, decode_image, image_bytes
from training.data.lerobot.tables import column_matrix, read_table
from training.data.lerobot.video import decode_timed, off_grid, time_errors
from training.data.lerobot.writer import DatasetWriter
from wam_gym.utils.publish import atomic_dir, check_destination

Episode = tuple[np.ndarray, np.ndarray, list[str], dict[str, np.ndarray]]  # state, action, task per frame, frames


def convert(src: str | os.PathLike, dst: str | os.PathLike, orientation: str | None = None, overwrite: bool = False,
            **layout: Any) -> dict:
    """Write ``src`` (v2.1, or v3.0 to lay it out again) as a v3.0 dataset at ``dst``; returns a summary.
    ``orientation``: how the source's frames are turned (an ``envs.orientation`` name; ``--frames``), needed
    when it does not say. ``overwrite``: replace what ``dst`` holds (``--overwrite``; it is replaced only once the
    new dataset is complete, so ``dst`` may be ``src`` itself). ``layout``: DatasetWriter's file knobs
    (``data_files_size_in_mb``, ``video_files_size_in_mb``, ``episodes_per_file``, ``video_gop``)."""
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    check_destination(dst, overwrite)
    if dst.resolve() != src.resolve() and (dst.resolve() in src.resolve().parents or src.resolve() in dst.resolve().parents):
        raise DatasetError(f"{dst} and {src} lie one inside the other: convert into a directory beside the source "
                           f"(such as {src}-v30)")
    info = _info(src)
    source = _V30(src) if info.get("codebase_version") == "v3.0" else _V21(src, info)
    orientations = _orientations(src, info, source.keys, orientation)
    with atomic_dir(dst) as staging:
        writer = DatasetWriter(staging, info["fps"], source.cameras, robot_type=info.get("robot_type") or "unknown",
                               state_names=_names(info, LEROBOT_STATE), action_names=_names(info, LEROBOT_ACTION),
                               orientations=orientations, suites=provenance.recorded_suites(info), **layout)
        count = 0  # frames
        for state, action, tasks, images in source.episodes():
            for t in range(len(state)):
                writer.add_frame({c: images[c][t] for c in source.cameras}, state[t], action[t], tasks[t])
            writer.save_episode()
            count += len(state)
        writer.finalize()
    return {"source": str(src), "version": info.get("codebase_version"), "destination": str(dst),
            "episodes": source.num_episodes, "frames": count, "cameras": list(source.cameras),
            "orientations": orientations, "dropped_features": source.dropped, "timeline": source.timeline.summary()}


def _orientations(src: Path, info: dict[str, Any], keys: dict[str, str], stated: str | None) -> dict[str, str]:
    """Camera -> how the source's frames are turned: ``stated`` (the user's word) where the source says nothing
    or the same; refused where neither says, or they disagree."""
    recorded = provenance.recorded_orientations(info, keys, src)
    if stated is None:
        unknown = [c for c, orientation in recorded.items() if orientation is None]
        if unknown:
            raise provenance.unknown_orientation(src, keys[unknown[0]], "state how they are with")
        return {c: str(orientation) for c, orientation in recorded.items()}
    check_orientation(stated, "--frames")
    other = {c: orientation for c, orientation in recorded.items() if orientation not in (None, stated)}
    if other:
        raise DatasetError(f"{src}: --frames {stated} but its meta/info.json records {other}: drop --frames to keep "
                           "what the dataset says, or correct its record")
    return dict.fromkeys(keys, stated)


def _info(src: Path) -> dict[str, Any]:
    path = validate.inside(src, src / INFO_PATH) if src.is_dir() else src / INFO_PATH
    if not path.is_file():
        raise DatasetError(f"{src} is not a LeRobot dataset: {INFO_PATH} is missing")
    fix = "correct it, or make the dataset again"
    info = schema.load_info(path, ("codebase_version",), fix)
    version = info["codebase_version"]
    if version not in ("v2.0", "v2.1", "v3.0"):
        raise DatasetError(f"{src}: codebase_version {version!r}; this converts v2.0/v2.1 (and lays out v3.0) datasets")
    needed = ["fps", "features", "total_episodes", "data_path"]
    if version != "v3.0" and any(f["dtype"] == "video" for f in info.get("features", {}).values()):
        needed.append("video_path")  # a v2.x dataset's videos are found by it alone
    missing = [k for k in needed if info.get(k) is None]
    if missing:
        raise DatasetError(f"{path} lacks {missing}; {fix}")
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


class Timeline:
    """What a conversion found of its source's video timelines: the files whose frames were not at
    ``frame / fps`` (they are written exact; no frame moves, since frames are taken in decoding order)."""

    def __init__(self, root: Path, fps: float):
        self.root, self.fps = root, float(fps)
        self.drifted: dict[str, dict[str, Any]] = {}  # file -> frames off, the largest drift, the episodes
        self.snapped: list[int] = []  # episodes (any camera) whose start, off the frame grid, was taken at its frame

    def add(self, path: Path, times: np.ndarray, first: int, ep: int) -> None:
        """``times`` of frames ``first..`` of ``path``, which episode ``ep`` holds."""
        bad = off_grid(times, self.fps, first)
        if not len(bad):
            return
        drift = float(np.abs(time_errors(times, self.fps, first)).max()) * 1e3
        entry = self.drifted.setdefault(str(path.relative_to(self.root)), {"frames": 0, "max_drift_ms": 0.0, "episodes": []})
        entry["frames"] += len(bad)
        entry["max_drift_ms"] = round(max(entry["max_drift_ms"], drift), 3)
        entry["episodes"].append(ep)

    def summary(self) -> dict[str, Any]:
        snapped = sorted(set(self.snapped))
        starts = {"starts": f"episodes {', '.join(map(str, snapped))} started off the frame grid in meta/episodes; each "
                            "now starts on its first frame, which the file's timestamps placed within half a frame"}
        if not self.drifted:
            return {"changed": "nothing: every source frame was at frame / fps", **(starts if snapped else {})}
        frames = sum(e["frames"] for e in self.drifted.values())
        return {"changed": f"{frames} frames in {len(self.drifted)} video file(s) were off frame / fps by more than "
                           f"{TIMESTAMP_TOLERANCE_S:g} s; each is now at exactly frame / fps (no frame moved)",
                **(starts if snapped else {}),
                "files": {f: {**e, "episodes": _span(e["episodes"])} for f, e in self.drifted.items()}}


class _InOrder:
    """One camera's episodes of a v3.0 dataset, decoded front to back through its files (a file is
    opened again only when an episode lies before the last one read from it)."""

    def __init__(self, ds: LeRobotDataset, camera: str, timeline: Timeline):
        self.ds, self.camera, self.timeline = ds, camera, timeline
        self.path: Path | None = None
        self.position = 0  # frames of self.path decoded so far
        self._stack = ExitStack()
        self._frames: Iterator[tuple[float, np.ndarray]] = iter(())

    def episode(self, ep: int) -> np.ndarray:
        path, start, length = self.ds.video_span(ep, self.camera)
        if path != self.path or start < self.position:
            self.close()
            self._frames = self._stack.enter_context(decode_timed(path))
            self.path, self.position = path, 0
        try:
            taken = list(itertools.islice(self._frames, start - self.position, start + length - self.position))
        except ValueError as exc:  # a frame that does not decode
            raise DatasetError(f"{exc} (episode {ep}, {self.ds.feature_key(self.camera)}); {validate.FIX_AT_SOURCE}") from None
        self.position = start + length
        if len(taken) < length:
            raise DatasetError(f"{path} ends before episode {ep}'s frames {start}..{start + length - 1} "
                               f"({self.ds.feature_key(self.camera)}); the video is truncated")
        self._confirm_start(path, ep, start, taken[0][0])
        self.timeline.add(path, np.array([t for t, _ in taken]), start, ep)
        return np.stack([frame for _, frame in taken])

    def _confirm_start(self, path: Path, ep: int, start: int, found: float) -> None:
        """An episode whose recorded start is off the frame grid (LeRobot's aggregate_datasets of drifted datasets)
        begins at the grid's nearest frame only if the file has that frame within half a frame of the start."""
        recorded, fps = self.ds.video_start(ep, self.camera), self.timeline.fps
        if abs(recorded - start / fps) <= TIMESTAMP_TOLERANCE_S:
            return
        if abs(found - recorded) > 0.5 / fps:
            raise DatasetError(
                f"{path}: episode {ep}'s from_timestamp {recorded:.6f} s in meta/episodes is off the frame grid, and the "
                f"file's frame nearest it on the grid (frame {start}, {start / fps:.6f} s) is at {found:.6f} s, "
                f"{abs(found - recorded) * 1e3:.1f} ms from it, more than half a frame ({500 / fps:.1f} ms): which frame "
                "begins the episode cannot be told, so it cannot be repaired here; make the dataset again from its "
                "sources (before they were joined)")
        self.timeline.snapped.append(ep)

    def close(self) -> None:
        self._stack.close()


class _V30:
    """A v3.0 dataset, read (and validated) by LeRobotDataset, episode by episode."""

    def __init__(self, root: Path):
        self.ds = LeRobotDataset(root, cache_episodes=0, snap_starts=True)  # starts off the grid: _InOrder confirms
        self.cameras, self.num_episodes = self.ds.cameras, self.ds.num_episodes
        self.keys = {c: self.ds.feature_key(c) for c in self.cameras}
        self.dropped: list[str] = []
        self.timeline = Timeline(root, self.ds.fps)

    def episodes(self) -> Iterator[Episode]:
        readers = {c: _InOrder(self.ds, c, self.timeline) for c in self.ds.video_cameras}
        try:
            for ep in range(self.num_episodes):
                table = self.ds.episode_table(ep)
                tasks = [self.ds.tasks[int(i)] for i in table["task_index"]]
                frames = {c: readers[c].episode(ep) if c in readers else self.ds.stored_frames(ep, c) for c in self.cameras}
                yield table["state"], table["action"], tasks, frames
        finally:
            for reader in readers.values():
                reader.close()


class _V21:
    """A v2.x dataset: per-episode files, checked one episode at a time."""

    def __init__(self, root: Path, info: dict[str, Any]):
        self.root, self.info, self.fps = root, info, float(info["fps"])
        features = info["features"]
        self.keys = {camera_of(k): k for k, f in features.items() if camera_of(k) and f.get("dtype") in ("video", "image")}
        self.cameras = tuple(self.keys)
        kept = {LEROBOT_STATE, LEROBOT_ACTION, *INDEX_KEYS, *self.keys.values()}
        self.dropped = sorted(k for k in features if k not in kept)
        self.tasks = {r["task_index"]: r.get("task") for r in self._jsonl("meta/tasks.jsonl", {"task_index": schema.COUNT})}
        validate.tasks_named([self.tasks[i] for i in sorted(self.tasks)], f"{root}/meta/tasks.jsonl")
        self._check_rates(features)
        episodes = self._jsonl("meta/episodes.jsonl", {"episode_index": schema.COUNT, "length": schema.COUNT})
        self.lengths = {r["episode_index"]: r["length"] for r in episodes}
        stats = self._jsonl("meta/episodes_stats.jsonl", {"episode_index": schema.COUNT, "stats": schema.MAPPING}, False)
        self.stats = {r["episode_index"]: r["stats"] for r in stats}
        self.num_episodes = int(info["total_episodes"])
        self.timeline = Timeline(root, self.fps)
        if sorted(self.lengths) != list(range(self.num_episodes)):
            raise DatasetError(f"{root}: meta/episodes.jsonl lists episodes {_span(sorted(self.lengths))}, info.json "
                               f"total_episodes={self.num_episodes}")

    def _jsonl(self, name: str, fields: dict[str, schema.Rule], required: bool = True) -> list[dict[str, Any]]:
        """The rows of a JSON lines file, each an object with ``fields`` of their types."""
        path = validate.inside(self.root, self.root / name)
        if not path.is_file():
            if required:
                raise DatasetError(f"{self.root}: {name} is missing (a v2.1 dataset has it)")
            return []
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (ValueError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{path}: not JSON lines ({exc})") from None
        schema.check_rows(rows, fields, path, "correct it, or make the dataset again")
        return rows

    def _check_rates(self, features: dict[str, Any]) -> None:
        """Each video feature's ``video.fps`` is the dataset's ``fps``: frames are placed by it."""
        for key in self.keys.values():
            declared = (features[key].get("info") or {}).get("video.fps")
            if declared is not None and abs(float(declared) - self.fps) > 1e-3 * self.fps:
                raise DatasetError(f"{self.root}: meta/info.json has fps={self.info['fps']} but features['{key}'].info"
                                   f"['video.fps']={declared}; set both to the rate the data was recorded at")

    def _path(self, template_key: str, ep: int, **extra: str) -> Path:
        chunk = ep // self.info.get("chunks_size", 1000)
        return validate.path_in(self.root, self.info[template_key], template_key, episode_chunk=chunk,
                                episode_index=ep, **extra)

    def episodes(self) -> Iterator[Episode]:
        for ep in range(self.num_episodes):
            yield self._episode(ep)

    def _episode(self, ep: int) -> Episode:
        path = self._path("data_path", ep)
        if not path.is_file():
            raise DatasetError(f"episode {ep}: its data file {path.relative_to(self.root)} is missing")
        table = read_table(path, validate.FIX_AT_SOURCE)
        schema.check_columns(table, {"task_index": schema.INTEGER, "frame_index": schema.INTEGER,
                                     "timestamp": schema.NUMBER}, path, validate.FIX_AT_SOURCE)
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
        values = column_matrix(table, key, f"episode {ep}: {self._path('data_path', ep)}")
        expected = int(np.prod(self.info["features"][key].get("shape") or [values.shape[1]]))
        if values.shape[1] != expected:
            raise DatasetError(f"episode {ep}: {key} has {values.shape[1]} values a frame, info.json's shape says {expected}")
        validate.finite_rows(values, key, str(self.root), lambda row: f"episode {ep} frame {row}")
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
        where = self.root / "meta/episodes_stats.jsonl"
        for feature, stats in self.stats.get(ep, {}).items():
            if not isinstance(stats, dict):
                raise DatasetError(f"{where}: episode {ep}'s stats of {feature} are not an object of statistics; "
                                   f"{validate.FIX_AT_SOURCE}")
            for name, value in stats.items():
                if not np.isfinite(schema.numbers(value, where, f"episode {ep}'s {feature} {name}",
                                                  validate.FIX_AT_SOURCE)).all():
                    raise DatasetError(f"episode {ep}: meta/episodes_stats.jsonl {feature} {name} is not finite")

    def _frames(self, table, camera: str, ep: int, length: int) -> np.ndarray:
        key = self.keys[camera]
        path, times = None, []
        if self.info["features"][key]["dtype"] == "image":
            frames = [decode_image(data, f"episode {ep} {key} frame {i}")
                      for i, data in enumerate(image_bytes(table, key, f"episode {ep}'s data file"))]
        else:
            path = self._path("video_path", ep, video_key=key)
            if not path.is_file():
                raise DatasetError(f"episode {ep}: {key}'s video {path.relative_to(self.root)} is missing")
            try:
                with decode_timed(path) as decoded:
                    timed = list(decoded)
            except ValueError as exc:
                raise DatasetError(f"episode {ep}: {key}'s video {path.relative_to(self.root)} does not decode ({exc})") from None
            times, frames = [t for t, _ in timed], [frame for _, frame in timed]
        if len(frames) != length:  # more frames than rows: which ones are the episode's is anyone's guess
            raise DatasetError(f"episode {ep}: {key} has {len(frames)} frames, the episode {length} (its data file's rows "
                               f"and meta/episodes.jsonl); {validate.FIX_AT_SOURCE}")
        if path is not None:
            self.timeline.add(path, np.array(times), 0, ep)
        return np.stack(frames)


def _span(indices: list[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if indices else "none"
