"""A tiny FastWAM with random weights, shaped like their LIBERO release, to try a route on a CPU.

    python scripts/tiny_fastwam_checkpoint.py outputs/tiny_fastwam [--image-size 32]

LIBERO's two cameras, an 8-d state and 7-d actions, their chunk of 32 actions with a frame every 4, their LIBERO input
convention (``fastwam_libero``: the checkpoint is served and evaluated by their protocol) and a
statistics file in their layout with unit ranges. It acts at random: it exercises serving, drivers and
protocols (a few seconds a call on 2 CPU cores), never a success rate. Refuses a directory that exists.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CAMERAS = ("agentview", "robot0_eye_in_hand")
STATE_DIM, ACTION_DIM = 8, 7


def make(directory: Path, image_size: int = 32) -> Path:
    """Write the checkpoint to ``directory`` (which must not exist)."""
    from agents.wam.fastwam import FastWAM, preset, save_fastwam
    from agents.wam.fastwam.checkpoint import STATS_FILE
    from agents.wam.fastwam.inputs import convention

    if directory.exists():
        raise FileExistsError(f"{directory} exists: name a new directory")
    config = preset("fastwam_tiny", cameras=CAMERAS, image_size=(image_size, image_size), action_horizon=32,
                    num_future_frames=8, inputs=convention("fastwam_libero"))  # a frame every 4 actions, as theirs
    save_fastwam(FastWAM(config), directory)
    unit = {group: {"default": {"global_min": [-1.0] * dim, "global_max": [1.0] * dim}}
            for group, dim in (("state", STATE_DIM), ("action", ACTION_DIM))}
    (directory / STATS_FILE).write_text(json.dumps(unit))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="a new directory for the checkpoint")
    parser.add_argument("--image-size", type=int, default=32, help="pixels a side of each camera (default 32)")
    args = parser.parse_args()
    if not 16 <= args.image_size <= 1024:
        parser.error(f"--image-size {args.image_size}: give pixels a side in [16, 1024]")
    if args.output.exists():
        parser.error(f"{args.output} exists: name a new directory")
    print(make(args.output, args.image_size))


if __name__ == "__main__":
    main()
