"""The real LeRobot 0.4.4 on our datasets and statistics. Runs in the venv scripts/lerobot/setup.sh builds
(with this folder on PYTHONPATH and LEROBOT_VENV_DIR set), never in ours, and imports nothing of wam_gym.
Driven by scripts/lerobot_crosscheck.py, which compares what it prints with our own reader.

    read ROOT        every item through lerobot.datasets.lerobot_dataset.LeRobotDataset (pyav backend):
                     prints JSON {items, timestamp_errors, first_error, digests: {camera: [sha1 per item]}}
    aggregate OUT ROOT...   join datasets with lerobot.datasets.aggregate.aggregate_datasets
    convert-v21 ROOT        LeRobot's own v2.1 -> v3.0 converter, in place (it keeps ROOT_old beside it)
    normalize        LeRobot's NormalizerProcessorStep on statistics with degenerate dimensions (a constant
                     one: zero std, min == max, q01 == q99), in each mode: prints the fixture
                     tests/fixtures/lerobot_normalization.json:
                     PYTHONPATH=scripts/lerobot LEROBOT_VENV_DIR=DIR DIR/venv/bin/python scripts/lerobot/side.py normalize
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import lerobot_env  # noqa: F401  (offline hub; torchvision's VideoReader for LeRobot's pyav decoder)
import numpy as np


def read(root: Path) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.video_utils import FrameTimestampError  # noqa: F401  (the error counted below)

    ds = LeRobotDataset(f"local/{root.name}", root=root, video_backend="pyav")
    cameras = list(ds.meta.video_keys)
    digests: dict[str, list[str | None]] = {c: [] for c in cameras}
    errors, first = 0, None
    for i in range(len(ds)):
        try:
            item = ds[i]
        except Exception as exc:  # FrameTimestampError and anything else LeRobot raises, counted the same
            errors += 1
            first = first or f"item {i}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            for c in cameras:
                digests[c].append(None)
            continue
        for c in cameras:  # LeRobot returns (C, H, W) floats in [0, 1]: back to the uint8 (H, W, C) it decoded
            frame = (item[c].numpy() * 255).round().astype(np.uint8).transpose(1, 2, 0)
            digests[c].append(hashlib.sha1(np.ascontiguousarray(frame).tobytes()).hexdigest())
    return {"items": len(ds), "timestamp_errors": errors, "first_error": first, "digests": digests}


def aggregate(out: Path, roots: list[Path]) -> None:
    from lerobot.datasets.aggregate import aggregate_datasets

    aggregate_datasets(repo_ids=[f"local/{r.name}" for r in roots], aggr_repo_id=f"local/{out.name}",
                       roots=roots, aggr_root=out)


def convert_v21(root: Path) -> None:
    from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset

    convert_dataset(repo_id=root.name, root=root.parent, push_to_hub=False)


# state and action statistics: dimension 0 ordinary, 1 constant (a gripper that never moves), 2 a tiny range
NORMALIZE_STATS = {key: {"mean": [0.5, 0.04, 1.0], "std": [2.0, 0.0, 1e-9], "min": [-3.0, 0.04, 1.0],
                         "max": [4.0, 0.04, 1.0 + 1e-7], "q01": [-2.5, 0.04, 1.0], "q99": [3.0, 0.04, 1.0 + 1e-7]}
                   for key in ("observation.state", "action")}
NORMALIZE_VALUES = [[0.5, 0.04, 1.0], [-2.5, 0.04, 1.0 + 1e-7], [3.0, 0.05, 0.5]]


def normalize() -> dict:
    import torch
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.processor.normalize_processor import NormalizerProcessorStep

    features = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(3,)),
                "action": PolicyFeature(type=FeatureType.ACTION, shape=(3,))}
    values = torch.tensor(NORMALIZE_VALUES, dtype=torch.float64)
    out: dict = {"stats": NORMALIZE_STATS, "values": NORMALIZE_VALUES, "normalized": {}}
    for mode, name in ((NormalizationMode.MEAN_STD, "mean_std"), (NormalizationMode.MIN_MAX, "min_max"),
                       (NormalizationMode.QUANTILES, "quantiles")):
        step = NormalizerProcessorStep(features=features, norm_map={FeatureType.STATE: mode, FeatureType.ACTION: mode},
                                       stats=NORMALIZE_STATS, dtype=torch.float64)
        out["normalized"][name] = {
            "observation.state": step._apply_transform(values, "observation.state", FeatureType.STATE).tolist(),
            "action": step._apply_transform(values, "action", FeatureType.ACTION).tolist()}
    return out


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "read":
        print(json.dumps(read(Path(args[0]))))
    elif command == "convert-v21":
        convert_v21(Path(args[0]))
    elif command == "normalize":
        print(json.dumps(normalize()))
    elif command == "aggregate":
        aggregate(Path(args[0]), [Path(a) for a in args[1:]])
    else:
        sys.exit(f"unknown command {command!r}: read ROOT | aggregate OUT ROOT...")
