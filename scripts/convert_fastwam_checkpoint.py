"""Convert FastWAM's released checkpoints to wam_gym's layout and back (in the spirit of diffusers'
conversion scripts). Their file is read with ``torch.load(weights_only=True)`` only; every key is mapped
(agents/wam/fastwam/layout.py) and a missing, unexpected or mis-shaped one stops the conversion, named.

    # their .pt -> our directory (wam_config.json, transformer/, action_expert/, proprio_encoder/; safetensors),
    # with their dataset_stats.json and, from a Wan2.2-TI2V-5B diffusers folder, the VAE, UMT5 and tokenizer
    python scripts/convert_fastwam_checkpoint.py to-ours libero_fastwam.pt checkpoints/fastwam-libero \
        --encoders /data/Wan2.2-TI2V-5B-Diffusers
    # our directory -> their .pt (their FastWAM.load_checkpoint reads it)
    python scripts/convert_fastwam_checkpoint.py to-theirs checkpoints/fastwam-libero fastwam_finetuned.pt --step 1000
    # what a .pt or a directory holds: keys, the architecture they imply, parameters
    python scripts/convert_fastwam_checkpoint.py inspect libero_fastwam.pt

``--preset`` picks the shapes to check against (``fastwam``: the released LIBERO model; ``fastwam_tiny``);
the action and proprio sizes come from the checkpoint. The VAE, UMT5 and tokenizer are not in their file:
``--encoders`` takes them from Wan2.2-TI2V-5B's own folder (the files their loader reads, each key mapped by
agents/wam/fastwam/wan_original.py) or from its diffusers folder (else ``load_fastwam(dir, encoders_from=...)``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agents.wam.fastwam.checkpoint import (  # noqa: E402
    convert_their_checkpoint,
    read_our_checkpoint,
    read_their_checkpoint,
    write_their_checkpoint,
)
from agents.wam.fastwam.config import PRESETS, preset  # noqa: E402


def describe(flat: dict) -> list[str]:
    """Lines saying what a flat checkpoint (their layout) holds and the architecture its shapes imply."""
    layers = Counter(m.group(1) for k in flat if (m := re.match(r"mot\.mixtures\.(\w+)\.blocks\.(\d+)\.self_attn\.q\.weight", k)))
    total = sum(v.numel() for v in flat.values())
    dtypes = Counter(str(v.dtype) for v in flat.values())
    lines = [f"keys: {len(flat)} ({sum(k.startswith('mot.') for k in flat)} mot, "
             f"{sum(k.startswith('proprio_encoder.') for k in flat)} proprio_encoder); dtypes {dict(dtypes)}",
             f"parameters: {total:,}"]
    shape = {k: tuple(v.shape) for k, v in flat.items()}
    if (patch := shape.get("mot.mixtures.video.patch_embedding.weight")) is not None:
        lines.append(f"video expert: {layers['video']} layers, width {patch[0]}, {patch[1]} latent channels, "
                     f"ffn {shape['mot.mixtures.video.blocks.0.ffn.0.weight'][0]}, "
                     f"attention width {shape['mot.mixtures.video.blocks.0.self_attn.q.weight'][0]}, "
                     f"text {shape['mot.mixtures.video.text_embedding.0.weight'][1]}")
    if (action := shape.get("mot.mixtures.action.action_encoder.weight")) is not None:
        lines.append(f"action DiT: {layers['action']} layers, width {action[0]}, actions of {action[1]}, "
                     f"ffn {shape['mot.mixtures.action.blocks.0.ffn.0.weight'][0]}, "
                     f"attention width {shape['mot.mixtures.action.blocks.0.self_attn.q.weight'][0]}")
    if (proprio := shape.get("proprio_encoder.weight")) is not None:
        lines.append(f"proprio: {proprio[1]} -> one text token of {proprio[0]}")
    return lines


def their_stats(checkpoint: Path) -> Path | None:
    """Their statistics where their evaluation looks for them (``dataset_stats.json`` beside the checkpoint or
    in a folder up to three above), or the one ``*dataset_stats.json`` there (their release names it after
    the task, e.g. ``libero_uncond_2cam224_dataset_stats.json``)."""
    for folder in list(checkpoint.resolve().parents)[:4]:
        if (folder / "dataset_stats.json").is_file():
            return folder / "dataset_stats.json"
        named = sorted(folder.glob("*dataset_stats.json"))
        if len(named) > 1:
            sys.exit(f"error: {folder} holds several statistics files ({', '.join(p.name for p in named)}): "
                     "pass the checkpoint's with --stats")
        if named:
            return named[0]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ours = sub.add_parser("to-ours", help="their .pt -> our checkpoint directory")
    ours.add_argument("source", type=Path)
    ours.add_argument("target", type=Path)
    ours.add_argument("--preset", default="fastwam", choices=sorted(PRESETS))
    ours.add_argument("--stats", type=Path, default=None,
                      help="their dataset_stats.json (default: one beside the .pt or up to three folders above it)")
    ours.add_argument("--encoders", type=Path, default=None,
                      help="Wan2.2-TI2V-5B's own folder (Wan2.2_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/: "
                           "what their loader reads; mapped to diffusers/transformers) or its diffusers folder (vae/, "
                           "text_encoder/, tokenizer/: copied): the VAE, UMT5 and tokenizer their .pt lacks")
    theirs = sub.add_parser("to-theirs", help="our checkpoint directory -> their .pt")
    theirs.add_argument("source", type=Path)
    theirs.add_argument("target", type=Path)
    theirs.add_argument("--step", type=int, default=None, help="the training step recorded in the file")
    look = sub.add_parser("inspect", help="print what a .pt or a directory holds")
    look.add_argument("source", type=Path)
    args = parser.parse_args(argv)

    if args.command == "to-ours":
        stats = args.stats or their_stats(args.source)
        target = convert_their_checkpoint(args.source, args.target, preset(args.preset), stats, args.encoders)
        if stats is None:
            print("no dataset_stats.json found beside it: pass --stats, or EVALUATION.dataset_stats_path when evaluating")
        print(f"wrote {target}")
    elif args.command == "to-theirs":
        target = write_their_checkpoint(read_our_checkpoint(args.source), args.target, step=args.step)
        print(f"wrote {target}")
    else:
        flat = read_our_checkpoint(args.source) if args.source.is_dir() else read_their_checkpoint(args.source)
        print("\n".join(describe(flat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
