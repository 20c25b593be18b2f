"""LeRobot v3.0 layouts other writers use, read and trained on: a lone camera under
``observation.image`` (pusht-style) and frames stored as images in the data files (``dtype: image``).
Each is built here from one of our datasets, the way those writers lay it out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.data import ClipDataset, DatasetWriter, LeRobotDataset, compute_stats
from training.datasets import check

FPS, CAMERA, SIZE = 20, "corner", (24, 32)
LENGTHS = (6, 9, 5)


def _frame(ep: int, t: int) -> np.ndarray:
    y, x = np.mgrid[0 : SIZE[0], 0 : SIZE[1]]
    return np.clip(np.stack([x * 6 + 9 * t, y * 8 + 30 * ep, np.full_like(x, 40 * ep + 7 * t)], -1), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layouts") / "base"
    rng = np.random.default_rng(1)
    with DatasetWriter(root, FPS, (CAMERA,), episodes_per_file=2) as writer:  # two data files
        for ep, length in enumerate(LENGTHS):
            for t in range(length):
                writer.add_frame({CAMERA: _frame(ep, t)}, rng.normal(size=4), rng.uniform(-1, 1, 4), "push the block")
            writer.save_episode()
    return root


def _rename_feature(root: Path, old: str, new: str) -> None:
    """What a writer naming its camera ``new`` would have written."""
    info = json.loads((root / "meta/info.json").read_text())
    info["features"] = {new if k == old else k: v for k, v in info["features"].items()}
    (root / "meta/info.json").write_text(json.dumps(info))
    stats = json.loads((root / "meta/stats.json").read_text())
    (root / "meta/stats.json").write_text(json.dumps({new if k == old else k: v for k, v in stats.items()}))
    for path in (root / "meta/episodes").rglob("*.parquet"):
        table = pq.read_table(path)
        names = [n.replace(f"/{old}/", f"/{new}/") for n in table.column_names]
        pq.write_table(table.rename_columns(names), path)
    (root / "videos" / old).rename(root / "videos" / new)


def _to_images_in_parquet(root: Path, key: str) -> dict[int, np.ndarray]:
    """The camera's frames as PNG bytes in the data files (Hugging Face datasets' Image struct), no mp4s."""
    ds = LeRobotDataset(root)
    frames = np.concatenate([ds.episode_frames(ep, CAMERA) for ep in range(ds.num_episodes)])
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        encoded = [iio.imwrite("<bytes>", frames[i], extension=".png") for i in table.column("index").to_pylist()]
        images = pa.StructArray.from_arrays([pa.array(encoded, pa.binary()), pa.array([None] * len(encoded), pa.string())],
                                            ["bytes", "path"])
        pq.write_table(table.append_column(key, images), path)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][key] = {"dtype": "image", "shape": [*SIZE, 3], "names": ["height", "width", "channel"]}
    (root / "meta/info.json").write_text(json.dumps(info))
    for path in (root / "meta/episodes").rglob("*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.drop_columns([n for n in table.column_names if n.startswith("videos/")]), path)
    shutil.rmtree(root / "videos")
    return {ep: np.asarray(ds.episode_frames(ep, CAMERA)) for ep in range(ds.num_episodes)}


def test_a_lone_camera_under_observation_image(base, tmp_path, train_two_steps):
    root = Path(shutil.copytree(base, tmp_path / "pusht"))
    _rename_feature(root, f"observation.images.{CAMERA}", "observation.image")
    ds, original = LeRobotDataset(root), LeRobotDataset(base)
    assert ds.cameras == ("image",) and ds.feature_key("image") == "observation.image"
    for ep in range(len(LENGTHS)):
        np.testing.assert_array_equal(ds.episode_frames(ep, "image"), original.episode_frames(ep, CAMERA))
    assert check(root)[-1].startswith("video image: 20 frames")
    clips = ClipDataset(ds, cameras=["image"], image_size=SIZE, action_horizon=4, num_future_frames=2)
    assert clips[0]["video"].shape[-2:] == SIZE
    assert (train_two_steps(root, "image") / "wam_config.json").is_file()


def test_frames_stored_as_images_in_the_data_files(base, tmp_path, train_two_steps):
    root = Path(shutil.copytree(base, tmp_path / "images"))
    key = f"observation.images.{CAMERA}"
    stored = _to_images_in_parquet(root, key)
    ds = LeRobotDataset(root)
    assert ds.cameras == (CAMERA,) and ds.video_cameras == ()
    for ep, frames in stored.items():
        np.testing.assert_array_equal(ds.episode_frames(ep, CAMERA), frames)  # PNG: exactly what was stored
    stats = compute_stats(root)  # images from the data files, per channel
    pixels = np.concatenate(list(stored.values())).reshape(-1, 3) / 255
    np.testing.assert_allclose(stats[key]["mean"].ravel(), pixels.mean(0), rtol=1e-9)
    assert check(root)[-1] == f"images {CAMERA}: 20 frames in the data files decode"
    assert (train_two_steps(root, CAMERA) / "wam_config.json").is_file()


def test_an_image_stored_by_path_only_is_named(base, tmp_path):
    root = Path(shutil.copytree(base, tmp_path / "paths"))
    key = f"observation.images.{CAMERA}"
    _to_images_in_parquet(root, key)
    path = sorted((root / "data").rglob("*.parquet"))[0]
    table = pq.read_table(path)
    n = table.num_rows
    empty = pa.StructArray.from_arrays([pa.array([None] * n, pa.binary()), pa.array(["frame.png"] * n)], ["bytes", "path"])
    pq.write_table(table.set_column(table.column_names.index(key), key, empty), path)
    from training.data import DatasetError

    with pytest.raises(DatasetError, match=r"episode 0 observation.images.corner frame 0 has no image bytes"):
        LeRobotDataset(root).episode_frames(0, CAMERA)



def test_many_chunks(tmp_path, train_two_steps):
    """One episode a file and one file a chunk: three chunk directories, read and trained on."""
    root = tmp_path / "chunks"
    rng = np.random.default_rng(2)
    with DatasetWriter(root, FPS, (CAMERA,), episodes_per_file=1, chunks_size=1) as writer:
        for ep, length in enumerate(LENGTHS):
            for t in range(length):
                writer.add_frame({CAMERA: _frame(ep, t)}, rng.normal(size=4), rng.uniform(-1, 1, 4), "push the block")
            writer.save_episode()
    assert sorted(p.name for p in (root / "data").iterdir()) == ["chunk-000", "chunk-001", "chunk-002"]
    ds = LeRobotDataset(root)
    assert ds.num_episodes == 3 and ds.episode_lengths.tolist() == list(LENGTHS)
    assert check(root)[-1] == (f"video {CAMERA}: 20 frames in 3 file(s) decode, every episode's span included, "
                               "each frame at frame / fps within 0.0001 s")
    assert (train_two_steps(root, CAMERA) / "wam_config.json").is_file()
