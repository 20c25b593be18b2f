"""What training trusts of a dataset, checked the same way wherever a dataset enters: the v3.0 reader
(and so ``check``, ``convert`` of a v3.0 source and training, which all open it), the v2.x source of
``convert``, and the writer. Each failure is a :class:`DatasetError` naming the place and the fix.

- **Paths stay inside the dataset**: ``info.json``'s path templates are the dataset's own words; an
  untrusted dataset naming ``../`` or an absolute path would make us read (or convert) files from
  anywhere. Every path a template yields must resolve to a file under the dataset's root.
- **State and action are finite**: a NaN trains a model to NaN, or stops training blaming the
  learning rate.
- **Every task is a non-empty string**: an empty one trains on an empty instruction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from training.data.lerobot.layout import DatasetError

FIX_AT_SOURCE = "fix or drop it where the dataset was made, then convert it again (python -m training.datasets convert)"


def path_in(root: Path, template: str, what: str, **fields: int | str) -> Path:
    """``root / template.format(**fields)``, refused unless it lies under ``root`` (symbolic links followed)."""
    relative = template.format(**fields)
    path = root / relative
    inside = Path(relative).is_absolute() is False and path.resolve().is_relative_to(root.resolve())
    if not inside:
        raise DatasetError(f"{root}: meta/info.json's {what} {template!r} names {relative!r}, which is outside the "
                           "dataset; a dataset's files must lie under its root (a template such as "
                           "'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet')")
    return path


def finite_rows(values: np.ndarray, what: str, where: str, frame_of: Callable[[int], str]) -> None:
    """Refuse the first row of ``values`` with a NaN or inf; ``frame_of(row)`` names that row's episode and frame."""
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DatasetError(f"{where}: {frame_of(row)}: {what} is not finite ({np.asarray(values[row]).tolist()}; "
                           f"{int(bad.sum())} such frames in all); training would learn from it: {FIX_AT_SOURCE}")


def tasks_named(tasks: Sequence[object], where: str) -> None:
    """Refuse a task that is not a non-empty string."""
    for index, task in enumerate(tasks):
        if not isinstance(task, str) or not task.strip():
            raise DatasetError(f"{where}: task_index {index} is {task!r}, not an instruction: every task must be a "
                               f"non-empty string (training conditions on it); {FIX_AT_SOURCE}")
