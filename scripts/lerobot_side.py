"""Read a dataset with the real LeRobot (runs in the venv ../shared/lerobot-venv/setup.sh builds, never
in ours; it imports nothing of wam_gym). Driven by scripts/lerobot_crosscheck.py, which compares what
it prints with our own reader.

    read ROOT        every item through lerobot.datasets.lerobot_dataset.LeRobotDataset (pyav backend):
                     prints JSON {items, timestamp_errors, first_error, digests: {camera: [sha1 per item]}}
    aggregate OUT ROOT...   join datasets with lerobot.datasets.aggregate.aggregate_datasets
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


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "read":
        print(json.dumps(read(Path(args[0]))))
    elif command == "aggregate":
        aggregate(Path(args[0]), [Path(a) for a in args[1:]])
    else:
        sys.exit(f"unknown command {command!r}: read ROOT | aggregate OUT ROOT...")
