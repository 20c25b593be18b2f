"""The range of every numeric knob, declared beside its config and checked when the config is built.

A knob means one thing: a value outside its range is refused before any process starts, with a message
naming the knob, its range and what null means where it takes null (``EVALUATION.actor_stall_s=0`` is not a
second spelling of "off"). Each config lists its numeric fields once:

    RANGES = {"num_trials": Range(1, note="episodes per task"), "actor_stall_s": Range(0, open_low=True, null="off")}
    check_ranges(self, "EVALUATION", RANGES)   # in __post_init__

``tests/test_config_schema.py`` checks that every int/float field of a config with ``RANGES`` has one, and
The "Knob ranges" table of docs/reference/config.md is :func:`table`'s output (scripts/gen_docs.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The longest wait a knob takes: a longer one is a guard turned off in disguise (null says "off" where a knob has one).
DAY_S = 86400.0


@dataclass(frozen=True)
class Range:
    low: float | None = None  # smallest allowed value (None: no lower bound)
    high: float | None = None  # largest allowed value (None: no upper bound)
    open_low: bool = False  # low itself excluded (> low)
    open_high: bool = False  # high itself excluded (< high)
    integer: bool = True  # an int (False: any finite number)
    null: str | None = None  # what null means, when the knob takes null
    note: str = ""  # what the value counts, said after the range

    def describe(self) -> str:
        """E.g. ``>= 1 (episodes per task)``, ``> 0 or null (off)``, ``in (0, 0.5]``."""
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.open_low else '['}{_num(self.low)}, {_num(self.high)}{')' if self.open_high else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.open_low else '>='} {_num(self.low)}"
        elif self.high is not None:
            text = f"{'<' if self.open_high else '<='} {_num(self.high)}"
        else:
            text = "an integer" if self.integer else "a finite number"
        if self.note:
            text += f" ({self.note})"
        return text + (f" or null ({self.null})" if self.null else "")

    def holds(self, value: Any) -> bool:
        if value is None:
            return self.null is not None
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def check_ranges(config: Any, group: str, ranges: Mapping[str, Range]) -> None:
    """Refuse the first field of ``config`` outside its range, naming ``group.field``, the range and the value."""
    for name, allowed in ranges.items():
        value = getattr(config, name)
        if not allowed.holds(value):
            raise ValueError(f"{group}.{name} must be {allowed.describe()}, got {value!r}")


def table(groups: Mapping[str, Mapping[str, Range]]) -> str:
    """A Markdown table of every knob's range (docs/reference/config.md's "Knob ranges")."""
    rows = ["| knob | range |", "| --- | --- |"]
    rows += [f"| `{group}.{name}` | {allowed.describe()} |" for group, ranges in groups.items()
             for name, allowed in ranges.items()]
    return "\n".join(rows)
