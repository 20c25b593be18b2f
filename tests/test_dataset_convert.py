"""python -m training.datasets convert: a LeRobot v2.1 dataset (per-episode parquet and mp4, episodes.jsonl,
tasks.jsonl, episodes_stats.jsonl), built here as LeRobot 2.1 lays it out, becomes a v3.0 dataset that reads,
checks and trains; a broken one is one error naming the episode and the field, with nothing left behind. Its
frames' orientation is stated (--frames), recorded, and read upright; unstated, it is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.data import DatasetError, LeRobotDataset
from training.data.lerobot.convert import convert
from training.datasets import check
from wam_gym.utils.video import read_mp4, write_mp4

FPS, CAMERAS, LENGTHS = 10, ("top", "wrist"), (5, 7, 4)
TASKS = ("stack the cups", "open the lid")
V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def _frame(camera: str, ep: int, t: int) -> np.ndarray:
    y, x = np.mgrid[0:16, 0:16]
    return np.clip(np.stack([x * 12 + 5 * t, y * 12 + 40 * ep, np.full_like(x, 60 * (camera == "wrist") + 9 * t)], -1),
                   0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def v21(tmp_path_factory) -> tuple[Path, dict]:
    """A v2.1 dataset of 3 episodes, 2 cameras; returns it and what it holds."""
    root = tmp_path_factory.mktemp("v21") / "ds"
    return root, write_v21(root)


def write_v21(root: Path) -> dict:
    """Write a v2.1 dataset of 3 episodes, 2 cameras at ``root``, as LeRobot 2.1 lays it out; returns what it holds."""
    rng = np.random.default_rng(3)
    held = {"state": [], "action": [], "frames": []}
    features = {
        "observation.state": {"dtype": "float32", "shape": [6], "names": [f"joint_{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": [6], "names": [f"joint_{i}" for i in range(6)]},
        "observation.effort": {"dtype": "float32", "shape": [6], "names": None},  # not carried over
        **{f"observation.images.{c}": {"dtype": "video", "shape": [16, 16, 3], "names": ["height", "width", "channels"],
                                       "info": {"video.fps": FPS}} for c in CAMERAS},
        **{k: {"dtype": "int64", "shape": [1], "names": None} for k in ("frame_index", "episode_index", "index",
                                                                           "task_index")},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    }
    start, episodes, stats = 0, [], []
    for ep, n in enumerate(LENGTHS):
        state, action = rng.normal(size=(n, 6)).astype(np.float32), rng.uniform(-1, 1, (n, 6)).astype(np.float32)
        frames = {c: np.stack([_frame(c, ep, t) for t in range(n)]) for c in CAMERAS}
        table = pa.table({
            "observation.state": pa.array(list(state), pa.list_(pa.float32(), 6)),
            "action": pa.array(list(action), pa.list_(pa.float32(), 6)),
            "observation.effort": pa.array(list(np.zeros((n, 6), np.float32)), pa.list_(pa.float32(), 6)),
            "timestamp": pa.array(np.arange(n, dtype=np.float32) / FPS),
            "frame_index": pa.array(np.arange(n)), "episode_index": pa.array(np.full(n, ep)),
            "index": pa.array(start + np.arange(n)), "task_index": pa.array(np.full(n, ep % 2)),
        })
        path = root / V21_DATA.format(episode_chunk=0, episode_index=ep)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        for c in CAMERAS:
            write_mp4(root / V21_VIDEO.format(episode_chunk=0, video_key=f"observation.images.{c}", episode_index=ep),
                      frames[c], fps=FPS)
        episodes.append({"episode_index": ep, "tasks": [TASKS[ep % 2]], "length": n})
        stats.append({"episode_index": ep, "stats": {"action": {"mean": action.mean(0).tolist()}}})
        held["state"].append(state), held["action"].append(action), held["frames"].append(frames)
        start += n
    (root / "meta").mkdir()
    (root / "meta/info.json").write_text(json.dumps({
        "codebase_version": "v2.1", "robot_type": "so100", "total_episodes": 3, "total_frames": start,
        "total_tasks": 2, "chunks_size": 1000, "fps": FPS, "splits": {"train": "0:3"}, "data_path": V21_DATA,
        "video_path": V21_VIDEO, "features": features}))
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (root / "meta/tasks.jsonl").write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n"
                                                   for i, t in enumerate(TASKS)))
    (root / "meta/episodes_stats.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stats))
    return held


@pytest.fixture
def broken(v21, tmp_path) -> Path:
    return Path(shutil.copytree(v21[0], tmp_path / "v21"))


def test_v21_becomes_v30_with_the_same_values(v21, tmp_path, train_two_steps):
    """Declared mirrored (as LIBERO datasets from openpi's converter are): the pixels are kept, the record says
    mirrored, and the reader hands out the source's frames mirrored back, upright."""
    src, held = v21
    summary = convert(src, tmp_path / "v30", orientation="mirrored", episodes_per_file=2)
    assert summary["episodes"] == 3 and summary["frames"] == sum(LENGTHS) and summary["cameras"] == list(CAMERAS)
    assert summary["dropped_features"] == ["observation.effort"]
    assert summary["orientations"] == {"top": "mirrored", "wrist": "mirrored"}
    ds = LeRobotDataset(tmp_path / "v30")
    assert ds.num_episodes == 3 and ds.fps == FPS and ds.cameras == CAMERAS and ds.tasks == list(TASKS)
    for ep in range(3):
        table = ds.episode_table(ep)
        np.testing.assert_array_equal(table["state"], held["state"][ep])  # bit-exact
        np.testing.assert_array_equal(table["action"], held["action"][ep])
        assert ds.task_of(ep) == TASKS[ep % 2]
        for c in CAMERAS:  # the source's decoded frames, encoded once more: close to them (H.264 at 16x16)
            key = f"observation.images.{c}"
            source = read_mp4(src / V21_VIDEO.format(episode_chunk=0, video_key=key, episode_index=ep))
            diff = np.abs(ds.stored_frames(ep, c).astype(int) - source.astype(int))
            assert diff.mean() < 6 and len(source) == LENGTHS[ep], (ep, c, diff.mean())
            upright = np.abs(ds.episode_frames(ep, c).astype(int) - source[:, :, ::-1].astype(int))
            assert upright.mean() < 6, (ep, c, upright.mean())
    info = json.loads((tmp_path / "v30/meta/info.json").read_text())
    assert info["features"]["observation.state"]["names"] == [f"joint_{i}" for i in range(6)]
    assert info["robot_type"] == "so100"
    assert info["features"]["observation.images.top"]["info"]["orientation"] == "mirrored"
    assert check(tmp_path / "v30")[2] == "stats: 9 features, 10 statistics each, present and finite"
    assert (train_two_steps(tmp_path / "v30", "top") / "wam_config.json").is_file()


def test_a_v30_dataset_is_laid_out_again(v21, tmp_path):
    convert(v21[0], tmp_path / "two", orientation="mirrored", episodes_per_file=2)
    convert(tmp_path / "two", tmp_path / "one", episodes_per_file=50)  # it records its orientation: no flag needed
    assert len(list((tmp_path / "one/data").rglob("*.parquet"))) == 1
    assert len(list((tmp_path / "two/data").rglob("*.parquet"))) == 2
    a, b = LeRobotDataset(tmp_path / "two"), LeRobotDataset(tmp_path / "one")
    np.testing.assert_array_equal(a.episode_table(2)["action"], b.episode_table(2)["action"])
    assert b.orientation("top") == b.orientation("wrist") == "mirrored"
    with pytest.raises(DatasetError, match=r"two: --frames upright but its meta/info.json records \{'top': 'mirrored', "
                                           r"'wrist': 'mirrored'\}: drop --frames to keep what the dataset says"):
        convert(tmp_path / "two", tmp_path / "three", orientation="upright")
    assert not (tmp_path / "three").exists()


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _edit_table(path: Path, edit) -> None:
    pq.write_table(edit(pq.read_table(path)), path)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda r: (r / V21_VIDEO.format(episode_chunk=0, video_key="observation.images.wrist", episode_index=1)).unlink(),
     r"episode 1: observation.images.wrist's video videos/chunk-000/observation.images.wrist/episode_000001.mp4 is "
     r"missing"),
    (lambda r: _edit_table(r / V21_DATA.format(episode_chunk=0, episode_index=2),
                           lambda t: t.set_column(t.column_names.index("timestamp"), "timestamp",
                                                  pa.array(np.arange(4, dtype=np.float32) / 20))),
     r"episode 2: frame 1 has timestamp 0.050000 s, frame_index / fps = 0.100000 s at fps=10 \(LeRobot's tolerance"),
    (lambda r: (r / "meta/episodes_stats.jsonl").write_text(json.dumps({"episode_index": 0, "stats": {"action": {
        "std": [float("nan")] * 6}}}) + "\n"),
     r"episode 0: meta/episodes_stats.jsonl action std is not finite"),
    (lambda r: _edit_table(r / V21_DATA.format(episode_chunk=0, episode_index=1), lambda t: t.drop_columns(["action"])),
     r"episode 1: the data file lacks 'action'"),
    (lambda r: _edit_table(r / V21_DATA.format(episode_chunk=0, episode_index=1), lambda t: t.set_column(
        t.column_names.index("action"), "action", pa.array([[np.nan] * 6] * 7, pa.list_(pa.float32(), 6)))),
     r"episode 1 frame 0: action is not finite \(\[nan, .*7 such frames in all\); training would learn from it: fix or "
     r"drop it where the dataset was made"),
    (lambda r: (r / "meta/tasks.jsonl").write_text('{"task_index": 0, "task": "stack the cups"}\n'
                                                   '{"task_index": 1, "task": " "}\n'),
     r"meta/tasks.jsonl: task_index 1 is ' ', not an instruction: every task must be a non-empty string"),
    (lambda r: write_mp4(r / V21_VIDEO.format(episode_chunk=0, video_key="observation.images.top", episode_index=2),
                         np.stack([_frame("top", 2, t) for t in range(6)]), fps=FPS),
     r"episode 2: observation.images.top has 6 frames, the episode 4 \(its data file's rows and meta/episodes.jsonl\)"),
    (lambda r: _edit_json(r / "meta/info.json", lambda i: i["features"]["observation.images.top"]["info"].update(
        {"video.fps": 30})),
     r"meta/info.json has fps=10 but features\['observation.images.top'\].info\['video.fps'\]=30"),
    (lambda r: _edit_json(r / "meta/info.json", lambda i: i.update(data_path="../../{episode_index}.parquet")),
     r"meta/info.json's data_path '../../{episode_index}.parquet' names '../../0.parquet', which is outside the dataset"),
    (lambda r: _edit_json(r / "meta/info.json", lambda i: i.update(video_path="/etc/{video_key}-{episode_index}.mp4")),
     r"meta/info.json's video_path '/etc/{video_key}-{episode_index}.mp4' names '/etc/observation.images.top-0.mp4', "
     r"which is outside the dataset"),
], ids=["missing-video", "timestamps", "stats-nan", "missing-action", "action-nan", "empty-task", "video-longer",
        "video-fps", "data-path-outside", "video-path-absolute"])
def test_a_broken_dataset_names_the_episode_and_field_and_leaves_nothing(broken, tmp_path, damage, message):
    damage(broken)
    with pytest.raises(DatasetError, match=message):
        convert(broken, tmp_path / "out", orientation="upright")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["v21"]  # no staging left


def test_cli_convert_and_refusals(v21, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "training.datasets", "convert", str(v21[0]), *args],
                              capture_output=True, text=True, timeout=300)

    unstated = cli(str(tmp_path / "out"))  # a dataset from elsewhere that does not say how its frames are turned
    assert unstated.returncode == 1 and unstated.stderr.count("\n") == 1, unstated.stderr
    assert unstated.stderr.startswith(f"error: {v21[0]}: meta/info.json does not say how observation.images.top's "
                                      "frames are turned")
    assert unstated.stderr.endswith("state how they are with --frames upright|mirrored|upside_down|rotated_180\n")
    assert not (tmp_path / "out").exists()
    run = cli(str(tmp_path / "out"), "--frames", "upright")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["frames"] == sum(LENGTHS)
    again = cli(str(tmp_path / "out"), "--frames", "upright")
    assert again.returncode == 1 and again.stderr.endswith("and nothing is written over it: write to a new path, or pass "
                                                           "--overwrite to replace it\n"), again.stderr


def test_the_destination_follows_the_one_rule_of_every_writer(v21, tmp_path):
    """An empty directory is written; one holding anything is refused before any work unless --overwrite, which
    replaces it only once the new dataset is complete (so a dataset may be converted into itself)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert convert(v21[0], empty, orientation="upright")["frames"] == sum(LENGTHS)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"notes already exists \(a directory holding 1 entry \(notes.txt\)\) "
                                              r"and nothing is written over it: .* pass --overwrite to replace it"):
        convert(v21[0], notes, orientation="upright")
    assert (notes / "notes.txt").read_text() == "mine"
    convert(empty, empty, overwrite=True)  # in place: read whole, then swapped in
    assert check(empty)[0].startswith(f"opened: 3 episodes, {sum(LENGTHS)} frames")
    with pytest.raises(DatasetError, match=r"lie one inside the other: convert into a directory beside the source"):
        convert(empty, tmp_path, overwrite=True)  # would delete its own source
    assert check(empty)
