"""Convert FastWAM's checkpoints to wam_gym's layout and back (in the spirit of diffusers' conversion scripts).
Their file is read with ``torch.load(weights_only=True)`` only; every key is mapped (agents/wam/fastwam/layout.py)
and a missing, unexpected or mis-shaped one stops the conversion, named.

    # their LIBERO release -> our directory (wam_config.json, transformer/, action_expert/, proprio_encoder/;
    # safetensors), with their dataset_stats.json and, from a Wan2.2-TI2V-5B folder, the VAE, UMT5 and tokenizer
    python scripts/convert_fastwam_checkpoint.py to-ours libero_uncond_2cam224.pt checkpoints/fastwam-libero \
        --inputs fastwam_libero --preset fastwam --encoders /data/Wan2.2-TI2V-5B-Diffusers
    # a checkpoint their training wrote (its run's config.yaml is found above checkpoints/weights/step_N.pt)
    python scripts/convert_fastwam_checkpoint.py to-ours runs/x/checkpoints/weights/step_002000.pt ours --inputs wam_gym
    # our directory -> their .pt (their FastWAM.load_checkpoint reads it)
    python scripts/convert_fastwam_checkpoint.py to-theirs checkpoints/fastwam-libero fastwam_finetuned.pt --step 1000
    # what a .pt or a directory holds: keys, the architecture they imply, parameters
    python scripts/convert_fastwam_checkpoint.py inspect libero_uncond_2cam224.pt

The architecture is read, never assumed (agents/wam/fastwam/their_config.py): every size from the checkpoint's
shapes; what no shape tells (heads, frames, text tokens, shifts, image size, cameras) from their config.yaml
(``--their-config``, else the one their training wrote beside the .pt or up to three folders above it), or a
preset the checkpoint is the size of (``--preset fastwam``: their released LIBERO model), and the flags, which
win over both. ``--inputs`` names the input convention (how frames are turned and cropped, the gripper signed):
nothing in their files records it, and a checkpoint whose sizes contradict it is refused. The VAE, UMT5 and
tokenizer are not in their file: ``--encoders`` takes them from Wan2.2-TI2V-5B's own folder (the files their
loader reads, each key mapped by agents/wam/fastwam/wan_original.py) or from its diffusers folder (else
``load_fastwam(dir, encoders_from=...)``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agents.wam.fastwam.checkpoint import (  # noqa: E402
    convert_their_checkpoint,
    read_our_checkpoint,
    read_their_checkpoint,
    write_their_checkpoint,
)
from agents.wam.fastwam.config import PRESETS  # noqa: E402
from agents.wam.fastwam.inputs import CONVENTIONS  # noqa: E402
from agents.wam.fastwam.their_config import FLAGS, TheirArchitecture, read_shapes, read_their_config  # noqa: E402


def describe(flat: dict) -> list[str]:
    """Lines saying what a flat checkpoint (their layout) holds and the architecture its shapes imply."""
    total = sum(v.numel() for v in flat.values())
    dtypes = sorted({str(v.dtype) for v in flat.values()})
    s = read_shapes(flat)
    return [f"keys: {len(flat)} ({sum(k.startswith('mot.') for k in flat)} mot, "
            f"{sum(k.startswith('proprio_encoder.') for k in flat)} proprio_encoder); dtypes {dtypes}",
            f"parameters: {total:,}",
            f"video expert: {s.layers} layers, width {s.width} (its attention's: heads x head size), "
            f"{s.in_channels} latent channels, patch {s.patch_size}, ffn {s.ffn}, text {s.text_dim}",
            f"action DiT: {s.layers} layers, width {s.action_width}, actions of {s.action_dim}, ffn {s.action_ffn}",
            f"proprio: {s.state_dim} -> one text token of {s.text_dim}"]


def near_checkpoint(checkpoint: Path, name: str, pattern: str | None = None) -> Path | None:
    """``name`` where their runs keep it: beside the checkpoint or in a folder up to three above (their training's
    output_dir holds config.yaml and dataset_stats.json, its weights checkpoints/weights/step_N.pt); else the one
    file there matching ``pattern`` (their release names its statistics after the task)."""
    for folder in list(checkpoint.resolve().parents)[:4]:
        if (folder / name).is_file():
            return folder / name
        named = sorted(folder.glob(pattern)) if pattern else []
        if len(named) > 1:
            sys.exit(f"error: {folder} holds several {pattern} files ({', '.join(p.name for p in named)}): pass the "
                     "checkpoint's one")
        if named:
            return named[0]
    return None


def architecture(args: argparse.Namespace) -> TheirArchitecture:
    """Where the values the shapes do not tell come from: the flags, then their config or a preset."""
    their = args.their_config or (None if args.preset else near_checkpoint(args.source, "config.yaml"))
    if their is not None:
        print(f"architecture: the checkpoint's shapes, and their config {their}")
    given = {name: getattr(args, name) for name in FLAGS}
    return TheirArchitecture(args.inputs, read_their_config(their) if their else None, args.preset, given)


def _to_ours_parser(sub) -> None:
    ours = sub.add_parser("to-ours", help="their .pt -> our checkpoint directory")
    ours.add_argument("source", type=Path)
    ours.add_argument("target", type=Path)
    ours.add_argument("--inputs", required=True, choices=sorted(CONVENTIONS),
                      help="the input convention it was trained with (fastwam_libero: their LIBERO release's)")
    source = ours.add_mutually_exclusive_group()
    source.add_argument("--their-config", type=Path, default=None,
                        help="the config.yaml its run wrote (default: one beside the .pt or up to three folders above it)")
    source.add_argument("--preset", default=None, choices=sorted(PRESETS),
                        help="a preset it is the size of, for what its shapes do not tell (fastwam: their LIBERO release)")
    ours.add_argument("--heads", type=int, help="attention heads (their num_heads)")
    ours.add_argument("--num-frames", type=int, help="their data.train.num_frames: the actions of a chunk + 1")
    ours.add_argument("--action-video-freq-ratio", type=int, help="their data.train.action_video_freq_ratio")
    ours.add_argument("--text-tokens", type=int, help="instruction tokens (their tokenizer_max_len)")
    ours.add_argument("--shifts", type=float, nargs=2, metavar=("VIDEO", "ACTION"), help="flow shifts (train and inference)")
    ours.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"), help="per camera")
    ours.add_argument("--cameras", nargs="+", help="env cameras, tiled left to right (default: the convention's)")
    ours.add_argument("--stats", type=Path, default=None,
                      help="their dataset_stats.json (default: one beside the .pt or up to three folders above it)")
    ours.add_argument("--encoders", type=Path, default=None,
                      help="Wan2.2-TI2V-5B's own folder (Wan2.2_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/: "
                           "what their loader reads; mapped to diffusers/transformers) or its diffusers folder (vae/, "
                           "text_encoder/, tokenizer/: copied): the VAE, UMT5 and tokenizer their .pt lacks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _to_ours_parser(sub)
    theirs = sub.add_parser("to-theirs", help="our checkpoint directory -> their .pt")
    theirs.add_argument("source", type=Path)
    theirs.add_argument("target", type=Path)
    theirs.add_argument("--step", type=int, default=None, help="the training step recorded in the file")
    look = sub.add_parser("inspect", help="print what a .pt or a directory holds")
    look.add_argument("source", type=Path)
    args = parser.parse_args(argv)

    if args.command == "to-ours":
        stats = args.stats or near_checkpoint(args.source, "dataset_stats.json", "*dataset_stats.json")
        target = convert_their_checkpoint(args.source, args.target, architecture(args), stats, args.encoders)
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
