"""Random access into a dataset's videos: keyframes at episode starts and a short GOP vs one encode.

    python bench/dataset_access.py [--episodes 40] [--length 80] [--size 96] [--items 150]

Writes the same frames twice with DatasetWriter, side by side in one run: the layout of earlier
versions (``video_gop=None``: every episode of a file in one encode, the encoder's default of a
keyframe every 250 frames, none at episode starts) and the default (each episode its own segment,
starting on a keyframe, every ``--gops`` value). Then times, on the same random items: one frame
the way LeRobot's pyav backend reads it (in process: seek to the keyframe before its timestamp,
decode up to it, a container kept open per file), one frame through our reader
(``read_span(path, frame, 1)``: PyAV in process, opening the file each read and checking the frame's
time against frame / fps), and a whole episode the way our ClipDataset decodes it
(``LeRobotDataset.episode_frames``); prints ms per item, the ratios and the files' sizes. The
frames are a moving scene with texture (not a still image, which any encoder
compresses to nothing).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

# bench/ comes first on sys.path when run as a script, and bench/training.py would shadow the package.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from training.data import DatasetWriter, LeRobotDataset  # noqa: E402
from training.data.lerobot.video import DEFAULT_GOP, read_span  # noqa: E402


def frame(ep: int, t: int, size: int, texture: np.ndarray) -> np.ndarray:
    """A textured scene that pans with t and differs per episode."""
    shifted = np.roll(texture, (2 * t + 7 * ep, 3 * t), axis=(0, 1))[:size, :size]
    y, x = np.mgrid[0:size, 0:size]
    blob = ((x - (t * 3) % size) ** 2 + (y - size / 2) ** 2 < (size / 6) ** 2)[..., None] * np.array([200, 60, 30])
    return np.clip(shifted + blob, 0, 255).astype(np.uint8)


def write(root: Path, gop: int | None, episodes: int, length: int, size: int) -> None:
    texture = np.random.default_rng(0).integers(0, 160, (2 * size, 2 * size, 3))
    with DatasetWriter(root, 20, ("scene",), video_gop=gop) as writer:
        for ep in range(episodes):
            for t in range(length):
                writer.add_frame({"scene": frame(ep, t, size, texture)}, np.zeros(2), np.zeros(2), "pan")
            writer.save_episode()


def per_item_ms(ds: LeRobotDataset, items: list[tuple[int, int]]) -> float:
    start = time.perf_counter()
    for ep, t in items:
        path, first, _ = ds.video_span(ep, "scene")
        read_span(path, first + t, 1, float(ds.fps))
    return 1000 * (time.perf_counter() - start) / len(items)


def per_item_in_process_ms(ds: LeRobotDataset, items: list[tuple[int, int]]) -> float:
    """LeRobot's pyav path: in one process, seek to the keyframe before the item's timestamp, then
    decode up to the item."""
    import av

    start = time.perf_counter()
    containers = {}
    for ep, t in items:
        path, first, _ = ds.video_span(ep, "scene")
        container = containers.get(path) or containers.setdefault(path, av.open(str(path)))
        stream = container.streams.video[0]
        target = (first + t) / float(ds.fps)
        container.seek(int(target / stream.time_base), stream=stream, backward=True, any_frame=False)
        for decoded in container.decode(stream):
            if decoded.time >= target - 0.5 / float(ds.fps):
                decoded.to_ndarray(format="rgb24")
                break
    for container in containers.values():
        container.close()
    return 1000 * (time.perf_counter() - start) / len(items)


def per_episode_ms(ds: LeRobotDataset, episodes: list[int]) -> float:
    start = time.perf_counter()
    for ep in episodes:
        ds.episode_frames(ep, "scene")
    return 1000 * (time.perf_counter() - start) / len(episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--length", type=int, default=80)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--items", type=int, default=150)
    parser.add_argument("--gops", type=int, nargs="+", default=[2, DEFAULT_GOP], help="segment layouts to time")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    items = [(int(rng.integers(args.episodes)), int(rng.integers(args.length))) for _ in range(args.items)]
    episodes = [int(e) for e in rng.integers(args.episodes, size=max(10, args.items // 10))]
    layouts = {"one encode (before)": None, **{f"segments, gop {g}{' (default)' if g == DEFAULT_GOP else ''}": g
                                             for g in args.gops}}
    print(f"# {date.today()} {platform.machine()} {platform.processor() or ''}: {args.episodes} episodes x "
          f"{args.length} frames, {args.size}x{args.size}, {args.items} random items, {len(episodes)} random episodes")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, gop in layouts.items():
            root = Path(tmp) / str(gop)
            write(root, gop, args.episodes, args.length, args.size)
            ds = LeRobotDataset(root, cache_episodes=0)
            size_mb = sum(p.stat().st_size for p in root.rglob("*.mp4")) / 2**20
            per_item_ms(ds, items[:5])  # warm the page cache
            results[name] = (per_item_in_process_ms(ds, items), per_item_ms(ds, items), per_episode_ms(ds, episodes),
                             size_mb)
            item, ours, episode = results[name][:3]
            print(f"{name:28s} item (LeRobot's pyav) {item:6.2f} ms   item (ours) {ours:6.2f} ms   episode "
                  f"{episode:6.1f} ms   videos {size_mb:6.2f} MB")
    before = results.pop("one encode (before)")
    for name, after in results.items():
        print(f"{name}: random item (LeRobot's pyav) {before[0] / after[0]:.2f}x faster, random item (ours) "
              f"{before[1] / after[1]:.2f}x, episode {before[2] / after[2]:.2f}x, "
              f"videos {after[3] / before[3]:.2f}x the size")


if __name__ == "__main__":
    main()
