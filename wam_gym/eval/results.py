"""Per-episode evaluation results that survive a killed run and make resuming exact.

Every finished episode is one small JSON file, ``<output_dir>/episodes/<slug>/<trial:05d>.json``,
written atomically (temp file in the same directory, fsync, :func:`os.replace`), so a file
on disk is either a complete record or absent. A resumed run asks :meth:`ResultStore.missing`
for the planned ``(task, trial)`` pairs without a record and runs exactly those.

Aggregates (:func:`summarize`, :func:`write_summary`, :func:`format_table`,
:func:`log_tensorboard`) are derived from the records and can be recomputed at any time.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import logging
import os
import re
import types
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from wam_gym.utils.publish import atomic_write_text
from wam_gym.utils.run_dir import DiskFullError, disk_full_reported
from wam_gym.utils.stats import mean_rate_interval, wilson

log = logging.getLogger(__name__)

EPISODES_DIR = "episodes"
# The overall row's success_rate is the mean of the per-task rates; ci95_low/high bound it (INTERVALS).
CSV_COLUMNS = ("task", "episodes", "successes", "success_rate", "ci95_low", "ci95_high", "mean_steps")
# The imagination score's columns (blank when the run did not compute it), after CSV_COLUMNS.
IMAGINATION_SCORES = ("imagine_psnr", "imagine_ssim", "copy_psnr", "copy_ssim")
IMAGINATION_CSV_COLUMNS = (*IMAGINATION_SCORES, "imagine_frames")
# What an episode cost (EpisodeRecord's fields of those names), summed per task and overall.
COST_COLUMNS = ("model_calls", "model_s", "denoise_steps", "env_s")
COST_CSV_COLUMNS = (*COST_COLUMNS, "successes_per_model_s")
# How results.json's intervals are computed (it says so, next to them).
INTERVALS = {
    "level": 0.95,
    "task": "Wilson score interval of the task's success rate (Wilson 1927)",
    "overall": "MOVER over the tasks' Wilson intervals (Zou, Huang & Zhang 2009) for the mean of the per-task rates",
}

# A "clean" id: our own namespace, a name of safe characters with no "_", an optional ":index".
_CLEAN_ID = re.compile(r"wam_gym/([A-Za-z0-9][A-Za-z0-9.-]*)(?::([0-9]+))?")
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")
OutOfSpaceError = DiskFullError  # the one disk-full error (wam_gym.utils.run_dir), by the name wam_gym.eval catches


def space_checked(path: Path) -> contextlib.AbstractContextManager[None]:
    """A full disk (ENOSPC/EDQUOT) while writing ``path`` as one DiskFullError line that says so."""
    return disk_full_reported(path, path.parent, kept="every record written before is kept",
                              fix="free space, then run again to resume")


@dataclass
class EpisodeRecord:
    """Outcome of one evaluation episode; ``video`` is a path relative to the output dir."""

    task: str
    trial: int
    seed: int
    success: bool
    steps: int
    reward: float
    init_state_id: int | None = None
    wall_time_s: float = 0.0
    attempts: int = 1
    video: str | None = None
    # The imagination score (wam_gym/eval/imagination.py): means over the episode's replans of the
    # predicted future frames' PSNR/SSIM against the frames the env then rendered, and of the
    # "copy the current frame" predictor's; None when not computed (imagine_frames 0: on, nothing reached).
    imagine_psnr: float | None = None
    imagine_ssim: float | None = None
    copy_psnr: float | None = None
    copy_ssim: float | None = None
    imagine_frames: int | None = None  # predicted frames scored in the episode
    # What the episode cost (None: not measured for this agent): model calls, the model's seconds (a batched
    # call's time shared by its requests), denoising steps, and the env's seconds (reset and steps).
    model_calls: int | None = None
    model_s: float | None = None
    denoise_steps: int | None = None
    env_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.trial)

    def to_json(self) -> str:
        data = asdict(self)
        _check_schema(data)  # a record that would not read back is refused here, naming its field
        return json.dumps(data, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> EpisodeRecord:
        """Parse a record whose every field has its declared type (ValueError naming the first that
        has not); unknown keys are ignored (written by a newer version)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"episode record must be a JSON object, got {type(data).__name__}")
        _check_schema(data)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _check_schema(data: dict[str, Any]) -> None:
    """Every field of EpisodeRecord present (or defaulted) with its declared type: a bool is a bool (not
    1, not "false", which would count as a success), an int is not a bool, a float may be an int, an
    optional field may be null."""
    for f in fields(EpisodeRecord):
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"field {f.name!r} is missing")
            continue
        value, allowed = data[f.name], _FIELD_TYPES[f.name]
        if not any(_is_a(value, kind) for kind in allowed):
            names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in allowed)
            raise ValueError(f"field {f.name!r} is {json.dumps(value, default=str)} ({type(value).__name__}), "
                             f"not {names}")


def _is_a(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _types(hint: Any) -> tuple[type, ...]:
    """``int | None`` -> (int, NoneType); ``dict[str, Any]`` -> (dict,)."""
    if get_origin(hint) in (Union, types.UnionType):
        return tuple(t for arg in get_args(hint) for t in _types(arg))
    return (get_origin(hint) or hint,)


_FIELD_TYPES = {name: _types(hint) for name, hint in get_type_hints(EpisodeRecord).items()}


def task_slug(task: str) -> str:
    """Filesystem-safe, readable directory name for a task id.

    ``"wam_gym/LIBERO-Spatial-v0:3"`` -> ``"LIBERO-Spatial-v0_3"``, ``"wam_gym/MetaWorld-reach-v3"``
    -> ``"MetaWorld-reach-v3"``. That readable form is used only when it can be inverted (the
    ``wam_gym/`` namespace and a name without ``_``); any other id is sanitized, truncated and
    suffixed with ``"__"`` plus 10 hex digits of its SHA-1. Clean slugs never contain ``"__"``,
    so the mapping is injective (up to SHA-1 collisions). On case-insensitive filesystems ids
    differing only in case would share a directory; registered ids do not.
    """
    m = _CLEAN_ID.fullmatch(task)
    if m:
        name, index = m.groups()
        return name if index is None else f"{name}_{index}"
    digest = hashlib.sha1(task.encode()).hexdigest()[:10]
    readable = _UNSAFE.sub("_", task).strip("._")[:80]
    return f"{readable}__{digest}"


class ResultStore:
    """One JSON file per finished episode under ``output_dir/episodes``."""

    def __init__(self, output_dir: str | os.PathLike, read_only: bool = False, seed: int | None = None) -> None:
        """``read_only``: another run's records (compare, EVALUATION.compare_to): bad files are skipped, not moved.
        ``seed``: the run's EVALUATION.seed; a record whose seed is not ``seed + trial`` is not that trial of the
        run (edited, or copied in from another run) and is set aside like a misplaced one."""
        self.output_dir = Path(output_dir)
        self.episodes_dir = self.output_dir / EPISODES_DIR
        self.read_only, self.seed = read_only, seed
        self.set_aside: list[str] = []  # files moved aside (corrupt, mismatched) by this store
        self.skipped: list[str] = []  # read_only: why each bad file was left out

    def episode_path(self, task: str, trial: int) -> Path:
        return self.episodes_dir / task_slug(task) / f"{trial:05d}.json"

    def write(self, record: EpisodeRecord) -> bool:
        """Store ``record``; False (file untouched) if that episode already has a valid record."""
        path = self.episode_path(record.task, record.trial)
        if path.exists() and self._load(path) is not None:
            return False
        with space_checked(path):
            atomic_write_text(path, record.to_json() + "\n")
        return True

    def records(self) -> list[EpisodeRecord]:
        """All valid records, sorted by (task, trial); corrupt files are moved aside."""
        loaded = (self._load(p) for p in self._files())
        return sorted((r for r in loaded if r is not None), key=lambda r: r.key)

    def outcomes(self) -> dict[tuple[str, int], bool]:
        """``(task, trial)`` -> success, of every valid record (what paired comparisons read)."""
        return {r.key: bool(r.success) for r in self.records()}

    def done(self) -> set[tuple[str, int]]:
        """``(task, trial)`` of every valid record (real task names, read from the files)."""
        return {r.key for r in self.records()}

    def missing(self, plan: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """Planned episodes without a record, in plan order (duplicates in ``plan`` once)."""
        done = self.done()
        out: list[tuple[str, int]] = []
        for key in plan:
            key = (key[0], int(key[1]))
            if key not in done:
                done.add(key)  # so a duplicated plan entry is returned only once
                out.append(key)
        return out

    def _files(self) -> list[Path]:
        if not self.episodes_dir.is_dir():
            return []
        # Temp files start with "." and end in ".tmp"; ".corrupt" files do not end in ".json".
        return [p for p in self.episodes_dir.glob("*/*.json") if not p.name.startswith(".")]

    def _load(self, path: Path) -> EpisodeRecord | None:
        """The record in ``path``, or None after moving it aside: an unparsable file or one whose fields do not
        have their types (``"success": "false"``) to ``*.corrupt``, a record of another episode (a copy under a
        wrong name) to ``*.mismatched``."""
        try:
            record = EpisodeRecord.from_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:  # removed between listing and reading
            return None
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            return self._set_aside(path, "corrupt", f"corrupt episode record {path} ({e})")
        expected = self.episode_path(record.task, record.trial)
        if expected != path:
            # Counted as its own episode it would also block this path forever: the episode it
            # stands in for would run, its record be refused here, and no rerun could complete.
            return self._set_aside(path, "mismatched", f"{path} holds the record of {record.task} trial "
                                   f"{record.trial}, whose file is {expected}")
        if self.seed is not None and record.seed != self.seed + record.trial:
            return self._set_aside(path, "mismatched", f"{path} ran with seed {record.seed}, not EVALUATION.seed + "
                                   f"trial = {self.seed + record.trial}: it is not trial {record.trial} of this run "
                                   "(edited, or copied in from another run)")
        return record

    def _set_aside(self, path: Path, kind: str, why: str) -> None:
        if self.read_only:
            log.warning("%s; skipped", why)
            self.skipped.append(why)
            return None
        aside = path.with_name(f"{path.name}.{kind}")
        log.warning("%s; moved to %s, its episode counts as missing and runs again", why, aside)
        os.replace(path, aside)
        self.set_aside.append(str(aside))
        return None


def summarize(records: Iterable[EpisodeRecord], plan: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """Success statistics, with intervals and cost, of the records that belong to ``plan``.

    Per task (every planned task, in plan order): episodes, successes, success_rate, its Wilson
    95% interval ``success_rate_ci95`` and mean_steps (None for a task without records yet), and
    ``cost``. Overall: episodes and successes summed, tasks (planned), ``success_rate`` the mean of
    the per-task rates of tasks with records (each task weighs the same, however many trials it
    ran), ``success_rate_ci95`` the interval of that mean (MOVER over the tasks' Wilson intervals,
    :func:`wam_gym.utils.stats.mean_rate_interval`), ``pooled_success_rate`` successes over
    episodes, and ``cost``. Records outside ``plan`` (e.g. from an earlier run with more trials)
    are ignored.

    When records carry the imagination score, each task and the overall get ``imagination``:
    imagine_psnr, imagine_ssim, copy_psnr, copy_ssim (means over the episodes with a score, None
    without one), episodes (with a score) and frames (scored, summed).
    """
    plan_keys = {(t, int(i)): None for t, i in plan}  # ordered, deduplicated
    by_key = {r.key: r for r in records if r.key in plan_keys}
    grouped: dict[str, list[EpisodeRecord]] = {t: [] for t, _ in plan_keys}
    for r in by_key.values():
        grouped[r.task].append(r)
    tasks = {t: _task_stats(rs) for t, rs in grouped.items()}
    ran = [s for s in tasks.values() if s["episodes"]]
    episodes = sum(s["episodes"] for s in tasks.values())
    successes = sum(s["successes"] for s in tasks.values())
    overall = {
        "episodes": episodes,
        "successes": successes,
        "tasks": len(tasks),
        "success_rate": sum(s["success_rate"] for s in ran) / len(ran) if ran else None,
        "success_rate_ci95": (list(mean_rate_interval([s["successes"] for s in ran], [s["episodes"] for s in ran]))
                              if ran else None),
        "pooled_success_rate": successes / episodes if episodes else None,
        "cost": _cost_stats(list(by_key.values())),
    }
    if any(r.imagine_frames is not None for r in by_key.values()):  # absent from runs that did not score
        for task, rs in grouped.items():
            tasks[task]["imagination"] = _imagination_stats(rs)
        overall["imagination"] = _imagination_stats(list(by_key.values()))
    complete = len(by_key) == len(plan_keys)
    return {"tasks": tasks, "overall": overall, "complete": complete, "planned": len(plan_keys),
            "intervals": INTERVALS}


def _imagination_stats(records: list[EpisodeRecord]) -> dict[str, Any]:
    """Means over the episodes with a score (each episode weighs the same); frames scored, summed."""
    scored = [r for r in records if r.imagine_psnr is not None]
    stats: dict[str, Any] = {
        name: (sum(getattr(r, name) for r in scored) / len(scored) if scored else None) for name in IMAGINATION_SCORES}
    stats["episodes"] = len(scored)
    stats["frames"] = sum(r.imagine_frames or 0 for r in records)
    return stats


def _task_stats(records: list[EpisodeRecord]) -> dict[str, Any]:
    n = len(records)
    successes = sum(bool(r.success) for r in records)
    return {
        "episodes": n,
        "successes": successes,
        "success_rate": successes / n if n else None,
        "success_rate_ci95": list(wilson(successes, n)) if n else None,
        "mean_steps": sum(r.steps for r in records) / n if n else None,
        "cost": _cost_stats(records),
    }


def _cost_stats(records: list[EpisodeRecord]) -> dict[str, Any]:
    """Each cost column summed over the episodes (None when no episode measured it), and
    successes per model-second: the success a unit of accelerator time buys."""
    totals: dict[str, Any] = {}
    for name in COST_COLUMNS:
        values = [getattr(r, name) for r in records if getattr(r, name) is not None]
        totals[name] = sum(values) if values else None
    model_s = totals["model_s"]
    totals["successes_per_model_s"] = sum(bool(r.success) for r in records) / model_s if model_s else None
    return totals


def write_summary(output_dir: str | os.PathLike, summary: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write ``results.json`` (summary plus ``extra``) and ``results.csv``; returns their paths."""
    extra = extra or {}
    clash = sorted(set(extra) & set(summary))
    if clash:
        raise ValueError(f"extra keys would overwrite summary keys: {clash}")
    out = Path(output_dir)
    # default=str: a non-JSON value in extra (a config node, a Path) must not lose the summary.
    text = json.dumps({**summary, **extra}, indent=2, default=str) + "\n"
    paths = {"json": out / "results.json", "csv": out / "results.csv"}
    with space_checked(paths["json"]):
        atomic_write_text(paths["json"], text)
    with space_checked(paths["csv"]):
        atomic_write_text(paths["csv"], _csv_text(summary))
    return paths


def _csv_text(summary: dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS + COST_CSV_COLUMNS + IMAGINATION_CSV_COLUMNS)
    for name, s in [*summary["tasks"].items(), ("overall", summary["overall"])]:
        low, high = s["success_rate_ci95"] or (None, None)
        writer.writerow([name, s["episodes"], s["successes"], _cell(s["success_rate"]), _cell(low), _cell(high),
                         _cell(s.get("mean_steps")), *(_cell(s["cost"][c]) for c in COST_CSV_COLUMNS),
                         *_imagination_cells(s)])
    return buf.getvalue()


def _imagination_cells(stats: dict[str, Any]) -> list[str]:
    imagination = stats.get("imagination")
    if imagination is None:
        return [""] * len(IMAGINATION_CSV_COLUMNS)
    return [*(_cell(imagination[name]) for name in IMAGINATION_SCORES), str(imagination["frames"])]


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else repr(float(value))  # repr: exact round trip through float()


def format_table(summary: dict[str, Any]) -> str:
    """Aligned text table: task | episodes | success | rate % | 95% interval, the overall row last
    (the mean of the per-task rates); with model time measured, successes per model-second; with
    the imagination score, its PSNR (dB) and SSIM, the model's then the copy predictor's."""
    named = [*summary["tasks"].items(), ("overall", summary["overall"])]
    imagination = "imagination" in summary["overall"]
    cost = summary["overall"]["cost"]["model_s"] is not None
    header = ("task", "episodes", "success", "rate %", "95% CI")
    if cost:
        header += ("model s", "succ/model-s")
    if imagination:
        header += ("imagine PSNR", "SSIM", "copy PSNR", "SSIM")
    cells = []
    for name, s in named:
        rate, ci = s["success_rate"], s["success_rate_ci95"]
        row = (name, str(s["episodes"]), str(s["successes"]), "-" if rate is None else f"{100 * rate:.1f}",
               "-" if ci is None else f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}")
        if cost:
            row += (_score_text(s["cost"]["model_s"], ".1f"), _score_text(s["cost"]["successes_per_model_s"], ".3f"))
        if imagination:
            scores = s.get("imagination") or {}
            row += tuple(_score_text(scores.get(k), ".2f" if "psnr" in k else ".3f") for k in IMAGINATION_SCORES)
        cells.append(row)
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]

    def line(c: tuple[str, ...]) -> str:
        return "  ".join([c[0].ljust(widths[0])] + [x.rjust(w) for x, w in zip(c[1:], widths[1:])])

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *map(line, cells[:-1]), rule, line(cells[-1])])


def _score_text(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def log_tensorboard(log_dir: str | os.PathLike, summary: dict[str, Any], step: int = 0) -> None:
    """Log ``eval/success_rate/<task>`` and ``eval/success_rate/overall`` scalars at ``step``, their
    intervals' ends (``eval/success_rate_ci95_low/...``, ``..._high/...``), the cost columns that were
    measured (``eval/cost/<column>/...``); with the imagination score also ``eval/<score>/<task>``
    and ``eval/<score>/overall`` for imagine_psnr, imagine_ssim, copy_psnr and copy_ssim."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise RuntimeError("TensorBoard logging needs tensorboard: pip install 'wam_gym[train]'") from e
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for name, s in [*summary["tasks"].items(), ("overall", summary["overall"])]:
            if s["success_rate"] is not None:
                writer.add_scalar(f"eval/success_rate/{name}", s["success_rate"], step)
                writer.add_scalar(f"eval/success_rate_ci95_low/{name}", s["success_rate_ci95"][0], step)
                writer.add_scalar(f"eval/success_rate_ci95_high/{name}", s["success_rate_ci95"][1], step)
            for column in COST_CSV_COLUMNS:
                if s["cost"][column] is not None:
                    writer.add_scalar(f"eval/cost/{column}/{name}", s["cost"][column], step)
            for score, value in (s.get("imagination") or {}).items():
                if score in IMAGINATION_SCORES and value is not None:
                    writer.add_scalar(f"eval/{score}/{name}", value, step)
    finally:
        writer.close()
