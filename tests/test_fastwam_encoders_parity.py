"""FastWAM's VAE and text encoder files load as their loader reads them, and compute what their code computes.

tests/fixtures/fastwam_encoders/ was made by scripts/fastwam_encoders_reference.py, which runs THEIR
VideoVAE38_ (Wan2.2's VAE) and WanTextEncoder (Wan's UMT5) at a tiny size with seeded random weights in fp32
on the CPU: the weights in the layout of Wan2.2_VAE.pth and models_t5_umt5-xxl-enc-bf16.pth, a clip and token
ids, and their outputs. Here those weights are written as the .pth files of Wan's release, read by
agents.wam.fastwam.wan_original into diffusers' AutoencoderKLWan and transformers' UMT5EncoderModel, and
our encoders reproduce their outputs within 1e-5 (measured: latents 6e-8, decoded frames 6e-7, text 7e-7).
At the released sizes the diffusers/transformers models have exactly the mapped keys and shapes of their
classes (full_size.json, built from their code on the meta device).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file
from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

from agents.wam.config import TextEncoderConfig, VAEConfig
from agents.wam.fastwam import wan_original
from agents.wam.fastwam.checkpoint import export_their_checkpoint, from_their_checkpoint
from agents.wam.fastwam.config import preset
from agents.wam.fastwam.model import FastWAM

FIXTURE = Path(__file__).parent / "fixtures" / "fastwam_encoders"
TOL = {"atol": 1e-5, "rtol": 1e-5}
CONFIG = json.loads((FIXTURE / "config.json").read_text())
IO = load_file(str(FIXTURE / "io.safetensors"))


def vae_config() -> VAEConfig:
    v = CONFIG["vae"]
    return VAEConfig(base_dim=v["dim"], decoder_base_dim=v["dec_dim"], z_dim=v["z_dim"], dim_mult=tuple(v["dim_mult"]),
                     num_res_blocks=v["num_res_blocks"], temperal_downsample=tuple(v["temperal_downsample"]),
                     is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16,
                     latents_mean=tuple(IO["latents_mean"].tolist()), latents_std=tuple(IO["latents_std"].tolist()))


def text_config() -> TextEncoderConfig:
    t = CONFIG["t5"]
    return TextEncoderConfig(d_model=t["dim"], d_kv=t["dim_attn"] // t["num_heads"], d_ff=t["dim_ffn"],
                             num_layers=t["num_layers"], num_heads=t["num_heads"], max_length=12)


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory) -> Path:
    """Wan2.2-TI2V-5B's own layout, as FastWAM's loader reads it: two torch.save state dicts and a tokenizer."""
    root = tmp_path_factory.mktemp("Wan2.2-TI2V-5B")
    torch.save(load_file(str(FIXTURE / "vae.safetensors")), root / wan_original.VAE_FILE)
    torch.save(load_file(str(FIXTURE / "t5.safetensors")), root / wan_original.T5_FILE)
    ByT5Tokenizer().save_pretrained(str(root / wan_original.TOKENIZER_DIR))
    return root


def encode(vae: AutoencoderKLWan, clip: torch.Tensor) -> torch.Tensor:
    """Normalised latents, as our models take them (encoders.py: the posterior's mode, minus mean, over std)."""
    mean, std = (torch.tensor(getattr(vae.config, k)).view(1, -1, 1, 1, 1) for k in ("latents_mean", "latents_std"))
    return (vae.encode(clip).latent_dist.mode() - mean) / std


@torch.no_grad()
def test_their_vae_file_encodes_and_decodes_as_their_code(wan_folder):
    vae = wan_original.load_vae(wan_folder / wan_original.VAE_FILE, vae_config())
    torch.testing.assert_close(encode(vae, IO["clip"]), IO["latents"], **TOL)
    mean, std = (torch.tensor(getattr(vae.config, k)).view(1, -1, 1, 1, 1) for k in ("latents_mean", "latents_std"))
    decoded = vae.decode(IO["latents"] * std + mean).sample.clamp(-1, 1)
    torch.testing.assert_close(decoded, IO["decoded"], **TOL)


@torch.no_grad()
def test_their_text_encoder_file_encodes_as_their_code(wan_folder):
    model = wan_original.load_umt5(wan_folder / wan_original.T5_FILE, text_config())
    hidden = model(input_ids=IO["ids"], attention_mask=IO["mask"]).last_hidden_state
    real = IO["mask"].bool()  # FastWAM zeroes the padding positions after the encoder, as encode_prompt does
    torch.testing.assert_close(hidden[real], IO["text"][real], **TOL)


@torch.no_grad()
def test_a_wan_folder_gives_a_fastwam_its_encoders(wan_folder, tmp_path):
    config = preset("fastwam_tiny", vae=vae_config(), text_encoder=text_config())
    config.backbone.in_channels = config.backbone.out_channels = config.vae.z_dim
    config.backbone.text_dim = text_config().d_model
    their_pt = export_their_checkpoint(FastWAM(config), tmp_path / "theirs.pt")
    model = from_their_checkpoint(their_pt, config, encoders_from=wan_folder)
    torch.testing.assert_close(model.encode_video(IO["clip"]), IO["latents"], **TOL)


def test_a_key_without_a_place_is_named(tmp_path):
    weights = load_file(str(FIXTURE / "vae.safetensors"))
    weights["encoder.extra.weight"] = torch.zeros(1)
    torch.save(weights, tmp_path / "vae.pth")
    with pytest.raises(wan_original.WanLayoutError, match="1 key.*encoder.extra.weight"):
        wan_original.load_vae(tmp_path / "vae.pth", vae_config())


def test_the_released_sizes_have_their_keys_and_shapes():
    full = json.loads((FIXTURE / "full_size.json").read_text())
    config = preset("fastwam")
    with torch.device("meta"):
        vae = AutoencoderKLWan(**config.vae.vae_kwargs())
        te = config.text_encoder
        umt5 = UMT5EncoderModel(UMT5Config(vocab_size=full["t5"]["token_embedding.weight"][0], d_model=te.d_model,
                                           d_kv=te.d_kv, d_ff=te.d_ff, num_layers=te.num_layers, num_heads=te.num_heads))
    mapped_vae = {wan_original.vae_key(k, config.vae.num_res_blocks): v for k, v in full["vae"].items()}
    assert mapped_vae == {k: list(v.shape) for k, v in vae.state_dict().items()}
    mapped_t5 = {wan_original.umt5_key(k): v for k, v in full["t5"].items()}
    ours = {k: list(v.shape) for k, v in umt5.state_dict().items() if k != "encoder.embed_tokens.weight"}  # tied
    assert mapped_t5 == ours
