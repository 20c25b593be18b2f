"""Datasets for training: LeRobot v3.0 files on disk and the clip samples a WAM trains on.

``DatasetWriter`` / ``LeRobotDataset`` / ``compute_stats`` (``training.data.lerobot``) need only
numpy, pyarrow and imageio; ``ClipDataset`` (``training.data.clips``) adds torch and is
imported on first use, so collecting demos never pays for it.
"""

from training.data.lerobot import CODEBASE_VERSION, DatasetError, DatasetWriter, LeRobotDataset, compute_stats

__all__ = ["CODEBASE_VERSION", "ClipDataset", "DatasetError", "DatasetWriter", "LeRobotDataset", "compute_stats"]


def __getattr__(name: str):
    if name == "ClipDataset":
        from training.data.clips import ClipDataset

        return ClipDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
