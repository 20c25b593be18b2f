"""Statistics of a LeRobot v3.0 dataset (``meta/stats.json``): per feature min/max/mean/std/count
and the quantiles q01/q10/q50/q90/q99, accumulated per episode while writing and pooled, or
recomputed from the files.

Images statistics are per channel, in [0, 1], shaped ``(3, 1, 1)``; every other feature's are
per dimension. Standard deviations are population ones (``ddof=0``). As LeRobot writes them:
an integer feature's min and max stay integers; per episode the quantiles are the episode's own
(exact here: ``np.quantile``'s linear interpolation for vectors, the exact order statistics of
the 8-bit values for images; LeRobot estimates them from a histogram); pooled, mean and std are
exact and each quantile is the frame-count-weighted mean of the episodes' (LeRobot 0.4's
aggregation: a summary of quantiles cannot give the pooled data's exact ones).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot.layout import (
    COLLECT_HINT,
    INDEX_KEYS,
    QUANTILE_NAMES,
    QUANTILES,
    STATS_PATH,
    DatasetError,
)
from training.data.lerobot.reader import LeRobotDataset
from training.data.lerobot.video import decode_timed
from wam_gym.utils.publish import atomic_write_text


def vector_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """min/max/mean/std/count and the quantiles per dimension of ``(T, D)`` values (mean, std and
    quantiles computed in float64; min and max keep an integer feature's dtype)."""
    raw = np.asarray(values)
    if raw.ndim == 1:
        raw = raw[:, None]
    x = raw.astype(np.float64)
    exact = raw if np.issubdtype(raw.dtype, np.integer) else x
    return {
        "min": exact.min(axis=0),
        "max": exact.max(axis=0),
        "mean": x.mean(axis=0),
        "std": x.std(axis=0),
        "count": np.array([len(x)], dtype=np.int64),
        **dict(zip(QUANTILE_NAMES, np.quantile(x, QUANTILES, axis=0))),
    }


class ImageStats:
    """Per-channel statistics of uint8 RGB frames, accumulated exactly (a histogram of the 256 values)."""

    def __init__(self) -> None:
        self.count = 0  # frames
        self.histogram = np.zeros((3, 256), dtype=np.int64)  # per channel: how many pixels have each value

    def add(self, frame: np.ndarray) -> None:
        flat = np.asarray(frame, dtype=np.uint8).reshape(-1, 3)
        self.count += 1
        for channel in range(3):
            self.histogram[channel] += np.bincount(flat[:, channel], minlength=256)

    def result(self) -> dict[str, np.ndarray]:
        """LeRobot's image statistics: values in [0, 1], each of shape (3, 1, 1)."""
        if not self.count:
            raise ValueError("no frames")
        values = np.arange(256, dtype=np.float64)
        pixels = self.histogram.sum(axis=1)
        mean = self.histogram @ values / pixels
        var = np.maximum(self.histogram @ (values * values) / pixels - mean * mean, 0.0)
        seen = self.histogram > 0

        def shaped(v: np.ndarray) -> np.ndarray:
            return (np.asarray(v, dtype=np.float64) / 255.0).reshape(3, 1, 1)

        return {
            "min": shaped(seen.argmax(axis=1)),
            "max": shaped(255 - seen[:, ::-1].argmax(axis=1)),
            "mean": shaped(mean),
            "std": shaped(np.sqrt(var)),
            "count": np.array([self.count], dtype=np.int64),
            **{name: shaped([_histogram_quantile(h, q) for h in self.histogram])
               for name, q in zip(QUANTILE_NAMES, QUANTILES)},
        }


def _histogram_quantile(histogram: np.ndarray, q: float) -> float:
    """``np.quantile(values, q)`` (linear interpolation) of the integer values a histogram counts."""
    cumulative = np.cumsum(histogram)
    position = q * (cumulative[-1] - 1)  # of the wanted value among the sorted ones, counted from 0
    below, above = int(np.floor(position)), int(np.ceil(position))
    low, high = (int(np.searchsorted(cumulative, rank, side="right")) for rank in (below, above))
    return low + (position - below) * (high - low)


def pool_stats(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode statistics into the statistics of all their frames.

    Exact for mean and (population) std: ``var = sum_i n_i (var_i + (mean_i - mean)^2) / N``; each
    quantile is the count-weighted mean of the episodes' (as LeRobot aggregates them).
    """
    if not parts:
        raise ValueError("no statistics to pool")
    counts = np.array([int(np.asarray(p["count"]).reshape(-1)[0]) for p in parts], dtype=np.float64)
    total = counts.sum()
    shape = (-1,) + (1,) * np.asarray(parts[0]["mean"]).ndim
    w = (counts / total).reshape(shape)

    def stacked(name: str) -> np.ndarray:
        return np.stack([np.asarray(p[name]) for p in parts])

    means, stds = stacked("mean").astype(np.float64), stacked("std").astype(np.float64)
    mean = (w * means).sum(axis=0)
    var = (w * (stds**2 + (means - mean) ** 2)).sum(axis=0)
    return {
        "min": stacked("min").min(axis=0),
        "max": stacked("max").max(axis=0),
        "mean": mean,
        "std": np.sqrt(np.maximum(var, 0.0)),
        "count": np.array([int(total)], dtype=np.int64),
        **{name: (w * stacked(name).astype(np.float64)).sum(axis=0) for name in QUANTILE_NAMES if name in parts[0]},
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
        parts = _video_file_stats(ds, cam) if cam in ds.video_cameras else _image_stats(ds, cam)
        stats[ds.feature_key(cam)] = pool_stats(parts)
    atomic_write_text(ds.root / STATS_PATH, stats_to_json(stats))
    return stats


def _image_stats(ds: LeRobotDataset, camera: str) -> list[dict[str, np.ndarray]]:
    """Per-episode statistics of a camera stored as images in the data files."""
    parts = []
    for ep in range(ds.num_episodes):
        accumulator = ImageStats()
        for frame in ds.stored_frames(ep, camera):  # however turned: per-channel statistics do not depend on it
            accumulator.add(frame)
        parts.append(accumulator.result())
    return parts


def _video_file_stats(ds: LeRobotDataset, camera: str) -> list[dict[str, np.ndarray]]:
    """Per-episode image statistics of one camera, reading each video file sequentially."""
    results: dict[int, dict[str, np.ndarray]] = {}
    for path, spans in ds.video_files(camera).items():
        accumulators = {ep: ImageStats() for _, _, ep in spans}
        last = spans[-1][1]
        with decode_timed(path) as frames:
            k = 0
            for _, frame in frames:  # by decoding order, not time: statistics do not depend on the timeline
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
