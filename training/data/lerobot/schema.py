"""The types of a dataset's metadata, checked where it enters: ``meta/info.json``, ``meta/stats.json``, the
episode and task tables (v3.0) and the JSON lines files (v2.x). A value of the wrong type (``"fps": "80"``,
a shape of strings, an ``episode_index`` column of floats) is one :class:`DatasetError` naming the file, the
field, what it holds and what it should hold; nothing past here sees a value of another type.

Every reader of a dataset takes its metadata from here: :func:`load_info`, :func:`load_stats`,
:func:`check_columns` (a parquet table's columns), :func:`check_rows` (JSON lines).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from training.data.lerobot.layout import DatasetError


# ----------------------------------------------------------------------------- what a value may be
def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: object) -> bool:
    return _number(value) and value > 0


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive_count(value: object) -> bool:
    return _count(value) and value > 0


def _text(value: object) -> bool:
    return isinstance(value, str)


def _shape(value: object) -> bool:
    return isinstance(value, list) and all(_positive_count(s) for s in value)


def _names(value: object) -> bool:  # LeRobot's list, {"motors": [...]}, or null
    return value is None or isinstance(value, (list, dict))


Rule = tuple[Callable[[object], bool], str]  # the test, and what it asks for in words

POSITIVE: Rule = (_positive, "a positive number")
COUNT: Rule = (_count, "a whole number >= 0")
POSITIVE_COUNT: Rule = (_positive_count, "a whole number >= 1")
TEXT: Rule = (_text, "a string")
OPTIONAL_TEXT: Rule = (lambda v: v is None or _text(v), "a string or null")
MAPPING: Rule = (lambda v: isinstance(v, dict), "an object ({...})")

INFO_FIELDS: dict[str, Rule] = {
    "codebase_version": TEXT,
    "fps": (_positive, "a positive number (frames per second, such as 20)"),
    "features": MAPPING,
    "total_episodes": COUNT,
    "total_frames": COUNT,
    "total_tasks": COUNT,
    "chunks_size": POSITIVE_COUNT,
    "data_files_size_in_mb": POSITIVE,
    "video_files_size_in_mb": POSITIVE,
    "data_path": TEXT,
    "video_path": OPTIONAL_TEXT,
    "robot_type": OPTIONAL_TEXT,
    "wam_gym": MAPPING,
}
FEATURE_FIELDS: dict[str, Rule] = {
    "dtype": TEXT,
    "shape": (_shape, "a list of whole numbers >= 1, such as [7]"),
    "names": (_names, "a list of names, an object of them or null"),
    "info": (lambda v: v is None or isinstance(v, dict), "an object ({...}) or null"),
}
FEATURE_INFO_FIELDS: dict[str, Rule] = {"video.fps": (_positive, "a positive number (frames per second)")}


def _typename(value: object) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list", dict: "an object",
            type(None): "null"}.get(type(value), type(value).__name__)


def _refuse(where: object, field: str, value: object, wanted: str, test: Callable[[object], bool] = bool) -> DatasetError:
    """The refusal of a field's value; a string holding a value of the right type (``"80"``) is shown unquoted."""
    shown = json.dumps(value)[:80] if not isinstance(value, float) or math.isfinite(value) else str(value)
    try:
        unquoted = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        unquoted = None
    fix = f"write {json.dumps(unquoted)} without quotes" if unquoted is not None and test(unquoted) else "correct it"
    return DatasetError(f"{where}: {field} is {shown} ({_typename(value)}), not {wanted}: {fix} there, or make the "
                        "dataset again")


def check_fields(values: Mapping[str, Any], rules: Mapping[str, Rule], where: object, field: str = "{}") -> None:
    """Each field of ``values`` that ``rules`` names, against its rule (absent fields are the caller's); ``field``
    formats a field's name for the message (``"features['action'].{}"``)."""
    for name, (test, wanted) in rules.items():
        if name in values and not test(values[name]):
            raise _refuse(where, field.replace("{}", name), values[name], wanted, test)


# ----------------------------------------------------------------------------- meta/info.json
def load_info(path: Path, required: Sequence[str], fix: str) -> dict[str, Any]:
    """``meta/info.json`` parsed and typed: every field the readers use, each feature's too; ``required``
    fields must be there. ``fix`` ends the message of a file that is not JSON or lacks a field."""
    try:
        info = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise DatasetError(f"{path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(info, dict):
        raise DatasetError(f"{path} holds {_typename(info)}, not an object of fields; {fix}")
    missing = [k for k in required if k not in info]
    if missing:
        raise DatasetError(f"{path} lacks {missing}; {fix}")
    check_fields(info, INFO_FIELDS, path)
    for key, feature in info.get("features", {}).items():
        if not isinstance(feature, dict):
            raise _refuse(path, f"features[{key!r}]", feature, "an object with dtype and shape")
        check_fields(feature, FEATURE_FIELDS, path, f"features[{key!r}].{{}}")
        if "dtype" not in feature:
            raise DatasetError(f"{path}: features[{key!r}] has no dtype; {fix}")
        check_fields(feature.get("info") or {}, FEATURE_INFO_FIELDS, path, f"features[{key!r}].info['{{}}']")
    suites = (info.get("wam_gym") or {}).get("suites")
    if suites is not None and not (isinstance(suites, list) and all(_text(s) for s in suites)):
        raise _refuse(path, "wam_gym.suites", suites, "a list of suite names")
    return info


# ----------------------------------------------------------------------------- meta/stats.json
def load_stats(path: Path, fix: str) -> dict[str, dict[str, np.ndarray]]:
    """``meta/stats.json``: feature -> statistic -> an array of numbers (nested lists, one shape)."""
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(raw, dict) or not all(isinstance(s, dict) for s in raw.values()):
        raise DatasetError(f"{path} is not an object of features, each an object of statistics; {fix}")
    return {feature: {name: numbers(value, path, f"{feature} {name}", fix) for name, value in stats.items()}
            for feature, stats in raw.items()}


def numbers(value: object, path: Path, field: str, fix: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError:  # ragged lists
        array = np.asarray([], dtype=object)
    if array.dtype.kind not in "iufb" or array.dtype.kind == "b":
        raise DatasetError(f"{path}: {field} is {json.dumps(value)[:80]}, not a number or a list of numbers of one "
                           f"shape; {fix}")
    return array


# ----------------------------------------------------------------------------- parquet columns
INTEGER = (pa.types.is_integer, "integers")
NUMBER = (lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "numbers")
STRINGS = (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "strings")
STRING_LISTS = (lambda t: (pa.types.is_list(t) or pa.types.is_large_list(t)) and STRINGS[0](t.value_type),
                "lists of strings")
NUMBER_LISTS = (lambda t: NUMBER[0](t) or (_is_list(t) and NUMBER[0](t.value_type)), "lists of numbers")


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def check_columns(table: pa.Table, columns: Mapping[str, tuple[Callable[[pa.DataType], bool], str]], where: object,
                  fix: str) -> None:
    """Each named column of ``table`` that is there holds values of its type, and no nulls."""
    for name, (test, wanted) in columns.items():
        if name not in table.column_names:
            continue
        column = table.column(name)
        if not test(column.type):
            raise DatasetError(f"{where}: column {name!r} holds {column.type}, not {wanted}; {fix}")
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise DatasetError(f"{where}: column {name!r} is empty (null) in row {row} ({column.null_count} such rows); "
                               f"{fix}")


# ----------------------------------------------------------------------------- JSON lines (v2.x)
def check_rows(rows: Sequence[object], rules: Mapping[str, Rule], where: object, fix: str) -> None:
    """Each row of a JSON lines file is an object holding every field of ``rules``, each of its type."""
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: line {number} holds {_typename(row)}, not an object; {fix}")
        missing = [k for k in rules if k not in row]
        if missing:
            raise DatasetError(f"{where}: line {number} lacks {missing}; {fix}")
        check_fields(row, rules, f"{where} line {number}")
