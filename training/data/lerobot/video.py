"""Video files of a LeRobot v3.0 dataset: streaming an episode's frames into an mp4 while
collecting, and decoding one episode's span of a file (or a whole file, front to back).

The timeline is the contract: frame ``k`` of a file is presented at ``k / fps``, within LeRobot's
``TIMESTAMP_TOLERANCE_S``. Files written here hold it exactly (``concat_mp4`` joins the episodes'
segments by frame number). A span read by seeking checks every frame's time, so a file whose
timeline drifts is an error naming the repair, never a neighbouring frame returned in silence."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from training.data.lerobot.layout import TIMESTAMP_TOLERANCE_S
from wam_gym.utils.video import concat_mp4, decode_timed, read_mp4, stream_info, write_mp4

DEFAULT_GOP = 10  # frames between keyframes in a dataset's videos (LeRobot encodes g=2: larger files, slower episodes)

__all__ = ["Mp4Stream", "TimelineError", "decode_timed", "off_grid", "read_mp4", "read_span", "stream_info",
           "time_errors"]


class Mp4Stream:
    """One video file of a dataset, written an episode at a time by an encoder thread.

    With ``gop`` (the default), each episode is encoded into a segment of its own, which starts
    with a keyframe and has at most ``gop`` frames between keyframes; :meth:`close` joins the
    segments into ``path`` without re-encoding. A reader seeking to an episode then starts decoding
    at its first frame, and to any frame after at most ``gop - 1`` others. ``gop=None`` encodes every
    episode into one stream with the encoder's default keyframe spacing (250 frames: the layout of
    earlier versions, kept to measure against in bench/dataset_access.py).

    Every file is written to a hidden temp file and renamed, so a half-written video never sits
    at its final path; :meth:`abort` removes what was written.
    """

    _END = object()
    _ABORT = object()
    _EPISODE = object()  # between two episodes' frames

    class _Aborted(Exception):
        pass

    def __init__(self, path: Path, fps: float, gop: int | None = DEFAULT_GOP):
        self.path = path
        self.fps = fps
        self.gop = gop
        self.frames = 0
        self._episodes = 0  # written with write()
        self._encoded = 0  # of those, encoded into their segments
        self._progress = threading.Condition()
        self._segments: list[Path] = []
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"mp4:{path.name}", daemon=True)
        self._thread.start()

    def _frames(self) -> Iterator[np.ndarray]:
        """Frames up to the end of the episode (segments) or of the stream (one encode)."""
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if item is self._ABORT:
                raise self._Aborted
            if item is self._EPISODE:
                if self.gop is not None:
                    return
                continue
            yield item

    def _run(self) -> None:
        try:
            if self.gop is None:
                write_mp4(self.path, self._frames(), fps=self.fps)
                return
            while (first := self._queue.get()) is not self._END:
                if first is self._ABORT:
                    raise self._Aborted
                segment = self.path.with_name(f".{self.path.name}.{len(self._segments):05d}.mp4")
                self._segments.append(segment)
                write_mp4(segment, itertools.chain([first], self._frames()), fps=self.fps, gop=self.gop)
                with self._progress:
                    self._encoded += 1
                    self._progress.notify_all()
            concat_mp4(self.path, self._segments, self.fps)
        except self._Aborted:
            pass
        except BaseException as e:  # reported to the writer's thread on its next call
            self._error = e
        finally:
            for segment in self._segments:
                segment.unlink(missing_ok=True)
            with self._progress:  # nobody waits on an encoder that has stopped
                self._encoded = float("inf")
                self._progress.notify_all()

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

    def encoded_bytes(self) -> int:
        """The size of every episode written so far, once encoded (segments; waits for the encoder, so the
        answer, and a file rotation decided on it, is the same on any machine). 0 without segments."""
        if self.gop is None:
            return 0
        with self._progress:
            self._progress.wait_for(lambda: self._encoded >= self._episodes)
        self._check()
        return sum(p.stat().st_size for p in self._segments if p.is_file())

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"encoding {self.path} failed: {self._error}") from self._error

    def write(self, frames: Sequence[np.ndarray]) -> None:
        """One episode's frames."""
        for frame in frames:
            self._put(frame)
        self._put(self._EPISODE)
        self._episodes += 1
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
            if threading.current_thread() is not self._thread:  # the collector may run there
                self._thread.join(timeout=30)


class TimelineError(ValueError):
    """A video frame is not where ``frame index / fps`` says: ``frame`` (of the file) should be at
    ``expected`` seconds, the file has ``found`` there (None: the file ends first)."""

    def __init__(self, path: Path, frame: int, expected: float, found: float | None):
        self.path, self.frame, self.expected, self.found = path, frame, expected, found
        where = "the file ends before it" if found is None else f"the frame there is at {found:.6f} s"
        super().__init__(f"{path}: frame {frame} should be at {expected:.6f} s (frame / fps), {where}")


def time_errors(times: np.ndarray, fps: float, first: int = 0) -> np.ndarray:
    """Each frame's presentation time minus where it belongs, ``(first + i) / fps``, in seconds."""
    return np.asarray(times, dtype=np.float64) - (first + np.arange(len(times))) / float(fps)


def off_grid(times: np.ndarray, fps: float, first: int = 0) -> np.ndarray:
    """Indices ``i`` whose time is not ``(first + i) / fps`` within LeRobot's tolerance."""
    return np.flatnonzero(np.abs(time_errors(times, fps, first)) > TIMESTAMP_TOLERANCE_S)


def read_span(path: Path, start: int, length: int, fps: float) -> np.ndarray:
    """Frames ``start .. start + length - 1`` of a video, seeking to the keyframe before ``start``.

    Decoded frames before half a frame ahead of ``start / fps`` are dropped; every frame kept must be
    at ``(start + i) / fps`` within the tolerance, or :class:`TimelineError` names the first that is
    not (a drifting file, or one that ends early). ValueError for a file FFmpeg cannot decode.
    """
    fps = float(fps)
    frames: list[np.ndarray] = []
    times: list[float] = []
    with decode_timed(path, start=start / fps) as timed:
        for time, frame in timed:
            if time < (start - 0.5) / fps:
                continue
            frames.append(frame)
            times.append(time)
            if len(frames) == length:
                break
    bad = off_grid(np.array(times), fps, start)
    if len(bad) or len(frames) < length:
        i = int(bad[0]) if len(bad) else len(frames)
        raise TimelineError(path, start + i, (start + i) / fps, times[i] if i < len(times) else None)
    return np.stack(frames)

