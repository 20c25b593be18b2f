"""Video files of a LeRobot v3.0 dataset: streaming an episode's frames into an mp4 while
collecting, and decoding one episode's span of a file (or a whole file, front to back)."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import imageio.v2 as imageio
import numpy as np

from wam_gym.utils.video import concat_mp4, read_mp4, write_mp4

DEFAULT_GOP = 10  # frames between keyframes in a dataset's videos (LeRobot encodes g=2: larger files, slower episodes)

__all__ = ["Mp4Stream", "frames_in_order", "header", "read_mp4", "read_span"]


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
            concat_mp4(self.path, self._segments)
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
            self._thread.join(timeout=30)


def read_span(path: Path, start: int, length: int, fps: float) -> np.ndarray | None:
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


def header(path: Path) -> dict[str, float]:
    """``fps`` and ``duration`` (seconds; ffmpeg prints it to 10 ms) from a video's header, without
    decoding frames; raises what imageio raises for an unreadable file."""
    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        meta = reader.get_meta_data()
    finally:
        reader.close()
    return {"fps": float(meta.get("fps") or 0.0), "duration": float(meta.get("duration") or 0.0)}


@contextmanager
def frames_in_order(path: Path) -> Iterator[Iterator[np.ndarray]]:
    """Every frame of a video, decoded front to back; the file is closed when the block ends."""
    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        yield reader.iter_data()
    finally:
        reader.close()
