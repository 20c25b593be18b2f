"""The layout of a LeRobot v3.0 dataset on disk (see the package doc): path templates, feature
keys, the statistics' names, and the error a reader raises for a dataset it cannot use."""

from __future__ import annotations

from envs.protocol import LEROBOT_IMAGE_PREFIX

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
INDEX_KEYS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # LeRobot's, for its QUANTILES normalization (pi0.5's default)
QUANTILE_NAMES = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)  # q01, q10, q50, q90, q99
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILE_NAMES)
DEFAULT_CHUNKS_SIZE = 1000
DEFAULT_EPISODES_PER_FILE: int | None = None  # no cap: files close by size, as LeRobot's do
DEFAULT_DATA_FILE_SIZE_IN_MB = 100  # LeRobot's defaults
DEFAULT_VIDEO_FILE_SIZE_IN_MB = 200
TIMESTAMP_TOLERANCE_S = 1e-4  # LeRobot's tolerance_s: how far a frame's time may be from frame_index / fps
REPAIR_HINT = "python -m training.datasets convert {root} {root}-exact"  # decodes front to back, writes exact times
COLLECT_HINT = "python -m training.collect --env ENV_ID --output {root} --overwrite"


class DatasetError(ValueError):
    """A dataset on disk is missing, incomplete or in a format this reader does not support."""


SINGLE_IMAGE_KEY = "observation.image"  # a lone camera, as pusht-style datasets name it; its camera is "image"


def video_key(camera: str) -> str:
    return LEROBOT_IMAGE_PREFIX + camera


def camera_of(key: str) -> str | None:
    """The camera a feature key holds (``observation.images.<camera>``, or ``image`` for
    ``observation.image``); None for any other feature."""
    if key.startswith(LEROBOT_IMAGE_PREFIX):
        return key[len(LEROBOT_IMAGE_PREFIX):]
    return "image" if key == SINGLE_IMAGE_KEY else None
