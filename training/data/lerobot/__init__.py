"""LeRobot v3.0 datasets: write them while collecting, read them for training.

Layout (``codebase_version`` ``"v3.0"``)::

    ROOT/meta/info.json                                   schema, fps, totals, path templates
    ROOT/meta/stats.json                                  per-feature min/max/mean/std/count, q01..q99
    ROOT/meta/tasks.parquet                               task string -> task_index
    ROOT/meta/episodes/chunk-000/file-000.parquet         one row per episode: length, tasks,
                                                          where its rows and video spans are
    ROOT/data/chunk-000/file-000.parquet                  one row per frame (state, action, indices)
    ROOT/videos/observation.images.<camera>/chunk-000/file-000.mp4
                                                          the episodes of one data file, concatenated

Read also as other writers lay them out: a camera stored as images in the data files
(``dtype: image``, encoded bytes), and a lone camera under ``observation.image`` (camera ``image``).

An episode's frames in a video file are ``[from_timestamp, to_timestamp)`` of that file; frame
``k`` of the file has presentation time ``k / fps``. Images statistics are per channel, in
[0, 1], shaped ``(3, 1, 1)``; every other feature's are per dimension. Standard deviations
are population ones (``ddof=0``).

Every file is written to a hidden temp file and renamed, so a crash leaves either the old
file or the new one. The writer closes a file after ``episodes_per_file`` episodes and then
rewrites the metadata, ``info.json`` last: what ``info.json`` describes is always complete.

Each camera's frames are stored turned as its feature's ``info`` records (``orientation``: ours
``upright``); the reader hands them out upright. ``info.json`` also names the benchmark suites the
episodes come from (see ``provenance``).

Modules: ``layout`` (paths, keys, :class:`DatasetError`), ``reader`` (:class:`LeRobotDataset`, which
composes ``episodes``, the index of episodes and rows, and ``frames``, the cameras' frame reader),
``writer`` (:class:`DatasetWriter`), ``provenance`` (orientations and suites in ``info.json``),
``stats`` (statistics, :func:`compute_stats`), ``tables`` (parquet helpers), ``video`` (mp4
streaming and span decoding). Import from the package.
"""

from training.data.lerobot.layout import (
    CODEBASE_VERSION,
    DATA_PATH,
    DEFAULT_CHUNKS_SIZE,
    DEFAULT_EPISODES_PER_FILE,
    EPISODES_PATH,
    INDEX_KEYS,
    INFO_PATH,
    QUANTILE_NAMES,
    STAT_NAMES,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    DatasetError,
    video_key,
)
from training.data.lerobot.reader import LeRobotDataset
from training.data.lerobot.stats import ImageStats, compute_stats, pool_stats, vector_stats
from training.data.lerobot.writer import DatasetWriter

__all__ = [
    "CODEBASE_VERSION",
    "DATA_PATH",
    "DEFAULT_CHUNKS_SIZE",
    "DEFAULT_EPISODES_PER_FILE",
    "EPISODES_PATH",
    "INDEX_KEYS",
    "INFO_PATH",
    "QUANTILE_NAMES",
    "STATS_PATH",
    "STAT_NAMES",
    "TASKS_PATH",
    "VIDEO_PATH",
    "DatasetError",
    "DatasetWriter",
    "ImageStats",
    "LeRobotDataset",
    "compute_stats",
    "pool_stats",
    "vector_stats",
    "video_key",
]
