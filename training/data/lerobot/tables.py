"""Parquet tables of a LeRobot v3.0 dataset: atomic writes, list columns, ``meta/tasks.parquet``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training.data.lerobot.layout import DatasetError
from training.data.lerobot.validate import FIX_AT_SOURCE
from wam_gym.utils.publish import atomic_write


def write_parquet(table: pa.Table, path: Path) -> None:
    atomic_write(path, lambda f: pq.write_table(table, f))


def fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def read_table(path: Path, fix: str) -> pa.Table:
    """A parquet file of the dataset; one that is truncated or not parquet at all is a DatasetError naming it."""
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid for a damaged file, OSError for an unreadable one
        reason = str(exc).splitlines()[0].split("': ")[-1]  # pyarrow's, less the path it repeats
        raise DatasetError(f"{path} is not a readable parquet file ({reason}); the file is damaged or truncated: "
                           f"{fix}") from None


def column_matrix(table: pa.Table, name: str, where: object = "the data file") -> np.ndarray:
    """A list column (fixed or variable size, one length) or a numeric one (one value a row) as a 2-D float32
    array; a row of another length (ragged), an empty row or a column of non-numbers is a DatasetError."""
    col = table.column(name).combine_chunks()
    numeric = pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
    nested = pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type)
    if not (numeric or (nested and (pa.types.is_integer(col.type.value_type) or pa.types.is_floating(col.type.value_type)))):
        raise DatasetError(f"{where}: column {name!r} holds {col.type}, not numbers or lists of numbers; {FIX_AT_SOURCE}")
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DatasetError(f"{where}: column {name!r} row {row} is empty (null); every frame needs its {name}: "
                           f"{FIX_AT_SOURCE}")
    if numeric:
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, 1)
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    ragged = np.flatnonzero(lengths != lengths[0]) if len(lengths) else []
    if len(ragged):
        row = int(ragged[0])
        raise DatasetError(f"{where}: column {name!r} row {row} holds {lengths[row]} values, row 0 {lengths[0]}: every "
                           f"frame's {name} must have the same length ({len(ragged)} rows differ): {FIX_AT_SOURCE}")
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


def read_tasks(path: Path, fix: str) -> list[str]:
    table = read_table(path, fix)
    names = table.column_names
    text_col = "task" if "task" in names else next((n for n in names if n != "task_index"), None)
    if text_col is None or "task_index" not in names:
        raise DatasetError(f"{path} must have columns task_index and task (has {names})")
    if not pa.types.is_integer(table.column("task_index").type) or table.column("task_index").null_count:
        raise DatasetError(f"{path}: column 'task_index' holds {table.column('task_index').type}, not integers; {fix}")
    pairs = sorted(zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist()))
    if [i for i, _ in pairs] != list(range(len(pairs))):
        raise DatasetError(f"{path}: task_index must be 0..{len(pairs) - 1}")
    return [t for _, t in pairs]
