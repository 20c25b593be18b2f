"""Read a LeRobot v3.0 dataset for training: :class:`LeRobotDataset`."""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from envs.orientation import to_upright
from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot import provenance, schema, validate, video
from training.data.lerobot.layout import (
    CODEBASE_VERSION,
    COLLECT_HINT,
    INDEX_KEYS,
    INFO_PATH,
    REPAIR_HINT,
    STATS_PATH,
    TASKS_PATH,
    TIMESTAMP_TOLERANCE_S,
    VIDEO_PATH,
    DatasetError,
    camera_of,
)
from training.data.lerobot.tables import column_matrix, read_table, read_tasks


class LeRobotDataset:
    """Read a LeRobot v3.0 dataset (any writer's, as long as its videos are in mp4 files).

    The tabular data of every episode is loaded at construction; video frames are decoded
    per episode on request, seeking to the episode's span of its file, turned upright from the
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
        self._cache: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()
        self._video_files: dict[tuple[str, int, int], Path] = {}  # (feature, chunk, file) -> its path, inside root
        hint = COLLECT_HINT.format(root=self.root)
        self._fix = f"re-collect the dataset with: {hint}"
        if not self.root.is_dir():
            raise DatasetError(f"no dataset at {self.root}: the directory does not exist. Collect one with: {hint}")
        info_path = validate.inside(self.root, self.root / INFO_PATH)
        if not info_path.is_file():
            raise DatasetError(
                f"{self.root} is not a LeRobot v3 dataset: {INFO_PATH} is missing (an interrupted collection "
                f"writes it only once its first file is complete). Collect one with: {hint}"
            )
        self._info = schema.load_info(info_path, (), self._fix)
        version = self._info.get("codebase_version")
        if version != CODEBASE_VERSION:
            raise DatasetError(
                f"{self.root}: unsupported codebase_version {version!r}; this reader supports {CODEBASE_VERSION!r} only "
                f"(convert a v2.1 dataset with: python -m training.datasets convert {self.root} {self.root}-v30)"
            )
        missing = [k for k in ("fps", "features", "data_path", "total_episodes", "total_frames") if k not in self._info]
        if missing:
            raise DatasetError(f"{info_path} lacks {missing}; {self._fix}")
        features = self._info["features"]
        # camera -> its feature: observation.images.<camera> in mp4s ("video") or in the data files ("image",
        # encoded PNG/JPEG bytes), or a lone camera under observation.image (pusht-style), named "image".
        self._keys = {camera_of(k): k for k, f in features.items() if camera_of(k) and f["dtype"] in ("video", "image")}
        self._cameras = tuple(self._keys)
        self._videos = tuple(c for c in self._cameras if features[self._keys[c]]["dtype"] == "video")
        self._orientations = provenance.recorded_orientations(self._info, self._keys, self.root)
        for key in (LEROBOT_STATE, LEROBOT_ACTION):
            if key not in features:
                raise DatasetError(f"{self.root}: features lack {key!r} (have {sorted(features)})")
        for key in self._keys.values():
            shape = features[key].get("shape")
            if not (isinstance(shape, list) and len(shape) == 3 and 3 in (shape[0], shape[-1])):
                raise DatasetError(f"{info_path}: features[{key!r}].shape is {shape}, not an image's [height, width, 3] "
                                   f"(or [3, height, width]); {self._fix}")

        tasks_path = validate.inside(self.root, self.root / TASKS_PATH)
        if not tasks_path.is_file():
            raise DatasetError(f"{self.root}: {TASKS_PATH} is missing; {self._fix}")
        self._tasks = read_tasks(tasks_path, self._fix)
        validate.tasks_named(self._tasks, str(tasks_path))
        self._load_episodes(hint)
        self._load_data(hint)
        self._check_videos(hint)
        self._check_timing(hint)
        self._stats: dict[str, dict[str, np.ndarray]] | None = None
        stats_path = validate.inside(self.root, self.root / STATS_PATH)
        stats_fix = f"recompute it with: python -m training.collect --stats-only {self.root}"
        if stats_path.is_file():
            self._stats = schema.load_stats(stats_path, stats_fix)
        elif require_stats:
            raise DatasetError(f"{self.root}: {STATS_PATH} is missing; {stats_fix}")

    # -- loading -----------------------------------------------------------------------------
    def _load_episodes(self, hint: str) -> None:
        files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{self.root}: no episode metadata under meta/episodes/; re-collect the dataset with: {hint}")
        tables = [read_table(validate.inside(self.root, f), self._fix) for f in files]
        columns = set.intersection(*(set(t.column_names) for t in tables))
        needed = ["episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"]
        types = {c: schema.INTEGER for c in needed}
        for cam in self._videos:
            key = self._keys[cam]
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
        self._episode_tasks = [tasks[i] for i in order]
        n = int(self._info["total_episodes"])
        if not np.array_equal(meta["episode_index"], np.arange(len(order))) or len(order) != n:
            raise DatasetError(
                f"{self.root}: episode metadata lists {len(order)} episodes, info.json {n} (indices must be 0..{n - 1}); "
                f"the dataset is inconsistent, re-collect it with: {hint}"
            )
        self._meta = meta

    def _data_path(self, chunk: int, file: int) -> Path:
        return validate.path_in(self.root, self._info["data_path"], "data_path", chunk_index=int(chunk),
                                file_index=int(file))

    def _video_path(self, camera: str, ep: int) -> Path:
        key = self._keys[camera]
        where = (key, int(self._meta[f"videos/{key}/chunk_index"][ep]), int(self._meta[f"videos/{key}/file_index"][ep]))
        if where not in self._video_files:  # checked once per file: many episodes share one, and every read asks
            template = self._info.get("video_path") or VIDEO_PATH
            self._video_files[where] = validate.path_in(self.root, template, "video_path", video_key=key,
                                                        chunk_index=where[1], file_index=where[2])
        return self._video_files[where]

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
            for cam in self._cameras:
                if cam not in self._videos:
                    parts.setdefault(f"image:{cam}", []).append(image_bytes(table, self._keys[cam], path))
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
        self._data = data
        validate.episode_spans(self._meta, self._data, self.root)
        self._check_rows()

    def _check_rows(self) -> None:
        """What training trusts of every row: finite state and action, a task the tasks table lists."""
        data = self._data

        def frame(row: int) -> str:
            return f"episode {int(data['episode_index'][row])} frame {int(data['frame_index'][row])}"

        validate.finite_rows(data["state"], LEROBOT_STATE, str(self.root), frame)
        validate.finite_rows(data["action"], LEROBOT_ACTION, str(self.root), frame)
        unknown = np.flatnonzero((data["task_index"] < 0) | (data["task_index"] >= len(self._tasks)))
        if len(unknown):
            i = int(unknown[0])
            raise DatasetError(f"{self.root}: {frame(i)} has task_index {int(data['task_index'][i])}, which "
                               f"{TASKS_PATH} does not list (it has {len(self._tasks)} tasks); {validate.FIX_AT_SOURCE}")

    def _check_videos(self, hint: str) -> None:
        for cam in self._videos:
            seen: set[Path] = set()
            for ep in range(self.num_episodes):
                path = self._video_path(cam, ep)
                if path in seen:
                    continue
                if not path.is_file():
                    key = self._keys[cam]
                    same = (self._meta[f"videos/{key}/chunk_index"] == self._meta[f"videos/{key}/chunk_index"][ep]) & (
                        self._meta[f"videos/{key}/file_index"] == self._meta[f"videos/{key}/file_index"][ep]
                    )
                    episodes = _span(np.flatnonzero(same))
                    raise DatasetError(
                        f"{self.root}: video file {path.relative_to(self.root)} is missing (episodes {episodes} need it); "
                        f"the dataset is incomplete, re-collect it with: {hint}"
                    )
                seen.add(path)

    def _check_timing(self, hint: str) -> None:
        """fps is how frames are found (frame k of a file is at k / fps): one wrong rate trains
        on shifted frames without a sound. So info.json's fps must agree with every video
        feature's ``video.fps``, the episodes' timestamps and each mp4's own header."""
        fps = float(self.fps)
        fix = f"set fps in {INFO_PATH} to the rate the data was recorded at, or re-collect the dataset with: {hint}"
        for cam in self._videos:
            key = self._keys[cam]
            declared = self._info["features"][key].get("info", {}).get("video.fps")
            if declared is not None and not _same_rate(float(declared), fps):
                raise DatasetError(f"{self.root}: {INFO_PATH} has fps={self.fps} but features['{key}'].info['video.fps']="
                                   f"{declared}; {fix}")
        self._check_data_timestamps(fps, fix)
        self._check_video_spans(fps, fix)
        self._check_video_headers(fps, fix)

    def _check_data_timestamps(self, fps: float, fix: str) -> None:
        """Each frame's ``timestamp`` is ``frame_index / fps`` (LeRobot's rule), to a quarter frame."""
        ts, fi = self._data["timestamp"].astype(np.float64), self._data["frame_index"].astype(np.float64)
        bad = np.flatnonzero(np.abs(ts - fi / fps) > 0.25 / fps)
        if len(bad):
            i = int(bad[0])
            ep = int(self._data["episode_index"][i])
            table = self.episode_table(ep)
            rate = _rate(table["timestamp"])
            raise DatasetError(f"{self.root}: episode {ep} frame {int(fi[i])} has timestamp {ts[i]:.4f} s but "
                               f"frame_index / fps = {fi[i] / fps:.4f} s with fps={self.fps} from {INFO_PATH}"
                               f"{f' (its timestamps step at {rate:g} fps)' if rate else ''}; {fix}")

    def _check_video_spans(self, fps: float, fix: str) -> None:
        """An episode's span of its video file starts on a frame's time and lasts ``length / fps``, to half a frame."""
        lengths = self._meta["length"].astype(np.float64)
        for cam in self._videos:
            key = f"videos/{self._keys[cam]}"
            span = self._meta[f"{key}/to_timestamp"].astype(np.float64) - self._meta[f"{key}/from_timestamp"]
            bad = np.flatnonzero(np.abs(span - lengths / fps) > 0.5 / fps)
            starts = self._meta[f"{key}/from_timestamp"].astype(np.float64)
            off = np.flatnonzero(np.abs(starts - np.round(starts * fps) / fps) > TIMESTAMP_TOLERANCE_S)
            if len(off) and not self.snap_starts:
                ep = int(off[0])
                raise DatasetError(f"{self.root}: episode {ep}'s {key}/from_timestamp {starts[ep]:.6f} s is not a "
                                   f"frame's time (a multiple of 1/fps={1 / fps:.6f} s, within {TIMESTAMP_TOLERANCE_S} s) "
                                   f"in meta/episodes; repair the dataset with: {REPAIR_HINT.format(root=self.root)}")
            if len(bad):
                ep = int(bad[0])
                raise DatasetError(f"{self.root}: episode {ep} has {int(lengths[ep])} frames but its {key} span "
                                   f"(to_timestamp - from_timestamp in meta/episodes) lasts {span[ep]:.4f} s, not "
                                   f"{lengths[ep] / fps:.4f} s at fps={self.fps} ({int(lengths[ep]) / span[ep]:g} fps); {fix}")

    def _check_video_headers(self, fps: float, fix: str) -> None:
        """Each mp4 (its header only, once per file) plays at fps and holds the frames its episodes span."""
        for cam in self._videos:
            key = f"videos/{self._keys[cam]}"
            needed: dict[Path, tuple[int, int]] = {}  # file -> (frames its episodes end at, one such episode)
            for ep in range(self.num_episodes):
                end = int(round(float(self._meta[f"{key}/to_timestamp"][ep]) * fps))
                path = self._video_path(cam, ep)
                if end >= needed.get(path, (-1, 0))[0]:
                    needed[path] = (end, ep)
            for path, (end, ep) in needed.items():
                self._check_header(path, end, ep, fps, fix)

    def _check_header(self, path: Path, end: int, ep: int, fps: float, fix: str) -> None:
        rel = path.relative_to(self.root)
        try:
            head = video.stream_info(path)
        except ValueError as e:
            raise DatasetError(f"{self.root}: video file {rel} is not a readable video ({e}); "
                               f"re-collect the dataset with: {COLLECT_HINT.format(root=self.root)}") from e
        if head["fps"] and not _same_rate(head["fps"], fps):
            raise DatasetError(f"{self.root}: video file {rel} plays at {head['fps']:g} fps but {INFO_PATH} has "
                               f"fps={self.fps}; {fix}")
        if head["frames"] and head["frames"] < end:
            raise DatasetError(f"{self.root}: video file {rel} holds {head['frames']} frames but its episodes end at "
                               f"frame {end} (episode {ep}'s to_timestamp x fps={self.fps}); the video is truncated, "
                               f"re-collect the dataset with: {COLLECT_HINT.format(root=self.root)}")

    # -- properties --------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        return self._info

    def identity(self) -> dict[str, Any]:
        """What makes this dataset this one, wherever it lies: its totals and a hash of its
        ``meta/info.json`` (schema, fps, totals); a resume compares it (training.run_dir)."""
        canonical = json.dumps(self._info, sort_keys=True, separators=(",", ":")).encode()
        return {"total_episodes": int(self._info["total_episodes"]), "total_frames": int(self._info["total_frames"]),
                "info_sha256": hashlib.sha256(canonical).hexdigest()[:16]}

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
    def video_cameras(self) -> tuple[str, ...]:
        """The cameras whose frames are in mp4 files (the others' are images in the data files)."""
        return self._videos

    def feature_key(self, camera: str) -> str:
        """The camera's feature in info.json and stats.json (``observation.images.<camera>``, or
        ``observation.image`` for a lone camera)."""
        self._check_camera(camera)
        return self._keys[camera]

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

    def orientation(self, camera: str) -> str:
        """How the camera's frames are stored (``envs.orientation``); refused, naming the fix, when unknown."""
        self._check_camera(camera)
        return provenance.known(self._orientations[camera], self.root, self._keys[camera])

    def image_shape(self, camera: str) -> tuple[int, int, int]:
        """(H, W, 3) of a camera's stored frames."""
        self._check_camera(camera)
        shape = self._info["features"][self._keys[camera]]["shape"]
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
        """The episode's frames of one camera **upright**, however stored: every reader for a model takes them
        here. uint8 (T, H, W, 3), read-only (cached); decodes only its span."""
        ep = self._check_episode(ep)
        orientation = self.orientation(camera)
        key = (ep, camera)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        frames = to_upright(self.stored_frames(ep, camera), orientation)
        frames.setflags(write=False)
        if self.cache_episodes > 0:
            self._cache[key] = frames
            while len(self._cache) > self.cache_episodes:
                self._cache.popitem(last=False)
        return frames

    def _decode_images(self, ep: int, camera: str) -> np.ndarray:
        """An image feature's frames of the episode, decoded from the data files' bytes (RGB uint8)."""
        where = f"{self.root}: episode {ep} {self._keys[camera]}"
        return np.stack([decode_image(data, f"{where} frame {i}")
                         for i, data in enumerate(self.episode_table(ep)[f"image:{camera}"])])

    def video_span(self, ep: int, camera: str) -> tuple[Path, int, int]:
        """Where the episode's frames of one camera are: (mp4 file, its first frame there, frame count)."""
        ep = self._check_episode(ep)
        self._check_camera(camera)
        if camera not in self._videos:
            raise ValueError(f"camera {camera!r} is stored as images in the data files, not in a video")
        start = int(round(float(self._meta[f"videos/{self._keys[camera]}/from_timestamp"][ep]) * float(self.fps)))
        return self._video_path(camera, ep), start, int(self._meta["length"][ep])

    def video_start(self, ep: int, camera: str) -> float:
        """The episode's ``from_timestamp`` in its video file, in seconds, as meta/episodes records it."""
        ep = self._check_episode(ep)
        self._check_camera(camera)
        return float(self._meta[f"videos/{self._keys[camera]}/from_timestamp"][ep])

    def video_files(self, camera: str) -> dict[Path, list[tuple[int, int, int]]]:
        """Each mp4 of a camera with the spans its episodes occupy: ``(first frame, end frame, episode)``,
        in file order (for reading each file once, front to back)."""
        files: dict[Path, list[tuple[int, int, int]]] = {}
        for ep in range(self.num_episodes):
            path, start, length = self.video_span(ep, camera)
            files.setdefault(path, []).append((start, start + length, ep))
        return {path: sorted(spans) for path, spans in files.items()}

    def stored_frames(self, ep: int, camera: str) -> np.ndarray:
        """The episode's frames of one camera as stored, however turned (uncached): for tools that copy or check
        pixels (convert, check, statistics); models read :meth:`episode_frames`."""
        ep = self._check_episode(ep)
        self._check_camera(camera)
        if camera not in self._videos:
            return self._decode_images(ep, camera)
        path, start, length = self.video_span(ep, camera)
        try:
            return video.read_span(path, start, length, float(self.fps))
        except video.TimelineError as e:
            if e.found is None:
                raise DatasetError(f"{path} ends before frame {e.frame}, which episode {ep} needs (frames {start}.."
                                   f"{start + length - 1}); the video is truncated, re-collect the dataset with: "
                                   f"{COLLECT_HINT.format(root=self.root)}") from None
            raise DatasetError(
                f"{path}: episode {ep} frame {e.frame - start} (frame {e.frame} of the file) should be at "
                f"{e.expected:.4f} s, the video has {e.found:.4f} s there: its timeline drifts from frame / fps "
                f"(LeRobot's reader refuses it too); repair the dataset with: {REPAIR_HINT.format(root=self.root)}"
            ) from None
        except ValueError as e:
            raise DatasetError(f"{e}; re-collect the dataset with: {COLLECT_HINT.format(root=self.root)}") from None


def decode_image(data: bytes | None, where: str) -> np.ndarray:
    """One stored image (PNG/JPEG bytes) as RGB uint8 (H, W, 3)."""
    import imageio.v3 as iio

    if not data:
        raise DatasetError(f"{where} has no image bytes (an image stored by path only is not supported)")
    try:
        image = np.asarray(iio.imread(data))
    except Exception as exc:  # noqa: BLE001 - whatever the image plugin raises for bytes that are not an image
        raise DatasetError(f"{where}: its image bytes do not decode ({type(exc).__name__}: {str(exc)[:120]}); "
                           f"{validate.FIX_AT_SOURCE}") from None
    image = np.repeat(image[..., None], 3, axis=-1) if image.ndim == 2 else image[..., :3]
    return image.astype(np.uint8, copy=False)


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


def _same_rate(a: float, b: float) -> bool:
    """Equal frame rates, allowing for headers that print 29.97 for 30000/1001."""
    return abs(a - b) <= 1e-3 * max(a, b)


def _rate(timestamps: np.ndarray) -> float | None:
    """The frame rate an episode's timestamps step at (None for a single frame)."""
    steps = np.diff(timestamps.astype(np.float64))
    return float(1.0 / np.median(steps)) if len(steps) and np.median(steps) > 0 else None


def _span(indices: np.ndarray) -> str:
    indices = [int(i) for i in indices]
    if not indices:
        return "none"
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"

