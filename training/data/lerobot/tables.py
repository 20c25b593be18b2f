"""Parquet tables of a LeRobot v3.0 dataset: atomic writes, list columns, ``meta/tasks.parquet``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.data.lerobot.layout import DatasetError
from wam_gym.utils.publish import atomic_write


def write_parquet(table: pa.Table, path: Path) -> None:
    atomic_write(path, lambda f: pq.write_table(table, f))


def fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def column_matrix(table: pa.Table, name: str) -> np.ndarray:
    """A list column (fixed or variable size, one length) as a 2-D float32 array."""
    col = table.column(name).combine_chunks()
    flat = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    return flat.reshape(len(col), -1) if len(col) else flat.reshape(0, 0)


def tasks_table(tasks: Sequence[str]) -> pa.Table:
    """tasks.parquet as pandas writes LeRobot's DataFrame: the task string is the index."""
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(list(tasks), pa.string())})
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def read_tasks(path: Path) -> list[str]:
    table = pq.read_table(path)
    names = table.column_names
    text_col = "task" if "task" in names else next((n for n in names if n != "task_index"), None)
    if text_col is None or "task_index" not in names:
        raise DatasetError(f"{path} must have columns task_index and task (has {names})")
    pairs = sorted(zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist()))
    if [i for i, _ in pairs] != list(range(len(pairs))):
        raise DatasetError(f"{path}: task_index must be 0..{len(pairs) - 1}")
    return [t for _, t in pairs]
