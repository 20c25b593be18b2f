"""A tiny LingBot-VA with random weights, in their release layout, to try a route on a CPU.

    python scripts/tiny_lingbot_va_release.py outputs/tiny_lingbot_va [--seed 0]

Their folder as published (transformer/, vae/, text_encoder/, tokenizer/), sized for their LIBERO convention
(``lingbot_va_libero``: two 128 x 128 cameras side by side; the preset ``lingbot_va_libero_tiny``): 2 layers of 2
heads of 20, a 4-channel-base Wan2.2-style VAE, a 2-layer UMT5 and the byte-level tokenizer. It acts at random: it
exercises loading, protocols, the episode memory, the broker and fine-tuning (``model.pretrained_path``), never a
success rate. Refuses a directory that exists.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def make(directory: Path, seed: int = 0) -> Path:
    """Write the release to ``directory`` (which must not exist)."""
    import torch

    from agents.wam.lingbot_va.config import preset
    from agents.wam.lingbot_va.release import save_release
    from agents.wam.lingbot_va.trained import random_parts

    if directory.exists():
        raise FileExistsError(f"{directory} exists: name a new directory")
    torch.manual_seed(seed)
    return save_release(directory, **random_parts(preset("lingbot_va_libero_tiny")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="a new directory for the release folder")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed (default 0)")
    args = parser.parse_args()
    if args.output.exists():
        parser.error(f"{args.output} exists: name a new directory")
    print(make(args.output, args.seed))


if __name__ == "__main__":
    main()
