"""Frame k of every video we write is at exactly k / fps (issue 37), on the datasets users make: one
freshly collected (Meta-World at 80 fps, whose odd frame counts FFmpeg's millisecond movie timescale
rounded), laid out again by convert, written as v2.1 and converted, and joined the way LeRobot's
aggregate_datasets joins files. Every frame's presentation time is read with our own tools and held to
LeRobot's 1e-4 s. (The real LeRobot 0.4.4 reads these datasets in scripts/lerobot_crosscheck.py, outside
CI: see the docs.) A drifting dataset fails check naming file, episode and frame, the reader refuses
to return a neighbouring frame, and convert repairs it without moving a frame."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from tests.conftest import load_script
from training.collect import main as collect
from training.data import DatasetError, DatasetWriter, LeRobotDataset
from training.data.lerobot.convert import convert
from training.data.lerobot.video import time_errors
from training.datasets import check
from wam_gym.utils.video import concat_mp4, frame_times, write_mp4

REACH = "wam_gym/MetaWorld-reach-v3"
TOLERANCE_S = 1e-4  # LeRobot's


def join_as_lerobot_does(parts: list[Path], out: Path) -> Path:
    """What LeRobot's aggregate_datasets does to video files (video_utils.concatenate_video_files, read not
    copied): ffmpeg's concat demuxer through PyAV, packets copied. It offsets each file by its duration."""
    listing = out.with_suffix(".ffconcat")
    listing.write_text("ffconcat version 1.0\n" + "".join(f"file '{p.resolve()}'\n" for p in parts))
    with av.open(str(listing), "r", format="concat", options={"safe": "0"}) as source, av.open(str(out), "w") as sink:
        stream = sink.add_stream_from_template(source.streams.video[0])
        stream.time_base = source.streams.video[0].time_base
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                sink.mux(packet)
    return out


def _largest_error_s(path: Path, fps: float) -> float:
    return float(np.abs(time_errors(frame_times(path), fps)).max())


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """collected, relayout, from-v21, and `aggregated`: each collected file joined after its relayout files."""
    root = tmp_path_factory.mktemp("timeline")
    collected = root / "collected"
    assert collect(["--env", REACH, "--episodes", "4", "--agent", "expert", "--output", str(collected),
                    "--image-size", "32", "--action-noise", "0.5"]) == 0
    convert(collected, root / "relayout", episodes_per_file=3)
    load_script("lerobot_crosscheck").write_v21(collected, root / "v21")
    convert(root / "v21", root / "from-v21")
    aggregated = root / "aggregated"
    for camera_dir in (collected / "videos").iterdir():
        parts = [*sorted((root / "relayout/videos" / camera_dir.name).rglob("*.mp4")), *camera_dir.rglob("*.mp4")]
        (aggregated / camera_dir.name).mkdir(parents=True)
        join_as_lerobot_does(parts, aggregated / camera_dir.name / "file-000.mp4")
    return {"collected": collected, "relayout": root / "relayout", "from-v21": root / "from-v21",
            "aggregated": aggregated}


@pytest.mark.parametrize("name", ["collected", "relayout", "from-v21", "aggregated"])
def test_every_frame_is_at_k_over_fps(datasets, name):
    files = sorted(datasets[name].rglob("*.mp4"))
    assert files
    for path in files:
        assert _largest_error_s(path, 80.0) <= TOLERANCE_S, path
    if name != "aggregated":
        assert check(datasets[name])[-1].endswith("each frame at frame / fps within 0.0001 s")


def test_the_collected_episodes_have_odd_lengths(datasets):
    """The case that drifted: at 80 fps an odd frame count lasts a half millisecond."""
    assert (LeRobotDataset(datasets["collected"]).episode_lengths % 2 == 1).any()


def drift(path: Path, from_frame: int, shift_s: float, fps: float = 80) -> None:
    """Move every frame from ``from_frame`` on earlier by ``shift_s`` (packets copied, nothing re-encoded): the
    timeline ffmpeg's concat demuxer wrote when a segment came out short."""
    tmp = path.with_name("drifted.mp4")
    with av.open(str(path)) as source, av.open(str(tmp), "w") as sink:
        video = source.streams.video[0]
        stream = sink.add_stream_from_template(video)
        stream.time_base = video.time_base
        shift = round(shift_s / video.time_base)
        first_late = from_frame * round(1 / (fps * video.time_base))
        for packet in source.demux(video):
            if packet.dts is None:
                continue
            if packet.pts >= first_late:
                packet.pts, packet.dts = packet.pts - shift, packet.dts - shift
            packet.stream = stream
            sink.mux(packet)
    tmp.replace(path)


def test_a_drifting_dataset_is_refused_and_repaired_without_moving_a_frame(tmp_path):
    """Each frame a flat grey of its own (frame i of the file: 7 i + 10), so a frame read in a neighbour's
    place shows. Episode 2 on are drifted 7.3 ms early, more than half a frame at 80 fps, as the demo's worst."""
    src = tmp_path / "drifting"
    lengths, grey = (5, 7, 9, 11), iter(range(10, 256, 7))
    with DatasetWriter(src, 80, ("corner",)) as writer:
        for length in lengths:
            for _ in range(length):
                writer.add_frame({"corner": np.full((16, 16, 3), next(grey), np.uint8)}, np.zeros(2), np.zeros(2), "hold")
            writer.save_episode()
    video, start, _ = LeRobotDataset(src).video_span(2, "corner")
    drift(video, start, 0.0073)
    assert _largest_error_s(video, 80.0) == pytest.approx(0.0073, abs=2e-4)

    with pytest.raises(DatasetError, match=rf"file-000.mp4: episode 2 frame 0 \(frame {start} of the file\) is at "
                                           r".* frames are off by more than LeRobot's 0.0001 s .* repair the dataset "
                                           rf"with: python -m training.datasets convert {src} {src}-exact"):
        check(src)
    LeRobotDataset(src).episode_frames(1, "corner")  # before the drift: read as ever
    with pytest.raises(DatasetError, match=rf"episode 2 frame 0 \(frame {start} of the file\) should be at .* its "
                                           r"timeline drifts .* repair the dataset with"):
        LeRobotDataset(src).episode_frames(2, "corner")  # never a neighbouring frame in silence

    summary = convert(src, tmp_path / "exact")
    (entry,) = summary["timeline"]["files"].values()
    assert summary["timeline"]["changed"].startswith(f"{sum(lengths[2:])} frames in 1 video file(s) were off frame / fps")
    assert entry["max_drift_ms"] == pytest.approx(7.3, abs=0.2) and entry["episodes"] == "2..3"
    check(tmp_path / "exact")
    repaired = LeRobotDataset(tmp_path / "exact")
    greys = np.concatenate([repaired.episode_frames(ep, "corner").mean(axis=(1, 2, 3)) for ep in range(len(lengths))])
    np.testing.assert_allclose(greys, 10 + 7 * np.arange(sum(lengths)), atol=3.0)  # every frame in its own place


def test_our_joins_of_our_files_stay_exact_as_lerobots_do(tmp_path):
    """B-frames make an mp4 carry an edit list, kept in the movie header's timescale: at FFmpeg's default
    of 1000 33 frames at 80 fps (412.5 ms) read as 412 ms, and every file joined after one shifted
    (LeRobot's aggregate_datasets by 0.49 ms a file). Every file we write lasts exactly frames / fps."""
    y, x = np.mgrid[0:24, 0:32]
    gradient = [np.clip(np.stack([x * 8, y * 10, np.full_like(x, 20 * i)], -1), 0, 255).astype(np.uint8) for i in range(61)]
    for fps in (80, 30, 29.97):
        parts = [write_mp4(tmp_path / f"p{i}.mp4", gradient[:n], fps=fps) for i, n in enumerate((33, 7, 61))]
        parts.append(concat_mp4(tmp_path / "joined.mp4", parts[:2], fps))
        for part, n in zip(parts, (33, 7, 61, 40)):
            with av.open(str(part)) as c:  # LeRobot's get_video_duration_in_s reads this
                stream = c.streams.video[0]
                assert float(stream.duration * stream.time_base) == pytest.approx(n / fps, abs=1e-9), (fps, part.name)
        theirs = join_as_lerobot_does(parts, tmp_path / "theirs.mp4")
        assert _largest_error_s(theirs, fps) < 1e-6, fps
