"""Statistics of a LeRobot v3.0 dataset (``meta/stats.json``): per feature min/max/mean/std/count,
accumulated per episode while writing and pooled exactly, or recomputed from the files.

Images statistics are per channel, in [0, 1], shaped ``(3, 1, 1)``; every other feature's are
per dimension. Standard deviations are population ones (``ddof=0``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot.layout import (
    COLLECT_HINT,
    INDEX_KEYS,
    STATS_PATH,
    DatasetError,
    video_key,
)
from training.data.lerobot.reader import LeRobotDataset
from training.data.lerobot.video import frames_in_order
from wam_gym.utils.publish import atomic_write_text


def vector_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """min/max/mean/std/count per dimension of ``(T, D)`` values (computed in float64)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    return {
        "min": x.min(axis=0),
        "max": x.max(axis=0),
        "mean": x.mean(axis=0),
        "std": x.std(axis=0),
        "count": np.array([len(x)], dtype=np.int64),
    }


class ImageStats:
    """Per-channel statistics of uint8 RGB frames, accumulated exactly (integer sums)."""

    def __init__(self) -> None:
        self.count = 0  # frames
        self.pixels = 0  # values per channel
        self.sum = np.zeros(3, dtype=np.int64)
        self.sumsq = np.zeros(3, dtype=np.int64)
        self.min = np.full(3, 255, dtype=np.int64)
        self.max = np.zeros(3, dtype=np.int64)

    def add(self, frame: np.ndarray) -> None:
        flat = np.asarray(frame).reshape(-1, 3).astype(np.int64)
        self.count += 1
        self.pixels += len(flat)
        self.sum += flat.sum(axis=0)
        self.sumsq += (flat * flat).sum(axis=0)
        self.min = np.minimum(self.min, flat.min(axis=0))
        self.max = np.maximum(self.max, flat.max(axis=0))

    def result(self) -> dict[str, np.ndarray]:
        """LeRobot's image statistics: values in [0, 1], each of shape (3, 1, 1)."""
        if not self.count:
            raise ValueError("no frames")
        mean = self.sum / self.pixels
        var = np.maximum(self.sumsq / self.pixels - mean * mean, 0.0)

        def shaped(v: np.ndarray) -> np.ndarray:
            return (np.asarray(v, dtype=np.float64) / 255.0).reshape(3, 1, 1)

        return {
            "min": shaped(self.min),
            "max": shaped(self.max),
            "mean": shaped(mean),
            "std": shaped(np.sqrt(var)),
            "count": np.array([self.count], dtype=np.int64),
        }


def pool_stats(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode statistics into the statistics of all their frames.

    Exact for mean and (population) std: ``var = sum_i n_i (var_i + (mean_i - mean)^2) / N``.
    """
    if not parts:
        raise ValueError("no statistics to pool")
    counts = np.array([int(np.asarray(p["count"]).reshape(-1)[0]) for p in parts], dtype=np.float64)
    total = counts.sum()
    shape = (-1,) + (1,) * np.asarray(parts[0]["mean"]).ndim
    w = (counts / total).reshape(shape)
    means = np.stack([np.asarray(p["mean"], dtype=np.float64) for p in parts])
    stds = np.stack([np.asarray(p["std"], dtype=np.float64) for p in parts])
    mean = (w * means).sum(axis=0)
    var = (w * (stds**2 + (means - mean) ** 2)).sum(axis=0)
    return {
        "min": np.min(np.stack([np.asarray(p["min"], dtype=np.float64) for p in parts]), axis=0),
        "max": np.max(np.stack([np.asarray(p["max"], dtype=np.float64) for p in parts]), axis=0),
        "mean": mean,
        "std": np.sqrt(np.maximum(var, 0.0)),
        "count": np.array([int(total)], dtype=np.int64),
    }


def table_stats(table: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of one episode's non-image features."""
    return {
        LEROBOT_STATE: vector_stats(table["state"]),
        LEROBOT_ACTION: vector_stats(table["action"]),
        **{k: vector_stats(table[k]) for k in INDEX_KEYS},
    }


def stats_to_json(stats: Mapping[str, Mapping[str, np.ndarray]]) -> str:
    out = {f: {s: np.asarray(v).tolist() for s, v in st.items()} for f, st in stats.items()}
    return json.dumps(out, indent=2) + "\n"


def compute_stats(root: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """Recompute ``meta/stats.json`` from the data and video files; returns the statistics.

    Numeric features from the parquet files; images per channel from the decoded videos
    (each video file is read once, front to back).
    """
    ds = LeRobotDataset(root, cache_episodes=0, require_stats=False)
    parts = [table_stats(ds.episode_table(ep)) for ep in range(ds.num_episodes)]
    stats = {f: pool_stats([p[f] for p in parts]) for f in parts[0]}
    for cam in ds.cameras:
        stats[video_key(cam)] = pool_stats(_video_file_stats(ds, cam))
    atomic_write_text(ds.root / STATS_PATH, stats_to_json(stats))
    return stats


def _video_file_stats(ds: LeRobotDataset, camera: str) -> list[dict[str, np.ndarray]]:
    """Per-episode image statistics of one camera, reading each video file sequentially."""
    by_file: dict[Path, list[tuple[int, int, int]]] = {}
    for ep in range(ds.num_episodes):
        path, start, length = ds.video_span(ep, camera)
        by_file.setdefault(path, []).append((start, start + length, ep))
    results: dict[int, dict[str, np.ndarray]] = {}
    for path, spans in by_file.items():
        spans.sort()
        accumulators = {ep: ImageStats() for _, _, ep in spans}
        last = spans[-1][1]
        with frames_in_order(path) as frames:
            k = 0
            for frame in frames:
                if k >= last:
                    break
                for lo, hi, ep in spans:
                    if lo <= k < hi:
                        accumulators[ep].add(np.asarray(frame, dtype=np.uint8))
                k += 1
        for lo, hi, ep in spans:
            if accumulators[ep].count != hi - lo:
                raise DatasetError(
                    f"{path} ends before episode {ep}'s frames {lo}..{hi - 1}; the video is truncated, "
                    f"re-collect the dataset with: {COLLECT_HINT.format(root=ds.root)}"
                )
            results[ep] = accumulators[ep].result()
    return [results[ep] for ep in range(ds.num_episodes)]
