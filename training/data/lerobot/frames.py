"""The frames of a LeRobot v3.0 dataset's cameras: an episode's span decoded from its mp4 file, or its
images decoded from the data files, turned upright, the last few kept."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from envs.orientation import to_upright
from training.data.lerobot import provenance, validate, video
from training.data.lerobot.episodes import EpisodeIndex, span_of
from training.data.lerobot.layout import COLLECT_HINT, INFO_PATH, REPAIR_HINT, VIDEO_PATH, DatasetError


class FrameReader:
    """Reads the frames of every camera of a dataset whose ``index`` is loaded, keeping the last
    ``cache_episodes`` (episode, camera) pairs decoded."""

    def __init__(self, index: EpisodeIndex, info: dict[str, Any], orientations: dict[str, str | None],
                 cache_episodes: int):
        self.index, self.root, self.info, self.keys = index, index.root, info, index.keys
        self.cameras, self.videos = tuple(index.keys), index.videos
        self.orientations = orientations
        self.cache_episodes = cache_episodes
        self.cache: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()
        self._video_files: dict[tuple[str, int, int], Path] = {}  # (feature, chunk, file) -> its path, inside root

    def __getstate__(self) -> dict[str, Any]:
        # The cache is per process: a loader worker starts with its own, empty, rather than a pickled copy of ours.
        return {**self.__dict__, "cache": OrderedDict()}

    def check_camera(self, camera: str) -> None:
        if camera not in self.cameras:
            raise ValueError(f"camera {camera!r} is not in the dataset; it has {list(self.cameras)}")

    def video_path(self, camera: str, ep: int) -> Path:
        where = self.index.video_file(camera, ep)
        if where not in self._video_files:  # checked once per file: many episodes share one, and every read asks
            template = self.info.get("video_path") or VIDEO_PATH
            self._video_files[where] = validate.path_in(self.root, template, "video_path", video_key=where[0],
                                                        chunk_index=where[1], file_index=where[2])
        return self._video_files[where]

    def check_files(self, hint: str) -> None:
        """Every mp4 an episode's frames are in exists."""
        meta = self.index.meta
        for cam in self.videos:
            seen: set[Path] = set()
            for ep in range(self.index.num_episodes):
                path = self.video_path(cam, ep)
                if path in seen:
                    continue
                if not path.is_file():
                    key = self.keys[cam]
                    same = (meta[f"videos/{key}/chunk_index"] == meta[f"videos/{key}/chunk_index"][ep]) & (
                        meta[f"videos/{key}/file_index"] == meta[f"videos/{key}/file_index"][ep]
                    )
                    raise DatasetError(
                        f"{self.root}: video file {path.relative_to(self.root)} is missing (episodes "
                        f"{span_of(np.flatnonzero(same))} need it); the dataset is incomplete, re-collect it with: {hint}"
                    )
                seen.add(path)

    def check_headers(self, fps: float, fix: str) -> None:
        """Each mp4 (its header only, once per file) plays at fps and holds the frames its episodes span."""
        for cam in self.videos:
            key = f"videos/{self.keys[cam]}"
            needed: dict[Path, tuple[int, int]] = {}  # file -> (frames its episodes end at, one such episode)
            for ep in range(self.index.num_episodes):
                end = int(round(float(self.index.meta[f"{key}/to_timestamp"][ep]) * fps))
                path = self.video_path(cam, ep)
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
        if head["fps"] and not same_rate(head["fps"], fps):
            raise DatasetError(f"{self.root}: video file {rel} plays at {head['fps']:g} fps but {INFO_PATH} has "
                               f"fps={self.info['fps']}; {fix}")
        if head["frames"] and head["frames"] < end:
            raise DatasetError(f"{self.root}: video file {rel} holds {head['frames']} frames but its episodes end at "
                               f"frame {end} (episode {ep}'s to_timestamp x fps={self.info['fps']}); the video is "
                               f"truncated, re-collect the dataset with: {COLLECT_HINT.format(root=self.root)}")

    def orientation(self, camera: str) -> str:
        self.check_camera(camera)
        return provenance.known(self.orientations[camera], self.root, self.keys[camera])

    def episode_frames(self, ep: int, camera: str) -> np.ndarray:
        ep = self.index.check_episode(ep)
        orientation = self.orientation(camera)
        key = (ep, camera)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        frames = to_upright(self.stored_frames(ep, camera), orientation)
        frames.setflags(write=False)
        if self.cache_episodes > 0:
            self.cache[key] = frames
            while len(self.cache) > self.cache_episodes:
                self.cache.popitem(last=False)
        return frames

    def video_span(self, ep: int, camera: str) -> tuple[Path, int, int]:
        ep = self.index.check_episode(ep)
        self.check_camera(camera)
        if camera not in self.videos:
            raise ValueError(f"camera {camera!r} is stored as images in the data files, not in a video")
        start = int(round(self.index.video_start(ep, camera) * float(self.info["fps"])))
        return self.video_path(camera, ep), start, int(self.index.meta["length"][ep])

    def video_files(self, camera: str) -> dict[Path, list[tuple[int, int, int]]]:
        files: dict[Path, list[tuple[int, int, int]]] = {}
        for ep in range(self.index.num_episodes):
            path, start, length = self.video_span(ep, camera)
            files.setdefault(path, []).append((start, start + length, ep))
        return {path: sorted(spans) for path, spans in files.items()}

    def stored_frames(self, ep: int, camera: str) -> np.ndarray:
        ep = self.index.check_episode(ep)
        self.check_camera(camera)
        if camera not in self.videos:
            return self._decode_images(ep, camera)
        path, start, length = self.video_span(ep, camera)
        try:
            return video.read_span(path, start, length, float(self.info["fps"]))
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

    def _decode_images(self, ep: int, camera: str) -> np.ndarray:
        """An image feature's frames of the episode, decoded from the data files' bytes (RGB uint8)."""
        where = f"{self.root}: episode {ep} {self.keys[camera]}"
        return np.stack([decode_image(data, f"{where} frame {i}")
                         for i, data in enumerate(self.index.episode_table(ep)[f"image:{camera}"])])


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


def same_rate(a: float, b: float) -> bool:
    """Equal frame rates, allowing for headers that print 29.97 for 30000/1001."""
    return abs(a - b) <= 1e-3 * max(a, b)
