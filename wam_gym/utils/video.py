"""mp4 I/O for rollout videos and predicted future frames (uint8 ``(H, W, 3)`` RGB frames).

* :func:`write_mp4` is atomic (temp file in the same directory, then :func:`os.replace`) and
  keeps the exact frame size (``macro_block_size=1``). Even sizes use H.264 ``yuv420p``, which
  every player reads; an odd width or height, which ``yuv420p`` cannot hold, uses ``yuv444p``.
  Frame ``k`` is presented at exactly ``k / fps``.
* :func:`concat_mp4` joins such files without re-encoding and keeps that timeline exact across
  the joins: part ``i``'s frame ``k`` lands at ``(frames before part i + k) / fps``.
* :func:`read_mp4`, :func:`decode_timed` and :func:`frame_times` read with PyAV (FFmpeg's
  libraries in-process), the decoder LeRobot's readers use, so frames match theirs bit for bit.
* :func:`tile` and :func:`future_panel` build "rollout beside the predicted future" frames
  with nearest-neighbour resizing in numpy (no extra dependencies, no blurring of pixels).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import imageio.v2 as imageio
import numpy as np

from wam_gym.utils.publish import atomic_path

log = logging.getLogger(__name__)
# imageio-ffmpeg starts ffmpeg with preexec_fn=os.setpgrp (to keep Ctrl-C from ffmpeg), Python run in the forked
# child, which CPython's subprocess docs call unsafe beside other threads: with encoder threads (a dataset's cameras)
# and pyarrow's jemalloc thread running, a child stuck on a lock before exec and the writer waited forever. Its
# switch turns that off (imageio-ffmpeg #58, the same hang); a Ctrl-C then reaches ffmpeg too, which only stops it.
os.environ.setdefault("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", "1")
_RGB = "pass RGB images, one (H, W, 3) array per frame (grey ones: np.stack([x] * 3, -1))"
_TO_UINT8 = "convert with (np.clip(x, 0, 1) * 255).astype(np.uint8) for [0, 1] floats"


def _check_frame(frame: np.ndarray, index: int, shape: tuple[int, ...] | None) -> np.ndarray:
    """``frame`` as a contiguous uint8 (H, W, 3) array of the expected ``shape``."""
    frame = np.asarray(frame)
    if frame.dtype != np.uint8:
        raise ValueError(f"frame {index}: dtype must be uint8, got {frame.dtype}; {_TO_UINT8}")
    if frame.ndim != 3 or frame.shape[-1] != 3 or 0 in frame.shape:
        raise ValueError(f"frame {index}: shape must be (H, W, 3), got {frame.shape}; {_RGB}")
    if shape is not None and frame.shape != shape:
        raise ValueError(f"frame {index}: shape {frame.shape} differs from the first frame's {shape}")
    return np.ascontiguousarray(frame)


def _frames_iter(frames: np.ndarray | Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    if isinstance(frames, np.ndarray):
        if frames.ndim != 4:
            raise ValueError(f"frames must be (T, H, W, 3), got shape {frames.shape}; {_RGB}")
        if frames.dtype != np.uint8:  # checked up front so the message names the whole array
            raise ValueError(f"frames dtype must be uint8, got {frames.dtype}; {_TO_UINT8}")
    return iter(frames)


def write_mp4(path: str | os.PathLike, frames: np.ndarray | Iterable[np.ndarray], fps: float = 20,
              gop: int | None = None) -> Path:
    """Encode uint8 RGB frames (``(T, H, W, 3)`` or an iterable of ``(H, W, 3)``) to ``path``.

    Frames are streamed to the encoder, so an iterable need not fit in memory. ``gop``: at most
    that many frames between keyframes (None: the encoder's default, 250), so a reader seeking to
    any frame decodes fewer than ``gop`` frames before it. Raises ValueError for no frames, a
    non-uint8 dtype or a bad/inconsistent shape; ``path`` is then left as it was and no temp file
    remains.
    """
    path = Path(path)
    it = _frames_iter(frames)
    first = next(it, None)
    if first is None:
        raise ValueError(f"no frames to write to {path}")
    first = _check_frame(first, 0, None)
    h, w = first.shape[:2]
    pixelformat = "yuv420p" if h % 2 == 0 and w % 2 == 0 else "yuv444p"
    path.parent.mkdir(parents=True, exist_ok=True)
    # The ".mp4" suffix lets ffmpeg pick the container.
    with atomic_path(path, suffix=".tmp.mp4") as tmp:
        _encode(str(tmp), first, it, fps, pixelformat, gop)
    return path


def concat_mp4(path: str | os.PathLike, parts: Sequence[str | os.PathLike], fps: float) -> Path:
    """Join mp4 files of one codec and size into ``path`` without re-encoding; atomic like write_mp4.

    Every packet is placed by its frame number, not by the parts' durations: part ``i``'s frame
    ``k`` is presented at exactly ``(frames before part i + k) / fps``. (ffmpeg's concat demuxer
    offsets each part by its container's duration, which can be a few ticks short: the shift then
    adds up over the file, and a reader seeking by time lands on a neighbouring frame.) Each part's
    timestamps are snapped to its own ``1 / fps`` grid, so a part that drifts by less than half a
    frame comes out exact too. Each part's first frame stays a keyframe.
    """
    import av

    path = Path(path)
    rate = _rate(fps)
    timings = [_timing(part, rate) for part in parts]
    time_base, tick, _ = timings[0]  # the joined file's, its first part's
    delay = max(part_delay for _, _, part_delay in timings)
    with (atomic_path(path, suffix=".tmp.mp4") as tmp,
          av.open(str(tmp), "w", format="mp4", options={"movie_timescale": str(time_base.denominator)}) as out):
        stream = None
        before = 0  # frames of the parts already joined
        for part, (_, tick_in, part_delay) in zip(parts, timings):
            with _open(part) as source:
                video = source.streams.video[0]
                if stream is None:
                    stream = out.add_stream_from_template(video)
                    stream.time_base = time_base
                frames = 0
                for packet in source.demux(video):
                    if packet.pts is None:  # the demuxer's empty end-of-stream packet
                        continue
                    # dts run ahead of pts by the encoder's reordering delay; every part's are moved back to the
                    # largest delay among them, so decoding order stays increasing across the joins.
                    dts = before + round(packet.dts / tick_in) - (delay - part_delay)
                    pts = before + round(packet.pts / tick_in)
                    packet.stream = stream
                    packet.time_base = time_base
                    packet.pts, packet.dts, packet.duration = pts * tick, dts * tick, tick
                    out.mux(packet)
                    frames += 1
                before += frames
    return path


def _rate(fps: float) -> Fraction:
    """``fps`` as an exact ratio (29.97 -> 2997/100, 30000/1001 stays itself)."""
    if not fps or fps <= 0:
        raise ValueError(f"fps must be positive, got {fps!r}")
    return Fraction(fps).limit_denominator(1001)


def _timescale(rate: Fraction) -> int:
    """Ticks a second for a file's track and its movie header: a multiple of the frame rate (so every
    frame time is a whole tick) of at least 10000. The movie header's timescale matters as much: it
    holds the edit list that B-frames need, and at FFmpeg's default of 1000 a duration such as 33
    frames at 80 fps (412.5 ms) rounds to the millisecond, so the file reads a few ticks short and
    whatever is joined after it (ffmpeg's concat demuxer, LeRobot's aggregate_datasets) shifts."""
    return rate.numerator * math.ceil(10000 / rate.numerator)


def _ticks_per_frame(time_base: Fraction, rate: Fraction, path: str | os.PathLike) -> int:
    """How many ticks of ``time_base`` one frame at ``rate`` lasts (a whole number, or ValueError)."""
    tick = 1 / (rate * time_base)
    if tick.denominator != 1:
        raise ValueError(f"{path}: its time base {time_base} cannot hold frames at {float(rate):g} fps exactly; "
                         "re-encode it with write_mp4")
    return int(tick)


def _timing(path: str | os.PathLike, rate: Fraction) -> tuple[Fraction, int, int]:
    """A file's time base, the ticks of it one frame lasts, and how many frames its decoding timestamps
    start before its first presentation time (the encoder's reordering delay)."""
    with _open(path) as source:
        video = source.streams.video[0]
        tick = _ticks_per_frame(video.time_base, rate, path)
        return video.time_base, tick, max([0, *(-round(p.dts / tick) for p in source.demux(video) if p.dts is not None)])


@contextmanager
def _open(path: str | os.PathLike) -> Iterator[Any]:
    """A PyAV input container; ValueError ("unreadable video") for what FFmpeg cannot open."""
    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such video: {path}; check the path")
    try:
        container = av.open(str(path))
    except av.FFmpegError as e:
        raise ValueError(f"unreadable video: {path} ({type(e).__name__}); the file is not an mp4 or is truncated: "
                         "record it again (write_mp4 never leaves a partial file)") from e
    try:
        if not container.streams.video:
            raise ValueError(f"unreadable video: {path} has no video stream")
        yield container
    finally:
        container.close()


def _encode(tmp: str, first: np.ndarray, rest: Iterator[np.ndarray], fps: float, pixelformat: str,
            gop: int | None = None) -> None:
    timescale = str(_timescale(_rate(fps)))
    params = ["-video_track_timescale", timescale, "-movie_timescale", timescale]
    params += [] if gop is None else ["-g", str(int(gop))]
    writer = imageio.get_writer(tmp, format="FFMPEG", fps=fps, macro_block_size=1, pixelformat=pixelformat,
                                output_params=params)
    # Not `with`: imageio's writer skips close() when the block raises, which leaves ffmpeg
    # running to (re)create the temp file after we have deleted it.
    try:
        writer.append_data(first)
        for i, frame in enumerate(rest, start=1):
            writer.append_data(_check_frame(frame, i, first.shape))
    finally:
        writer.close()


def read_mp4(path: str | os.PathLike) -> np.ndarray:
    """All frames of a video as uint8 ``(T, H, W, 3)``, in presentation order.

    Raises FileNotFoundError for a missing file, ValueError ("unreadable video") for a file
    FFmpeg cannot decode and ValueError for a video without frames.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such video: {path}; check the path (python -m wam_gym.eval writes "
                                "output_dir/videos/ only with EVALUATION.eval_save_video=true)")
    with decode_timed(path) as timed:
        frames = [frame for _, frame in timed]
    if not frames:
        raise ValueError(f"video has no frames: {path}")
    return np.stack(frames)


@contextmanager
def decode_timed(path: str | os.PathLike, start: float = 0.0) -> Iterator[Iterator[tuple[float, np.ndarray]]]:
    """``(presentation time in seconds, uint8 (H, W, 3) RGB frame)`` of a video, front to back from
    ``start`` seconds on: with ``start`` > 0 it seeks to the keyframe at or before ``start`` and
    yields from there (the caller drops what it does not want, by time). A decoding error is a
    ValueError ("unreadable video") naming the file."""
    import av

    with _open(path) as source:
        video = source.streams.video[0]
        if start > 0:
            source.seek(int(start / video.time_base), stream=video, backward=True, any_frame=False)

        def frames() -> Iterator[tuple[float, np.ndarray]]:
            try:
                for frame in source.decode(video):
                    yield float(frame.pts * video.time_base), frame.to_ndarray(format="rgb24")
            except av.FFmpegError as e:
                raise ValueError(f"unreadable video: {path} ({type(e).__name__}); the file is truncated or corrupt: "
                                 "record it again") from e

        yield frames()


def stream_info(path: str | os.PathLike) -> dict[str, float]:
    """``fps`` and ``frames`` (the count the container declares) of a video, from its header and first
    packets. The rate is the one its frames step at (the median duration of the first 32 packets), not
    the average over the file, which a timeline that drifts would bend."""
    with _open(path) as source:
        video = source.streams.video[0]
        durations = [p.duration for p in itertools.islice(source.demux(video), 32) if p.duration]
        rate = 1 / float(np.median(durations) * video.time_base) if durations else float(video.average_rate or 0)
        return {"fps": rate, "frames": int(video.frames)}


def frame_times(path: str | os.PathLike) -> np.ndarray:
    """Every frame's presentation time in seconds, in presentation order, read from the container's
    packets without decoding (cheap: what LeRobot's reader will see each frame's timestamp as)."""
    with _open(path) as source:
        video = source.streams.video[0]
        ticks = sorted(p.pts for p in source.demux(video) if p.pts is not None)
        return np.array([float(t * video.time_base) for t in ticks], dtype=np.float64)


def _resize_nearest(image: np.ndarray, height: int, width: int) -> np.ndarray:
    if image.shape[:2] == (height, width):
        return image
    rows = np.arange(height) * image.shape[0] // height
    cols = np.arange(width) * image.shape[1] // width
    return image[rows[:, None], cols[None, :]]


def _resize_to_height(image: np.ndarray, height: int) -> np.ndarray:
    width = max(1, round(image.shape[1] * height / image.shape[0]))
    return _resize_nearest(image, height, width)


def tile(images: Sequence[np.ndarray]) -> np.ndarray:
    """Images side by side along the width.

    Every image is resized (nearest neighbour, aspect ratio kept) to the height of the first;
    all must be ``(H, W, C)`` with the same C and dtype.
    """
    if not images:
        raise ValueError("tile needs at least one image")
    arrays = [np.asarray(im) for im in images]
    first = arrays[0]
    for i, im in enumerate(arrays):
        if im.ndim != 3 or 0 in im.shape or im.shape[2] != first.shape[2] or im.dtype != first.dtype:
            raise ValueError(f"image {i}: {im.shape} {im.dtype} does not match image 0: {first.shape} {first.dtype}")
    return np.concatenate([_resize_to_height(im, first.shape[0]) for im in arrays], axis=1)


def _letterbox(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` scaled to fit ``(height, width)`` with its aspect ratio kept, centred on black."""
    scale = min(height / image.shape[0], width / image.shape[1])
    h = min(height, max(1, round(image.shape[0] * scale)))
    w = min(width, max(1, round(image.shape[1] * scale)))
    out = np.zeros((height, width, image.shape[2]), dtype=image.dtype)
    top, left = (height - h) // 2, (width - w) // 2
    out[top : top + h, left : left + w] = _resize_nearest(image, h, w)
    return out


def future_panel(observed: np.ndarray, predicted: np.ndarray | None, offset: int) -> np.ndarray:
    """One ``(H, 2W, 3)`` frame: ``observed`` on the left, the predicted frame on the right.

    The right half is ``predicted[min(offset, T - 1)]`` (so a chunk shorter than the rollout
    holds its last frame) scaled to the observed height; a different aspect ratio is
    letterboxed, never stretched. With ``predicted=None`` it is black, so a video that mixes
    steps with and without a prediction keeps one frame size.
    """
    observed = _check_frame(observed, 0, None)
    h, w = observed.shape[:2]
    if predicted is None:
        return np.concatenate([observed, np.zeros_like(observed)], axis=1)
    predicted = np.asarray(predicted)
    if predicted.ndim != 4 or predicted.shape[0] == 0:
        raise ValueError(f"predicted must be (T, H, W, 3) with T >= 1, got shape {predicted.shape}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    index = min(offset, predicted.shape[0] - 1)
    frame = _check_frame(predicted[index], index, None)
    return np.concatenate([observed, _letterbox(frame, h, w)], axis=1)


class EpisodeVideo:
    """Frames of one episode, collected with :meth:`add` and encoded with :meth:`save`.

    With ``max_frames`` set, recording stops at that many frames: later frames are not kept,
    a warning is logged once and ``truncated`` becomes True (a long episode must not run the
    evaluation out of memory, nor be killed for the sake of its video).
    """

    def __init__(self, max_frames: int | None = None) -> None:
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames must be >= 1 or None, got {max_frames}")
        self.max_frames = max_frames
        self.frames: list[np.ndarray] = []
        self.dropped = 0

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def __len__(self) -> int:
        return len(self.frames)

    def add(self, frame: np.ndarray) -> None:
        """Keep a copy of ``frame`` (renderers often reuse their output buffer)."""
        shape = self.frames[0].shape if self.frames else None
        frame = _check_frame(frame, len(self.frames), shape)
        if self.max_frames is not None and len(self.frames) >= self.max_frames:
            if not self.dropped:
                log.warning("episode video reached max_frames=%d; recording stopped", self.max_frames)
            self.dropped += 1
            return
        self.frames.append(frame.copy())

    def save(self, path: str | os.PathLike, fps: float = 20) -> Path:
        return write_mp4(path, self.frames, fps=fps)


def imagination_strip(video: np.ndarray, frame_stride: int, columns: int = 6) -> np.ndarray:
    """Real vs imagined frames from a rollout video recorded with its predicted future beside it
    (:func:`future_panel`, left half real, right half imagined): ``(2H, columns * W, 3)``, the top
    row what the env rendered at step ``i + frame_stride``, the bottom row what the model imagined
    for that step at step ``i`` (a replan step: the panel then shows the chunk's frame 1, which is
    ``frame_stride`` steps ahead). ``i`` runs over multiples of ``frame_stride`` spread over the episode,
    so the replans must fall on them (``replan_steps`` a multiple of ``frame_stride``)."""
    video = np.asarray(video)
    if video.ndim != 4 or video.shape[2] % 2:
        raise ValueError(f"video must be (T, H, 2W, 3) with the prediction on the right, got shape {video.shape}")
    starts = np.arange(0, len(video) - frame_stride, frame_stride)
    if not len(starts):
        raise ValueError(f"the video has {len(video)} frames: too short for one frame {frame_stride} steps ahead")
    picks = starts[np.linspace(0, len(starts) - 1, min(columns, len(starts))).round().astype(int)]
    half = video.shape[2] // 2
    real = np.concatenate([video[i + frame_stride, :, :half] for i in picks], axis=1)
    imagined = np.concatenate([video[i, :, half:] for i in picks], axis=1)
    return np.concatenate([real, imagined], axis=0)
