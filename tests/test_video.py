import contextlib
import logging

import numpy as np
import pytest

import wam_gym.utils.video as video
from wam_gym.utils.video import EpisodeVideo, frame_times, future_panel, read_mp4, stream_info, tile, write_mp4


def _gradient(t=6, h=50, w=70) -> np.ndarray:
    """A smooth, moving colour gradient: easy for H.264, so decoded pixels stay close."""
    y, x = np.mgrid[0:h, 0:w]
    frames = [np.stack([x * 255 / w, y * 255 / h, np.full_like(x, 20 * i)], axis=-1) for i in range(t)]
    return np.clip(frames, 0, 255).astype(np.uint8)


def _leftovers(directory):
    return [p.name for p in directory.iterdir() if p.name.startswith(".") or ".tmp" in p.name]


# ---------------------------------------------------------------- write / read


@pytest.mark.parametrize("shape", [(6, 50, 70), (4, 33, 47), (3, 64, 64)])
def test_round_trip_keeps_size_and_pixels(tmp_path, shape):
    frames = _gradient(*shape)
    path = write_mp4(tmp_path / "sub" / "v.mp4", frames, fps=10)
    assert path == tmp_path / "sub" / "v.mp4"
    back = read_mp4(path)
    assert back.shape == frames.shape and back.dtype == np.uint8
    assert np.abs(back.astype(float) - frames).mean() < 8
    assert _leftovers(path.parent) == []


def test_write_accepts_an_iterable_and_overwrites(tmp_path):
    path = tmp_path / "v.mp4"
    write_mp4(path, _gradient(t=2))
    write_mp4(path, (f for f in _gradient(t=5)))
    assert read_mp4(path).shape == (5, 50, 70, 3)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "frames, message",
    [
        (np.zeros((0, 8, 8, 3), np.uint8), "no frames"),
        ([], "no frames"),
        (np.zeros((2, 8, 8, 3), np.float32), "uint8, got float32"),
        (np.zeros((8, 8, 3), np.uint8), r"\(T, H, W, 3\), got shape \(8, 8, 3\)"),
        ([np.zeros((8, 8), np.uint8)], r"frame 0: shape must be \(H, W, 3\), got \(8, 8\)"),
        ([np.zeros((8, 8, 4), np.uint8)], r"frame 0: shape must be \(H, W, 3\)"),
        ([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 10, 3), np.uint8)], r"frame 1: shape \(8, 10, 3\) differs"),
        ([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.int64)], "frame 1: dtype must be uint8, got int64"),
    ],
)
def test_write_rejects_bad_input(tmp_path, frames, message):
    path = tmp_path / "bad.mp4"
    with pytest.raises(ValueError, match=message):
        write_mp4(path, frames)
    assert not path.exists() and _leftovers(tmp_path) == []


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = write_mp4(tmp_path / "v.mp4", _gradient(t=3))
    before = path.read_bytes()
    with pytest.raises(ValueError, match="frame 2"):
        write_mp4(path, [*_gradient(t=2), np.zeros((4, 4, 3), np.uint8)])
    assert path.read_bytes() == before and _leftovers(tmp_path) == []


def test_read_errors_name_the_path(tmp_path, monkeypatch):
    missing = tmp_path / "nope.mp4"
    with pytest.raises(FileNotFoundError, match="nope.mp4"):
        read_mp4(missing)
    for name in ("text.mp4", "text.txt"):
        bogus = tmp_path / name
        bogus.write_text("not a video")
        with pytest.raises(ValueError, match=f"unreadable video: .*{name}"):
            read_mp4(bogus)
    # ffmpeg will not write a 0-frame mp4, so stand in a decoder that yields nothing.
    empty = write_mp4(tmp_path / "empty.mp4", _gradient(t=1))

    @contextlib.contextmanager
    def no_frames(path, start=0.0):
        yield iter(())

    monkeypatch.setattr(video, "decode_timed", no_frames)
    with pytest.raises(ValueError, match="video has no frames: .*empty.mp4"):
        read_mp4(empty)


# ---------------------------------------------------------------- the timeline


@pytest.mark.parametrize("fps", [20, 80, 15, 29.97])
def test_frames_are_at_k_over_fps(tmp_path, fps):
    path = write_mp4(tmp_path / "v.mp4", _gradient(t=7), fps=fps, gop=3)
    assert np.abs(frame_times(path) - np.arange(7) / fps).max() < 1e-6
    assert stream_info(path)["frames"] == 7 and abs(stream_info(path)["fps"] - fps) < 1e-3


@pytest.mark.parametrize("fps", [20, 80, 29.97])
def test_concat_keeps_every_frame_at_k_over_fps(tmp_path, fps):
    """Parts of 1 and 2 frames (no reordering delay) between longer ones (B-frames): ffmpeg's concat
    demuxer offset each part by its container's duration, a few ticks short at 80 fps, and the shift
    added up over the file (issue 37). Joined by frame number, every frame lands on k / fps, and the
    joined file's own frames and duration are exact, so joining joined files stays exact too."""
    rng = np.random.default_rng(0)
    lengths = (5, 61, 1, 33, 2, 40)
    parts = [write_mp4(tmp_path / f"p{i}.mp4", rng.integers(0, 255, (n, 24, 32, 3), dtype=np.uint8), fps=fps, gop=10)
             for i, n in enumerate(lengths)]
    joined = video.concat_mp4(tmp_path / "all.mp4", parts, fps)
    twice = video.concat_mp4(tmp_path / "twice.mp4", [joined, joined], fps)
    for path, count in ((joined, sum(lengths)), (twice, 2 * sum(lengths))):
        times = frame_times(path)
        assert len(times) == count == stream_info(path)["frames"]
        assert np.abs(times - np.arange(count) / fps).max() < 1e-6
    expected = np.concatenate([read_mp4(p) for p in parts])
    np.testing.assert_array_equal(read_mp4(joined), expected)  # no re-encoding, nothing reordered
    np.testing.assert_array_equal(read_mp4(twice), np.concatenate([expected, expected]))
    assert _leftovers(tmp_path) == []


def test_decode_timed_seeks_to_the_keyframe_before(tmp_path):
    path = write_mp4(tmp_path / "v.mp4", _gradient(t=12), fps=10, gop=4)
    with video.decode_timed(path, start=0.6) as timed:
        first, _ = next(timed)
    assert first == pytest.approx(0.4)  # the keyframe at frame 4; the caller drops what it does not want


# ---------------------------------------------------------------- tile / future_panel


def test_tile_resizes_to_the_first_height():
    a = np.full((40, 30, 3), 1, np.uint8)
    b = np.full((20, 10, 3), 2, np.uint8)  # doubled to 40x20
    c = np.full((80, 40, 3), 3, np.uint8)  # halved to 40x20
    out = tile([a, b, c])
    assert out.shape == (40, 70, 3)
    assert (out[:, :30] == 1).all() and (out[:, 30:50] == 2).all() and (out[:, 50:] == 3).all()
    checker = (np.indices((2, 2)).sum(0) % 2 * 255).astype(np.uint8)[..., None].repeat(3, -1)
    np.testing.assert_array_equal(tile([np.zeros((4, 4, 3), np.uint8), checker])[:, 4:, 0],
                                  [[0, 0, 255, 255]] * 2 + [[255, 255, 0, 0]] * 2)  # nearest: no blending
    with pytest.raises(ValueError, match="at least one"):
        tile([])
    with pytest.raises(ValueError, match="image 1"):
        tile([a, np.zeros((40, 30, 4), np.uint8)])


def test_future_panel_shapes():
    obs = np.full((48, 64, 3), 7, np.uint8)
    blank = future_panel(obs, None, offset=0)
    assert blank.shape == (48, 128, 3)
    assert (blank[:, :64] == 7).all() and (blank[:, 64:] == 0).all()

    pred = np.stack([np.full((24, 32, 3), 10 * (i + 1), np.uint8) for i in range(4)])  # same aspect, half size
    for offset, value in [(0, 10), (2, 30), (3, 40), (100, 40)]:  # past the end holds the last frame
        panel = future_panel(obs, pred, offset)
        assert panel.shape == blank.shape
        assert (panel[:, :64] == 7).all() and (panel[:, 64:] == value).all()

    square = np.full((1, 10, 10, 3), 200, np.uint8)  # other aspect: letterboxed, same size
    panel = future_panel(obs, square, 0)
    assert panel.shape == blank.shape
    right = panel[:, 64:]
    assert (right[:, 8:56] == 200).all() and (right[:, :8] == 0).all() and (right[:, 56:] == 0).all()

    with pytest.raises(ValueError, match="T >= 1"):
        future_panel(obs, pred[:0], 0)
    with pytest.raises(ValueError, match="offset"):
        future_panel(obs, pred, -1)


# ---------------------------------------------------------------- EpisodeVideo


def test_episode_video_collects_copies_and_saves(tmp_path):
    rec = EpisodeVideo()
    buf = np.zeros((16, 16, 3), np.uint8)
    for i in range(3):
        buf[:] = 80 * i  # a renderer reusing its buffer
        rec.add(buf)
    assert len(rec) == 3 and not rec.truncated
    path = rec.save(tmp_path / "ep.mp4", fps=5)
    back = read_mp4(path)
    assert back.shape == (3, 16, 16, 3)
    np.testing.assert_allclose(back.mean(axis=(1, 2, 3)), [0, 80, 160], atol=8)
    with pytest.raises(ValueError, match="differs"):
        rec.add(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="no frames"):
        EpisodeVideo().save(tmp_path / "none.mp4")


def test_episode_video_max_frames_stops_recording(caplog):
    rec = EpisodeVideo(max_frames=2)
    with caplog.at_level(logging.WARNING, logger="wam_gym.utils.video"):
        for _ in range(5):
            rec.add(np.zeros((4, 4, 3), np.uint8))
    assert len(rec) == 2 and rec.truncated and rec.dropped == 3
    assert caplog.text.count("max_frames=2") == 1
    with pytest.raises(ValueError, match="max_frames"):
        EpisodeVideo(max_frames=0)
