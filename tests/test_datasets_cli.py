"""python -m training.datasets check|info: every validation on a sound dataset, and one clear error line
(the file or feature, and the fix) for each kind of damage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from training.data import DatasetError, DatasetWriter, LeRobotDataset
from training.data.lerobot import QUANTILE_NAMES
from training.data.lerobot.convert import convert
from training.datasets import check, info
from wam_gym.utils.video import read_mp4, write_mp4

CAMERAS = ("corner", "wrist")


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("datasets") / "ds"
    rng = np.random.default_rng(0)
    with DatasetWriter(root, 20, CAMERAS, episodes_per_file=2) as writer:  # 3 episodes: two data files
        for ep, length in enumerate((6, 8, 5)):
            for t in range(length):
                pixels = {c: np.full((16, 24, 3), 10 * t + 40 * ep + 100 * (c == "wrist"), np.uint8) for c in CAMERAS}
                writer.add_frame(pixels, rng.normal(size=4), rng.uniform(-1, 1, size=3), ("reach", "push")[ep % 2])
            writer.save_episode()
    return root


@pytest.fixture
def damaged(sound, tmp_path) -> Path:
    return Path(shutil.copytree(sound, tmp_path / "ds"))


def test_check_passes_a_sound_dataset_and_says_what_it_checked(sound):
    lines = check(sound)
    assert lines[0].startswith("opened: 3 episodes, 19 frames at 20 fps")
    assert lines[1] == "columns: 7 features in 2 data file(s) match info.json's shapes and dtypes"
    assert lines[2] == "stats: 9 features, 10 statistics each, present and finite"
    assert lines[3] == "orientation: corner upright, wrist upright (as stored; training reads them upright)"
    assert lines[4:] == [f"video {c}: 19 frames in 2 file(s) decode, every episode's span included, each frame at "
                         "frame / fps within 0.0001 s" for c in CAMERAS]


def test_info_prints_the_dataset_in_a_table(sound):
    lines = info(sound)
    assert lines[1] == "episodes 3, frames 19 (per episode 5-8, mean 6.3), fps 20"
    assert lines[2] == "cameras corner 16x24x3 upright, wrist 16x24x3 upright" and lines[3] == "tasks 2: reach; push"
    assert lines[4] == "suites unknown"  # written here, not by training.collect
    assert lines[6].split() == ["feature", "mean", "std", "min", "max", "q01", "q99"]
    assert [line.split()[0] for line in lines[7:]] == [f"observation.state[{i}]" for i in range(4)] + [
        f"action[{i}]" for i in range(3)]


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_non_finite_statistics_name_the_feature_and_the_fix(damaged):
    _edit_json(damaged / "meta/stats.json", lambda s: s["action"].update(std=[1.0, float("nan"), 1.0]))
    with pytest.raises(DatasetError, match=r"meta/stats.json action std is not finite .*--stats-only"):
        check(damaged)


def test_statistics_without_quantiles_pass_with_a_warning_naming_the_fix(damaged):
    """LeRobot's own v2.1 -> v3.0 converter writes min/max/mean/std/count only: such a dataset is sound
    (only dataset.normalization=quantiles needs more), so check warns and names --stats-only."""
    _edit_json(damaged / "meta/stats.json", lambda s: [st.pop(q) for st in s.values() for q in QUANTILE_NAMES])
    lines = check(damaged)
    assert lines[2] == "stats: 9 features with min/max/mean/std/count, present and finite"
    assert lines[3] == (f"warning: meta/stats.json has no quantiles (q01, q10, q50, q90, q99) for 9 features (LeRobot's "
                        f"v2.1 -> v3.0 converter writes none); dataset.normalization=quantiles needs them: "
                        f"python -m training.collect --stats-only {damaged}")


def test_a_column_of_another_dtype_names_the_file_and_the_column(damaged):
    _edit_json(damaged / "meta/info.json", lambda i: i["features"]["frame_index"].update(dtype="float32"))
    with pytest.raises(DatasetError, match=r"data/chunk-000/file-000.parquet: column 'frame_index' is int64, info.json "
                                           r"says float32"):
        check(damaged)


def test_a_video_that_decodes_short_names_the_file(damaged, monkeypatch):
    """The header can still claim every frame (a broken tail): check decodes them all and counts."""
    from training.data.lerobot.frames import FrameReader

    path = damaged / "videos/observation.images.wrist/chunk-000/file-001.mp4"
    frames = read_mp4(path)
    write_mp4(path, frames[:2], fps=20)
    # opening checks the header; here the header lies, so skip that check
    monkeypatch.setattr(FrameReader, "check_headers", lambda self, fps, fix: None)
    with pytest.raises(DatasetError, match=r"file-001.mp4: 2 frames decode, episode 2 needs frames up to 4"):
        check(damaged)


def test_cli_exit_codes_and_one_error_line(sound, damaged):
    ok = subprocess.run([sys.executable, "-m", "training.datasets", "check", str(sound)], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("is a sound LeRobot v3.0 dataset")
    (damaged / "meta/info.json").unlink()
    bad = subprocess.run([sys.executable, "-m", "training.datasets", "check", str(damaged)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
    assert "meta/info.json is missing" in bad.stderr


# ------------------------------------------------------------------ what training trusts (issue 39, class 2)
def _edit_data(path: Path, column: str, edit) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    values = edit(table.column(column).to_pylist())
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(values, table.schema.field(column).type)),
                   path)


def _nan_at(rows, row, dim):
    rows[row][dim] = float("nan")
    return rows


@pytest.mark.parametrize(("damage", "message"), [
    (lambda r: _edit_data(r / "data/chunk-000/file-001.parquet", "action", lambda rows: _nan_at(rows, 2, 1)),
     r"ds: episode 2 frame 2: action is not finite \(\[.*, nan, .*\]; 1 such frames in all\); training would learn "
     r"from it: fix or drop it where the dataset was made, then convert it again"),
    (lambda r: _edit_data(r / "data/chunk-000/file-000.parquet", "observation.state", lambda rows: _nan_at(rows, 7, 0)),
     r"ds: episode 1 frame 1: observation.state is not finite"),
    (lambda r: _edit_data(r / "meta/tasks.parquet", "task", lambda tasks: ["reach", ""]),
     r"meta/tasks.parquet: task_index 1 is '', not an instruction: every task must be a non-empty string"),
    (lambda r: _edit_data(r / "data/chunk-000/file-000.parquet", "task_index", lambda ix: [5] * len(ix)),
     r"ds: episode 0 frame 0 has task_index 5, which meta/tasks.parquet does not list \(it has 2 tasks\)"),
    (lambda r: _edit_json(r / "meta/info.json", lambda i: i.update(data_path="../elsewhere/{chunk_index}-{file_index}.parquet")),
     r"meta/info.json's data_path '../elsewhere/{chunk_index}-{file_index}.parquet' names '../elsewhere/0-0.parquet', "
     r"which is outside the dataset"),
    (lambda r: _edit_json(r / "meta/info.json", lambda i: i.update(video_path="/tmp/{video_key}/{file_index}.mp4")),
     r"meta/info.json's video_path '/tmp/{video_key}/{file_index}.mp4' names '/tmp/observation.images.corner/0.mp4', "
     r"which is outside the dataset"),
], ids=["action-nan", "state-nan", "empty-task", "unknown-task", "data-path-outside", "video-path-absolute"])
def test_what_training_trusts_is_checked_where_the_dataset_is_opened(damaged, damage, message):
    """The reader refuses, so check, convert (of a v3.0 source) and training, which all open it, refuse the same."""
    damage(damaged)
    with pytest.raises(DatasetError, match=message):
        check(damaged)
    with pytest.raises(DatasetError, match=message):
        convert(damaged, damaged.parent / "out")
    assert not (damaged.parent / "out").exists()


def test_a_symlink_out_of_the_dataset_is_refused(damaged, tmp_path):
    """A file of the dataset that is a link to elsewhere is outside it too (paths are resolved), and the message
    names the link and where it leads, not the path template."""
    outside = tmp_path / "elsewhere.parquet"
    data = damaged / "data/chunk-000/file-000.parquet"
    data.rename(outside)
    data.symlink_to(outside)
    with pytest.raises(DatasetError, match=rf"^{data} is a link to {outside}, outside the dataset \({damaged}\): .*copy "
                                           "the file into the dataset in place of the link"):
        check(damaged)


def as_hf_snapshot(dataset: Path, hub: Path, repo: str = "datasets--lerobot--demo", revision: str = "0" * 40) -> Path:
    """``dataset`` as huggingface_hub lays a download out in its cache: each file a blob named by its hash under
    ``hub/<repo>/blobs/``, and the snapshot a tree of relative links to them; returns the snapshot."""
    import hashlib
    import os

    snapshot = hub / repo / "snapshots" / revision
    for path in sorted(p for p in dataset.rglob("*") if p.is_file()):
        blob = hub / repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, blob)
        pointer = snapshot / path.relative_to(dataset)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    (hub / repo / "refs").mkdir()
    (hub / repo / "refs/main").write_text(revision)
    return snapshot


def test_a_hugging_face_cache_snapshot_reads_and_its_links_may_not_leave_its_repository(sound, tmp_path):
    """Every file of a snapshot is a link into its repository's blobs/ (a regression of round three refused them
    all); a link out of the repository, to another repository's blobs or anywhere else, is still refused."""
    snapshot = as_hf_snapshot(sound, tmp_path / "hub")
    assert all(p.is_symlink() for p in snapshot.rglob("*.parquet"))
    assert check(snapshot)[0].startswith("opened: 3 episodes, 19 frames at 20 fps")
    assert LeRobotDataset(snapshot).episode_frames(2, "wrist").shape == (5, 16, 24, 3)
    summary = convert(snapshot, tmp_path / "copy")
    assert summary["frames"] == 19 and check(tmp_path / "copy")

    other = as_hf_snapshot(sound, tmp_path / "hub", repo="datasets--someone--else")
    stats = snapshot / "meta/stats.json"
    stats.unlink()
    stats.symlink_to((other / "meta/stats.json").resolve())
    with pytest.raises(DatasetError, match=rf"^{stats} is a link to {tmp_path}/hub/datasets--someone--else/blobs/\w+, "
                                           rf"outside the dataset \({tmp_path}/hub/datasets--lerobot--demo\)"):
        check(snapshot)
    video = snapshot / "videos/observation.images.wrist/chunk-000/file-000.mp4"
    stats.unlink()
    stats.symlink_to(os.path.relpath(other / "meta/stats.json", stats.parent))  # relative, into the other repository
    video.unlink()
    video.symlink_to(tmp_path / "nowhere.mp4")
    with pytest.raises(DatasetError, match=r"is a link to .*, outside the dataset"):
        LeRobotDataset(snapshot)


# ------------------------------------------------------------------ LeRobot's aggregate_datasets of drifted datasets
def _episode_meta(root: Path, edit) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    edit(columns)
    pq.write_table(pa.table({n: pa.array(v, table.schema.field(n).type) for n, v in columns.items()}), path)


def aggregated(root: Path, fps: float = 40, meta_shift_s: float = -0.009766, video_shift_s: float = -0.009766) -> Path:
    """A dataset as LeRobot's aggregate_datasets leaves two joined drifted ones: episode 1 (of 0..2, one file per
    camera) starts off the frame grid in meta/episodes (52.215234 s for 52.225 s), its file's frames from there on
    ``video_shift_s`` off too. Every frame a flat grey of its own: 20 + 9 x its place in the file."""
    from tests.test_timeline import drift

    grey = iter(range(20, 256, 9))
    with DatasetWriter(root, fps, ("corner",)) as writer:
        for length in (6, 7, 5):
            for _ in range(length):
                writer.add_frame({"corner": np.full((16, 16, 3), next(grey), np.uint8)}, np.zeros(2), np.zeros(2), "hold")
            writer.save_episode()
    drift(root / "videos/observation.images.corner/chunk-000/file-000.mp4", 6, -video_shift_s, fps=fps)
    key = "videos/observation.images.corner"

    def shift(columns) -> None:
        for end in ("from_timestamp", "to_timestamp"):
            columns[f"{key}/{end}"][1] += meta_shift_s

    _episode_meta(root, shift)
    return root


def test_the_repair_check_names_for_an_aggregated_dataset_repairs_it(tmp_path):
    """check refuses a start off the frame grid naming convert SRC SRC-exact; that convert takes the start at the
    frame the file's timestamps put within half a frame of it, and its output passes check, every frame in place."""
    src = aggregated(tmp_path / "joined")
    with pytest.raises(DatasetError, match=rf"episode 1's videos/observation.images.corner/from_timestamp 0.140234 s is not "
                                           rf"a frame's time .* repair the dataset with: python -m training.datasets "
                                           rf"convert {src} {src}-exact$"):
        check(src)
    summary = convert(src, tmp_path / "joined-exact")
    assert summary["timeline"]["starts"].startswith("episodes 1 started off the frame grid in meta/episodes")
    assert check(tmp_path / "joined-exact")[-1].startswith("video corner: 18 frames in 1 file(s) decode")
    repaired = LeRobotDataset(tmp_path / "joined-exact")
    greys = np.concatenate([repaired.episode_frames(ep, "corner").mean(axis=(1, 2, 3)) for ep in range(3)])
    np.testing.assert_allclose(greys, 20 + 9 * np.arange(18), atol=3.0)

    exact_video = aggregated(tmp_path / "meta-only", video_shift_s=0.0)  # the file on the grid, its record off it
    convert(exact_video, tmp_path / "meta-only-exact")
    assert check(tmp_path / "meta-only-exact")


def test_a_start_the_file_does_not_confirm_is_refused_saying_why(tmp_path):
    """The record 9.8 ms early, the file's frames 9.8 ms late: 19.6 ms apart, more than half a frame at 40 fps."""
    src = aggregated(tmp_path / "joined", video_shift_s=0.009766)
    with pytest.raises(DatasetError, match=r"file-000.mp4: episode 1's from_timestamp 0.140234 s in meta/episodes is off "
                                           r"the frame grid, and the file's frame nearest it on the grid \(frame 6, "
                                           r"0.150000 s\) is at 0.159\d+ s, 19.\d ms from it, more than half a frame "
                                           r"\(12.5 ms\): which frame begins the episode cannot be told"):
        convert(src, tmp_path / "joined-exact")
    assert not (tmp_path / "joined-exact").exists()
