"""What training trusts of a dataset, checked the same way wherever a dataset enters: the v3.0 reader
(and so ``check``, ``convert`` of a v3.0 source and training, which all open it), the v2.x source of
``convert``, and the writer. Each failure is a :class:`DatasetError` naming the place and the fix.

- **Paths stay inside the dataset**: ``info.json``'s path templates are the dataset's own words; an
  untrusted dataset naming ``../`` or an absolute path would make us read (or convert) files from
  anywhere. Every path a template yields must resolve to a file under the dataset's root.
- **State and action are finite**: a NaN trains a model to NaN, or stops training blaming the
  learning rate.
- **Every task is a non-empty string**: an empty one trains on an empty instruction.
- **Rows lie in their episode's span**: a row in another episode's span trains on the wrong
  instruction, or across two episodes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from training.data.lerobot.layout import DatasetError

FIX_AT_SOURCE = "fix or drop it where the dataset was made, then convert it again (python -m training.datasets convert)"


def episode_spans(meta: dict[str, np.ndarray], data: dict[str, np.ndarray], root: Path) -> None:
    """Each episode's rows (meta/episodes' ``dataset_from_index`` to ``dataset_to_index``) follow the one before,
    are as many as its ``length``, and say so themselves: ``episode_index`` the episode's, ``frame_index`` 0, 1, ..."""
    lo, hi, length = (meta[k].astype(np.int64) for k in ("dataset_from_index", "dataset_to_index", "length"))
    num_frames, where = len(data["episode_index"]), f"{root}: meta/episodes"
    ends = np.concatenate([[0], hi[:-1]])
    for ep in range(len(lo)):
        if lo[ep] != ends[ep] or hi[ep] - lo[ep] != length[ep] or hi[ep] > num_frames:
            after = f"episode {ep - 1}'s end ({ends[ep]})" if ep else "0"
            raise DatasetError(f"{where}: episode {ep}'s rows dataset_from_index {lo[ep]} to dataset_to_index {hi[ep]} "
                               f"are not its {length[ep]} frames starting at {after} within the {num_frames} rows of "
                               f"the data files; {FIX_AT_SOURCE}")
    if len(hi) and hi[-1] != num_frames:
        raise DatasetError(f"{where}: the episodes end at row {hi[-1]}, the data files hold {num_frames} rows; "
                           f"{FIX_AT_SOURCE}")
    owner = np.repeat(np.arange(len(lo)), length)
    frame = np.arange(num_frames) - np.repeat(lo, length)
    for column, expected in (("episode_index", owner), ("frame_index", frame)):
        bad = np.flatnonzero(data[column] != expected)
        if len(bad):
            row = int(bad[0])
            raise DatasetError(f"{root}: the data row of index {row} has {column} {int(data[column][row])}, but it "
                               f"lies in episode {int(owner[row])}'s span (meta/episodes' dataset_from_index.."
                               f"dataset_to_index), as its frame {int(frame[row])} ({len(bad)} such rows); "
                               f"{FIX_AT_SOURCE}")


def path_in(root: Path, template: str, what: str, **fields: int | str) -> Path:
    """``root / template.format(**fields)``, refused unless it lies under ``root`` (links followed: see :func:`inside`)."""
    try:
        relative = template.format(**fields)
    except (KeyError, IndexError, ValueError) as exc:  # a field this layout does not have, a bad format spec
        raise DatasetError(f"{root}: meta/info.json's {what} {template!r} does not format with {sorted(fields)} ({exc!r}); "
                           f"set it to a template such as {_EXAMPLES.get(what, _EXAMPLES['data_path'])!r}") from None
    if Path(relative).is_absolute() or os.path.normpath(relative).split(os.sep)[0] == os.pardir:
        raise DatasetError(f"{root}: meta/info.json's {what} {template!r} names {relative!r}, which is outside the "
                           "dataset; a dataset's files must lie under its root (a template such as "
                           f"{_EXAMPLES.get(what, _EXAMPLES['data_path'])!r})")
    return inside(root, root / relative)


_EXAMPLES = {"data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
             "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"}
HF_REPO_PREFIXES = ("datasets--",)  # a Hugging Face cache's folder of one dataset repository: datasets--org--name


def container(root: Path) -> Path:
    """Where a dataset's files may lie once links are followed: its root; for a snapshot in a Hugging Face cache
    (``hub/datasets--org--name/snapshots/<rev>/...``, every file a link into ``../../blobs/``) that repository's
    cache folder, ``datasets--org--name``."""
    resolved = root.resolve()
    for folder in (resolved, *resolved.parents):
        if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith(HF_REPO_PREFIXES):
            return folder.parent.parent
    return resolved


def inside(root: Path, path: Path) -> Path:
    """``path`` (under ``root``), refused if a link on its way leads out of the dataset (:func:`container`)."""
    allowed = container(root)
    if path.resolve().is_relative_to(allowed):
        return path
    step = root
    for part in path.relative_to(root).parts:  # name the link that leaves, from the root down
        step = step / part
        if step.is_symlink() and not step.resolve().is_relative_to(allowed):
            break
    raise DatasetError(f"{step} is a link to {step.resolve()}, outside the dataset ({allowed}): a dataset's files must "
                       "lie under its root (or its Hugging Face cache repository); copy the file into the dataset in "
                       "place of the link")


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
