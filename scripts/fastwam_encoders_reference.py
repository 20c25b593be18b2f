"""Regenerate tests/fixtures/fastwam_encoders/ with FastWAM's own VAE and text encoder code.

FastWAM loads Wan's original-layout files (``Wan2.2_VAE.pth``: their ``WanVideoVAE38``, and
``models_t5_umt5-xxl-enc-bf16.pth``: their ``WanTextEncoder``), not diffusers' or transformers' folders.
This script runs their two classes at a tiny size, in a scratch venv OUTSIDE the project (the one
scripts/fastwam_reference.py describes), imports their code and never ours, and writes:

    vae.safetensors    the VAE's weights in the layout of Wan2.2_VAE.pth (the state dict of their VideoVAE38_)
    t5.safetensors     the text encoder's weights in the layout of models_t5_umt5-xxl-enc-bf16.pth
    io.safetensors     inputs and their outputs: a 5-frame clip encoded to normalised latents (their
                       encode with its mean/std scale) and those latents decoded; token ids with a padding
                       mask through their text encoder
    config.json        the tiny sizes, the latent scale, their commit
    full_size.json     the released files' key lists with shapes (their classes at Wan2.2-TI2V-5B's sizes,
                       built on the meta device: nothing allocated)

    /tmp/fastwam-venv/bin/python scripts/fastwam_encoders_reference.py --repo /tmp/fastwam --commit <their sha>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

TINY_VAE = dict(dim=4, z_dim=4, dec_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=2, temperal_downsample=[False, True, True])
TINY_T5 = dict(vocab=384, dim=32, dim_attn=32, dim_ffn=64, num_heads=2, num_layers=2, num_buckets=32, shared_pos=False)
CLIP = (1, 3, 5, 32, 32)  # batch, RGB, 1 + 4 frames, pixels
TOKENS = (2, 12)


def _perturb(module: torch.nn.Module, generator: torch.Generator) -> None:
    # Norm scales start at one and biases at zero: moved, every weight shows in the outputs.
    with torch.no_grad():
        for param in module.parameters():
            if param.ndim == 1 or param.shape[1:].numel() == 1:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="a checkout of yuantianyuan01/FastWAM (its src/ is imported)")
    parser.add_argument("--commit", default="unknown", help="their commit, recorded in config.json")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent.parent / "tests/fixtures/fastwam_encoders")
    args = parser.parse_args()
    sys.path.insert(0, str(args.repo / "src"))
    from fastwam.models.wan22.wan_video_text_encoder import WanTextEncoder
    from fastwam.models.wan22.wan_video_vae import VideoVAE38_
    from safetensors.torch import save_file

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    vae, t5 = VideoVAE38_(**TINY_VAE).eval(), WanTextEncoder(**TINY_T5).eval()
    _perturb(vae, generator)
    _perturb(t5, generator)
    mean = torch.randn(TINY_VAE["z_dim"], generator=generator) * 0.2
    std = torch.rand(TINY_VAE["z_dim"], generator=generator) + 0.5
    clip = torch.rand(CLIP, generator=generator) * 2 - 1
    ids = torch.randint(1, TINY_T5["vocab"], TOKENS, generator=generator)
    mask = torch.ones(TOKENS, dtype=torch.long)
    mask[1, 7:] = 0  # the second prompt is 7 tokens, then padding
    with torch.no_grad():
        latents = vae.encode(clip, [mean, 1.0 / std])  # their WanVideoVAE38.single_encode's call
        decoded = vae.decode(latents, [mean, 1.0 / std]).clamp(-1, 1)  # single_decode's
        text = t5(ids, mask)
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(args.out / "vae.safetensors"))
    save_file({k: v.contiguous() for k, v in t5.state_dict().items()}, str(args.out / "t5.safetensors"))
    io = {"clip": clip, "latents": latents, "decoded": decoded, "ids": ids, "mask": mask, "text": text,
          "latents_mean": mean, "latents_std": std}
    save_file({k: v.contiguous() for k, v in io.items()}, str(args.out / "io.safetensors"))
    config = {"their_repository": "yuantianyuan01/FastWAM", "their_commit": args.commit, "torch": torch.__version__,
              "dtype": "float32", "device": "cpu", "vae": TINY_VAE, "t5": TINY_T5}
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with torch.device("meta"):  # their defaults are the released sizes (Wan2.2's VAE, UMT5-XXL)
        full = {"vae": VideoVAE38_(), "t5": WanTextEncoder()}
    keys = {name: {k: list(v.shape) for k, v in m.state_dict().items()} for name, m in full.items()}
    (args.out / "full_size.json").write_text(json.dumps(keys, indent=0) + "\n")
    print(f"wrote {args.out}: latents {tuple(latents.shape)}, decoded {tuple(decoded.shape)}, text {tuple(text.shape)}")


if __name__ == "__main__":
    main()
