"""``python -m training.datasets check|info|convert``: is a LeRobot dataset sound, what is in it, and
v2.1 into v3.0.

    python -m training.datasets info outputs/demo/data     # episodes, frames, fps, cameras, tasks, stats
    python -m training.datasets check outputs/demo/data    # every validation below; exit 1 on the first failure
    python -m training.datasets convert data/pusht_v21 data/pusht --frames upright  # v2.1 -> v3.0 (or v3.0 laid out again)

``convert`` validates each episode as it goes and leaves nothing at the destination when one is
broken (training/data/lerobot/convert.py). ``--frames`` states how the source's frames are turned
(``mirrored`` for LIBERO datasets made by openpi's and LeRobot's converters); the dataset records it
and training reads the frames upright. A source that does not record it needs the flag.

``check`` opens the dataset as training does (info.json's schema and totals, episode metadata,
every data and video file present, fps agreeing with the timestamps, the video spans and each
mp4's header), then goes further: each feature's shape and dtype in the data files against
info.json, statistics present and finite for every feature (with the quantiles LeRobot's
QUANTILES normalization needs), every video frame decoded, file by file, and counted against
the episodes that span it, and each camera's orientation known. A failure is one line naming the
episode or file and the field.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from envs.orientation import ORIENTATIONS
from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training.data.lerobot import (
    INDEX_KEYS,
    QUANTILE_NAMES,
    STAT_NAMES,
    DatasetError,
    LeRobotDataset,
    provenance,
    validate,
)
from training.data.lerobot.convert import convert
from training.data.lerobot.layout import (
    COLLECT_HINT,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    REPAIR_HINT,
    TIMESTAMP_TOLERANCE_S,
)
from training.data.lerobot.tables import read_table
from training.data.lerobot.video import DEFAULT_GOP, decode_timed, off_grid, time_errors

# info.json dtype names -> the numpy kinds a data column of that dtype may hold
_KINDS = {"float32": "f", "float64": "f", "int64": "iu", "int32": "iu", "bool": "b"}


def check(root: str | Path) -> list[str]:
    """Run every validation; returns the report's lines, raises DatasetError on the first failure."""
    ds = LeRobotDataset(root, cache_episodes=0, require_stats=True)
    lines = [f"opened: {ds.num_episodes} episodes, {ds.num_frames} frames at {ds.fps:g} fps; metadata, files, "
             "timestamps, video spans and headers agree"]
    lines.append(_check_columns(ds))
    lines += _check_stats(ds)
    stored = ", ".join(f"{camera} {ds.orientation(camera)}" for camera in ds.cameras)
    lines.append(f"orientation: {stored} (as stored; training reads them upright)")
    for camera in ds.cameras:
        lines.append(_check_frames(ds, camera) if camera in ds.video_cameras else _check_images(ds, camera))
    return lines


def _check_columns(ds: LeRobotDataset) -> str:
    """Each feature of info.json in every data file, with its shape and dtype."""
    features = ds.info["features"]
    numeric = {k: f for k, f in features.items() if f.get("dtype") not in ("video", "image", "string")}
    files = sorted(ds.root.glob("data/chunk-*/file-*.parquet"))
    for path in files:
        table = read_table(validate.inside(ds.root, path), f"re-collect the dataset with: {COLLECT_HINT.format(root=ds.root)}")
        for key, feature in numeric.items():
            if key not in table.column_names:
                raise DatasetError(f"{path}: lacks the column {key!r} that info.json's features list")
            try:
                values, flat = _flat(table, key)
            except (pa.ArrowException, ValueError) as exc:  # a column of structs, of strings, of lists of lists
                raise DatasetError(f"{path}: column {key!r} holds {table.schema.field(key).type}, not the "
                                   f"{feature['dtype']} values info.json says ({exc})") from None
            width = len(flat) // max(1, len(values))
            expected = int(np.prod(feature.get("shape") or [1]))
            if len(values) and width != expected:
                raise DatasetError(f"{path}: column {key!r} holds {width} values a row, info.json's shape says "
                                   f"{feature.get('shape')}")
            kinds = _KINDS.get(feature.get("dtype"))
            if kinds and len(flat) and flat.dtype.kind not in kinds:
                raise DatasetError(f"{path}: column {key!r} is {flat.dtype}, info.json says {feature['dtype']}")
    return f"columns: {len(numeric)} features in {len(files)} data file(s) match info.json's shapes and dtypes"


def _flat(table, key: str) -> tuple[Any, np.ndarray]:
    """A column and its values in one array (a list column's rows laid end to end)."""
    values = table.column(key).combine_chunks()
    nested = pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type)
    return values, np.asarray((values.flatten() if nested else values).to_numpy(zero_copy_only=False))


def _check_stats(ds: LeRobotDataset) -> list[str]:
    """Statistics for state, action, the indices and every camera: present, finite, the right size. Missing
    quantiles are a warning, not a failure: LeRobot's own v2.1 -> v3.0 converter writes none, and only
    dataset.normalization=quantiles needs them (it then names the same fix)."""
    stats = ds.stats
    sizes = {LEROBOT_STATE: ds.episode_table(0)["state"].shape[1], LEROBOT_ACTION: ds.episode_table(0)["action"].shape[1],
             **dict.fromkeys(INDEX_KEYS, 1), **{ds.feature_key(c): 3 for c in ds.cameras}}
    without_quantiles = []
    for feature, size in sizes.items():
        if feature not in stats:
            raise DatasetError(f"{ds.root}: meta/stats.json has no statistics for {feature!r}; recompute them with: "
                               f"python -m training.collect --stats-only {ds.root}")
        for name in STAT_NAMES:
            if name not in stats[feature]:
                if name in QUANTILE_NAMES:
                    without_quantiles += [feature] if feature not in without_quantiles else []
                    continue
                raise DatasetError(f"{ds.root}: meta/stats.json lacks {feature} {name}")
            value = np.asarray(stats[feature][name], dtype=np.float64)
            if not np.isfinite(value).all():
                raise DatasetError(f"{ds.root}: meta/stats.json {feature} {name} is not finite ({value.ravel().tolist()}); "
                                   f"recompute it with: python -m training.collect --stats-only {ds.root}")
            if name != "count" and value.size != size:
                raise DatasetError(f"{ds.root}: meta/stats.json {feature} {name} has {value.size} values, the data {size}")
    lines = [f"stats: {len(sizes)} features, {len(STAT_NAMES)} statistics each, present and finite"]
    if without_quantiles:
        lines = [f"stats: {len(sizes)} features with min/max/mean/std/count, present and finite",
                 f"warning: meta/stats.json has no quantiles ({', '.join(QUANTILE_NAMES)}) for {len(without_quantiles)} "
                 f"features (LeRobot's v2.1 -> v3.0 converter writes none); dataset.normalization=quantiles needs them: "
                 f"python -m training.collect --stats-only {ds.root}"]
    return lines


def _check_frames(ds: LeRobotDataset, camera: str) -> str:
    """Decode every frame of the camera's video files, front to back: count them against the spans,
    and hold each frame's presentation time to ``frame / fps`` within LeRobot's tolerance."""
    files = ds.video_files(camera)
    shape = ds.image_shape(camera)
    decoded = 0
    for path, spans in files.items():
        times: list[float] = []
        try:
            with decode_timed(path) as frames:
                for time, frame in frames:
                    if frame.shape != shape:
                        raise DatasetError(f"{path}: frame {len(times)} is {frame.shape}, info.json says {shape}")
                    times.append(time)
        except DatasetError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoder error is a broken file
            raise DatasetError(f"{path}: frame {len(times)} does not decode ({exc})") from None
        _, needed, ep = max(spans, key=lambda span: span[1])
        if len(times) < needed:
            raise DatasetError(f"{path}: {len(times)} frames decode, episode {ep} needs frames up to {needed - 1}")
        _check_timeline(ds, path, np.array(times), spans)
        decoded += len(times)
    return (f"video {camera}: {decoded} frames in {len(files)} file(s) decode, every episode's span included, "
            f"each frame at frame / fps within {TIMESTAMP_TOLERANCE_S:g} s")


def _check_timeline(ds: LeRobotDataset, path: Path, times: np.ndarray, spans: list[tuple[int, int, int]]) -> None:
    """Every frame of a file at ``frame / fps``: one that is not names its episode, and the repair."""
    fps = float(ds.fps)
    bad = off_grid(times, fps)
    if not len(bad):
        return
    j = int(bad[0])
    ep, first = next(((e, lo) for lo, hi, e in spans if lo <= j < hi), (None, 0))
    where = f"episode {ep} frame {j - first} (frame {j} of the file)" if ep is not None else f"frame {j}"
    drift = time_errors(times, fps) * 1e3
    raise DatasetError(f"{path}: {where} is at {times[j]:.6f} s, not {j / fps:.6f} s (frame / fps): {len(bad)} of "
                       f"{len(times)} frames are off by more than LeRobot's {TIMESTAMP_TOLERANCE_S:g} s (up to "
                       f"{np.abs(drift).max():.2f} ms), so readers that seek by time get neighbouring frames; repair "
                       f"the dataset with: {REPAIR_HINT.format(root=ds.root)}")


def _check_images(ds: LeRobotDataset, camera: str) -> str:
    """Decode every image of a camera stored in the data files."""
    shape = ds.image_shape(camera)
    for ep in range(ds.num_episodes):
        try:
            frames = ds.stored_frames(ep, camera)
        except DatasetError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoder error is a broken image
            raise DatasetError(f"{ds.root}: episode {ep}'s {ds.feature_key(camera)} images do not decode ({exc})") from None
        if frames.shape[1:] != shape:
            raise DatasetError(f"{ds.root}: episode {ep}'s {ds.feature_key(camera)} images are {frames.shape[1:]}, "
                               f"info.json says {shape}")
    return f"images {camera}: {ds.num_frames} frames in the data files decode"


def info(root: str | Path) -> list[str]:
    """Episodes, frames, fps, cameras, tasks and the statistics of state and action, as a table."""
    ds = LeRobotDataset(root, cache_episodes=0, require_stats=False)
    lengths = ds.episode_lengths
    turned = provenance.recorded_orientations(ds.info, {c: ds.feature_key(c) for c in ds.cameras}, ds.root)
    lines = [f"{ds.root}", f"episodes {ds.num_episodes}, frames {ds.num_frames} (per episode {lengths.min()}-"
             f"{lengths.max()}, mean {lengths.mean():.1f}), fps {ds.fps:g}",
             "cameras " + ", ".join(f"{c} {'x'.join(map(str, ds.image_shape(c)))} {turned[c] or 'orientation unknown'}"
                                    for c in ds.cameras),
             f"tasks {len(ds.tasks)}: " + "; ".join(ds.tasks[:5]) + (" ..." if len(ds.tasks) > 5 else ""),
             f"suites {', '.join(provenance.recorded_suites(ds.info)) or 'unknown'}"]
    if not ds.stats_path.is_file():
        return [*lines, "stats: none (python -m training.collect --stats-only DIR computes them)"]
    fix = f"recompute them with: python -m training.collect --stats-only {ds.root}"
    for feature in (LEROBOT_STATE, LEROBOT_ACTION):
        if feature not in ds.stats or "mean" not in ds.stats[feature]:
            return [*lines, f"stats: meta/stats.json has no mean of {feature}; {fix}"]
    names = [n for n in ("mean", "std", "min", "max", "q01", "q99") if n in ds.stats[LEROBOT_STATE]]
    header = ("feature", *names)
    rows = []
    for feature in (LEROBOT_STATE, LEROBOT_ACTION):
        values = {n: np.asarray(ds.stats[feature][n], dtype=np.float64).ravel() for n in names}
        if any(len(v) != len(values["mean"]) for v in values.values()):
            return [*lines, f"stats: meta/stats.json's statistics of {feature} differ in size; {fix}"]
        rows += [(f"{feature}[{i}]", *(f"{values[n][i]:.4g}" for n in names)) for i in range(len(values[names[0]]))]
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    table = ["  ".join([r[0].ljust(widths[0]), *(x.rjust(w) for x, w in zip(r[1:], widths[1:]))]) for r in [header, *rows]]
    return [*lines, "", *table]


def positive(kind: type) -> Any:
    """An argparse type: a finite number of ``kind`` > 0 (a size of 0 or NaN would never, or always, close a file)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if kind is int else 'a number'}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The file-layout options of a dataset writer (python -m training.collect, convert)."""
    parser.add_argument("--data-files-size-in-mb", type=positive(float), default=DEFAULT_DATA_FILE_SIZE_IN_MB,
                        help="close a file once its data reaches this (default %(default)s, LeRobot's)")
    parser.add_argument("--video-files-size-in-mb", type=positive(float), default=DEFAULT_VIDEO_FILE_SIZE_IN_MB,
                        help="... or a camera's video reaches this (default %(default)s, LeRobot's)")
    parser.add_argument("--episodes-per-file", type=positive(int), default=None, help="... or it holds this many episodes")
    parser.add_argument("--video-gop", type=positive(int), default=DEFAULT_GOP,
                        help="frames between keyframes; every episode starts on one (default %(default)s; LeRobot's 2)")


def layout_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"data_files_size_in_mb": args.data_files_size_in_mb, "video_files_size_in_mb": args.video_files_size_in_mb,
            "episodes_per_file": args.episodes_per_file, "video_gop": args.video_gop}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.datasets", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("check", "run every validation (exit 1 on the first failure)"),
                       ("info", "episodes, frames, fps, cameras, tasks and stats")):
        commands.add_parser(name, help=text).add_argument("root", help="the dataset's directory")
    conversion = commands.add_parser("convert", help="a v2.1 dataset (or a v3.0 one) as v3.0 in a new directory")
    conversion.add_argument("src", help="the dataset to convert")
    conversion.add_argument("dst", help="a new directory (or an empty one)")
    conversion.add_argument("--overwrite", action="store_true",
                            help="replace what DST holds, once the new dataset is complete (DST may be SRC itself)")
    conversion.add_argument("--frames", choices=sorted(ORIENTATIONS), default=None,
                            help="how the source's frames are turned (mirrored: LIBERO datasets made by openpi's or "
                                 "LeRobot's converters); recorded, and training reads them upright. Needed when the "
                                 "source does not say")
    add_layout_arguments(conversion)
    args = parser.parse_args(argv)
    try:
        if args.command == "convert":
            lines = [json.dumps(convert(args.src, args.dst, args.frames, overwrite=args.overwrite, **layout_of(args)),
                                indent=2)]
        else:
            lines = check(args.root) if args.command == "check" else info(args.root)
    except (DatasetError, OSError) as exc:  # OSError: a file that cannot be read, a destination already there
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    if args.command == "check":
        print(f"ok: {args.root} is a sound LeRobot v3.0 dataset")
    return 0


if __name__ == "__main__":
    sys.exit(main())
