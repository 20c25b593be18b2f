"""A LingBot-VA checkpoint python -m training wrote -> their release folder (transformer/, vae/, text_encoder/,
tokenizer/), LoRA adapters merged into the weights they adapt: what their server and wam_gym's ``ckpt=`` read as
published.

    python scripts/export_lingbot_va_release.py outputs/libero_lingbot_va_lora/checkpoint outputs/lingbot_va_release

Refuses a destination that exists.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="the directory python -m training wrote (wam_config.json, lora/)")
    parser.add_argument("output", type=Path, help="a new directory for their release layout")
    args = parser.parse_args(argv)
    if args.output.exists():
        parser.error(f"{args.output} exists: name a new directory")
    from agents.wam.lingbot_va.trained import export_release

    folder = export_release(args.checkpoint, args.output)
    print(folder)
    return folder


if __name__ == "__main__":
    main()
