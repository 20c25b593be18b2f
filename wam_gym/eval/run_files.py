"""The types of a run's JSON files, checked where they are read.

A hand-edited ``protocol.json`` (``"tasks": []``, ``"EVALUATION.seed": "0"``) used to reach
``python -m wam_gym.compare`` as it was and end in a TypeError or AttributeError deep in the
comparison. Each file's fields are declared here once (a path of keys, ``*`` for every key or item,
and the field's type); a field of another type is one ValueError naming the file, the field and the
fix. A field that is absent is left to the reader (older files lack newer fields).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from envs.kwargs import matches, type_name

Schema = Mapping[tuple[str, ...], Any]

PROTOCOL_FIELDS: Schema = {  # protocol.json (wam_gym/eval/run_protocol.py writes it)
    ("protocol",): dict,
    ("protocol", "EVALUATION.seed"): int,
    ("protocol", "EVALUATION.max_episode_steps"): int | None,
    ("protocol", "env_kwargs"): dict,
    ("protocol", "suites"): dict,
    ("protocol", "suites", "*"): dict,
    ("protocol", "tasks"): dict,
    ("protocol", "tasks", "*"): dict,
    ("protocol", "tasks", "*", "env_id"): str,
    ("protocol", "tasks", "*", "kwargs"): dict,
    ("protocol", "tasks", "*", "max_episode_steps"): int,
    ("observed",): dict,
    ("observed", "*"): dict,
    ("observed", "*", "action_space"): dict,
    ("observed", "*", "cameras"): dict,
    ("observed", "*", "state_shape"): list[int] | None,
    ("agent",): dict,
    ("resumed_despite",): list,
    ("resumed_despite", "*"): dict,
    ("resumed_despite", "*", "field"): str,
}

RESULTS_FIELDS: Schema = {  # results.json (wam_gym/eval/results.py: write_summary)
    ("complete",): bool,
    ("overall",): dict,
    ("overall", "success_rate"): float | None,
    ("overall", "success_rate_ci95"): list[float] | None,
    ("tasks",): dict,
    ("tasks", "*"): dict,
    ("tasks", "*", "episodes"): int,
    ("tasks", "*", "successes"): int,
    ("tasks", "*", "success_rate"): float | None,
    ("tasks", "*", "success_rate_ci95"): list[float] | None,
}


def check_fields(path: Path, record: Mapping[str, Any], schema: Schema, fix: str) -> None:
    """Refuse the first field of ``record`` (read from ``path``) whose value is not of its declared type."""
    for keys, expected in schema.items():
        for name, value in _values(record, keys):
            if not matches(value, expected):
                raise ValueError(f"{path}: field {name} is {json.dumps(value, default=str)[:60]} "
                                 f"({type(value).__name__}), not {type_name(expected)}: {fix}")


def _values(node: Any, keys: tuple[str, ...], name: str = "") -> Iterator[tuple[str, Any]]:
    """(the field's name, its value) for every value at ``keys`` (``*``: each key or item) that exists."""
    if not keys:
        yield name, node
        return
    key, rest = keys[0], keys[1:]
    if key == "*":
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for child, value in items:
            yield from _values(value, rest, f"{name}[{json.dumps(child)}]")
    elif isinstance(node, dict) and key in node:
        yield from _values(node[key], rest, f"{name}.{key}" if name else key)


def read_results(path: Path) -> dict[str, Any]:
    """An evaluation's results.json, its fields checked."""
    from wam_gym.utils.run_dir import read_record

    fix = "rerun the evaluation (its episodes/ are kept and resumed)"
    record = read_record(path, fix)
    check_fields(path, record, RESULTS_FIELDS, fix)
    return record
