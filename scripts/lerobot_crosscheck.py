"""Check our datasets against the real LeRobot 0.4.4: its LeRobotDataset reads every item with no
timestamp error, and its frames are bit-identical to our reader's. LeRobot is not our dependency:
build it once in a venv of its own with scripts/lerobot/setup.sh DIR (about 3 minutes).

    python scripts/lerobot_crosscheck.py --lerobot DIR --work /tmp/xcheck outputs/demo/data

From the collected dataset it makes, with our tools and with LeRobot's, the four datasets users
produce (``collected``; ``relayout``, our convert at 7 episodes a file; ``from-v21``, the dataset
written as v2.1 per-episode files, then converted by our convert; ``lerobot-v21``, the same v2.1
files converted by LeRobot's own converter, which writes no quantiles; ``aggregated``, LeRobot's
aggregate_datasets joining ``collected`` and ``relayout``) and prints a table: items, LeRobot's
timestamp errors, our check, our largest frame-time error, and whether the frames are identical.
Exit 1 when any row fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from training.data.lerobot import DatasetError, ImageStats, LeRobotDataset, vector_stats  # noqa: E402
from training.data.lerobot.convert import convert  # noqa: E402
from training.data.lerobot.video import time_errors  # noqa: E402
from training.datasets import check  # noqa: E402
from wam_gym.utils.video import frame_times, write_mp4  # noqa: E402

LEROBOT = Path(__file__).resolve().parent / "lerobot"  # the venv recipe and what runs inside it


def lerobot(venv_dir: Path, *args: str) -> str:
    """Run scripts/lerobot/side.py in LeRobot's venv; its stdout."""
    env = {**os.environ, "PYTHONPATH": str(LEROBOT), "LEROBOT_VENV_DIR": str(venv_dir)}
    done = subprocess.run([str(venv_dir / "venv/bin/python"), str(LEROBOT / "side.py"), *args], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"LeRobot failed on {args}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def our_digests(root: Path) -> dict[str, list[str]]:
    """sha1 of every item's frame of every camera, as our reader decodes them (as stored, as LeRobot returns
    them), in index order."""
    ds = LeRobotDataset(root, cache_episodes=0)
    return {ds.feature_key(c): [hashlib.sha1(np.ascontiguousarray(f).tobytes()).hexdigest()
                                for ep in range(ds.num_episodes) for f in ds.stored_frames(ep, c)]
            for c in ds.video_cameras}


def largest_time_error_ms(root: Path) -> float:
    """The largest |presentation time - frame / fps| over every frame of every video file (our tools)."""
    fps = float(json.loads((root / "meta/info.json").read_text())["fps"])
    return 1e3 * max(float(np.abs(time_errors(frame_times(p), fps)).max()) for p in (root / "videos").rglob("*.mp4"))


def write_v21(src: Path, dst: Path) -> None:
    """``src`` (v3.0) laid out as LeRobot v2.1 does: a parquet and an mp4 per camera per episode, and
    meta/episodes_stats.jsonl with min/max/mean/std/count per episode (v2.1 had no quantiles)."""
    ds = LeRobotDataset(src, cache_episodes=0)
    info = {k: v for k, v in json.loads((src / "meta/info.json").read_text()).items()
            if k not in ("data_files_size_in_mb", "video_files_size_in_mb")}
    data_t, video_t = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet", \
        "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    episodes, episode_stats = [], []
    for ep in range(ds.num_episodes):
        table = ds.episode_table(ep)
        n = len(table["index"])
        columns = {"observation.state": pa.array(list(table["state"]), pa.list_(pa.float32(), table["state"].shape[1])),
                   "action": pa.array(list(table["action"]), pa.list_(pa.float32(), table["action"].shape[1])),
                   "timestamp": pa.array(np.arange(n, dtype=np.float32) / np.float32(ds.fps)),
                   **{k: pa.array(table[k].astype(np.int64)) for k in ("frame_index", "episode_index", "index", "task_index")}}
        path = dst / data_t.format(episode_chunk=0, episode_index=ep)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), path)
        stats = {key: vector_stats(table[name]) for key, name in (("observation.state", "state"), ("action", "action"))}
        stats.update({k: vector_stats(table[k].astype(np.float64)[:, None]) for k in ("timestamp", "frame_index",
                                                                                     "episode_index", "index", "task_index")})
        for c in ds.video_cameras:
            frames = ds.stored_frames(ep, c)  # as info.json (copied) says they are turned
            write_mp4(dst / video_t.format(episode_chunk=0, video_key=ds.feature_key(c), episode_index=ep), frames, fps=ds.fps)
            image = ImageStats()
            for frame in frames:
                image.add(frame)
            stats[ds.feature_key(c)] = image.result()
        v21_names = ("min", "max", "mean", "std", "count")
        episode_stats.append({"episode_index": ep, "stats": {f: {k: np.asarray(v).tolist() for k, v in st.items()
                                                                 if k in v21_names} for f, st in stats.items()}})
        episodes.append({"episode_index": ep, "tasks": [ds.task_of(ep)], "length": n})
    (dst / "meta").mkdir(parents=True)
    (dst / "meta/info.json").write_text(json.dumps({
        **info, "codebase_version": "v2.1", "data_path": data_t, "video_path": video_t, "chunks_size": 1000,
        "total_chunks": 1, "total_videos": ds.num_episodes * len(ds.video_cameras)}))
    (dst / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (dst / "meta/episodes_stats.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episode_stats))
    (dst / "meta/tasks.jsonl").write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n"
                                                  for i, t in enumerate(ds.tasks)))


def row(name: str, root: Path, venv_dir: Path) -> tuple[list[str], bool]:
    theirs = json.loads(lerobot(venv_dir, "read", str(root)))
    ours = our_digests(root)
    identical = all(theirs["digests"][k] == v for k, v in ours.items())
    try:
        warned = any(line.startswith("warning:") for line in check(root))
        checked = "sound, warns: no quantiles" if warned else "sound"
    except DatasetError as exc:
        checked = f"fails: {str(exc)[:80]}"
    error_ms = largest_time_error_ms(root)
    ok = theirs["timestamp_errors"] == 0 and identical and checked.startswith("sound") and error_ms < 0.1
    return [name, str(theirs["items"]), str(theirs["timestamp_errors"]), checked, f"{error_ms:.4f}",
            "yes" if identical else "no", "ok" if ok else "FAIL"], ok


DERIVED = ("relayout", "v21", "from-v21", "lerobot-v21", "aggregated")  # what it writes under --work


def check_args(args: argparse.Namespace) -> None:
    """The inputs, before anything is written (--work used to be deleted whatever it held)."""
    if not (args.dataset / "meta" / "info.json").is_file():
        raise ValueError(f"{args.dataset} is not a LeRobot dataset (no meta/info.json): pass one python -m "
                         "training.collect wrote")
    if not (args.lerobot / "venv" / "bin" / "python").is_file():
        raise ValueError(f"--lerobot {args.lerobot} has no venv/bin/python: build it with scripts/lerobot/setup.sh DIR")
    if args.work.exists() and not args.work.is_dir():
        raise ValueError(f"--work {args.work} is a file: pass a folder")
    foreign = sorted(p.name for p in args.work.iterdir() if p.name not in DERIVED) if args.work.is_dir() else []
    if foreign:
        raise ValueError(f"--work {args.work} holds {', '.join(foreign[:3])}, which this script did not write: pass a "
                         f"new or empty folder (it writes {', '.join(DERIVED)} there)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/lerobot_crosscheck.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="a dataset python -m training.collect wrote")
    parser.add_argument("--lerobot", type=Path, required=True, help="the DIR given to scripts/lerobot/setup.sh")
    parser.add_argument("--work", type=Path, required=True, help="a new or empty folder for the derived datasets")
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    for name in DERIVED:  # this script's own, from an earlier run: replaced
        shutil.rmtree(args.work / name, ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    made = {"collected": args.dataset.resolve()}
    convert(args.dataset, args.work / "relayout", episodes_per_file=7)
    made["relayout"] = args.work / "relayout"
    write_v21(args.dataset, args.work / "v21")
    convert(args.work / "v21", args.work / "from-v21")
    made["from-v21"] = args.work / "from-v21"
    shutil.copytree(args.work / "v21", args.work / "lerobot-v21")
    lerobot(args.lerobot, "convert-v21", str(args.work / "lerobot-v21"))
    made["lerobot-v21"] = args.work / "lerobot-v21"
    lerobot(args.lerobot, "aggregate", str(args.work / "aggregated"), str(made["collected"]), str(made["relayout"]))
    made["aggregated"] = args.work / "aggregated"
    header = ["dataset", "items", "LeRobot timestamp errors", "our check", "max |t - k/fps| ms", "frames identical", ""]
    rows, ok = [header, ["---"] * len(header)], True
    for name, root in made.items():
        cells, passed = row(name, root, args.lerobot)
        rows.append(cells)
        ok &= passed
    print("\n".join("| " + " | ".join(r) + " |" for r in rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
