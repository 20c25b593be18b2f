"""Video files of a LeRobot v3.0 dataset: streaming an episode's frames into an mp4 while
collecting, and decoding one episode's span of a file (or a whole file, front to back)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import imageio.v2 as imageio
import numpy as np

from wam_gym.utils.video import read_mp4, write_mp4

__all__ = ["Mp4Stream", "frames_in_order", "header", "read_mp4", "read_span"]


class Mp4Stream:
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
