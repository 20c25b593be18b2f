"""A LingBot-VA release folder as published (transformer/, vae/, text_encoder/, tokenizer/) -> the model, its VAE
and prompt encoder, and the config of the input convention it is evaluated under.

Their folders carry no evaluation settings: those are their ``wan_va/configs/va_*_cfg.py`` files, which the
named input convention (:mod:`agents.wam.lingbot_va.inputs`) transcribes. Only safetensors weights are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from agents.wam.config import VAEConfig
from agents.wam.lingbot_va.checkpoint import load_transformer, transformer_config
from agents.wam.lingbot_va.config import LingBotVAConfig
from agents.wam.lingbot_va.inputs import LingBotVAInputs
from agents.wam.lingbot_va.prompt import PromptEncoder

PARTS = ("transformer", "vae", "text_encoder", "tokenizer")


@dataclass
class Release:
    model: torch.nn.Module
    vae: torch.nn.Module
    prompts: PromptEncoder
    config: LingBotVAConfig


def config_for(inputs: LingBotVAInputs, folder: str | Path) -> LingBotVAConfig:
    """The config a release's transformer/ and vae/ make, evaluated under ``inputs``."""
    import json

    folder = Path(folder)
    if inputs.layout != "side_by_side":
        raise ValueError(f"{inputs.name}: its {inputs.layout} camera layout is not served by wam_gym yet; "
                         "evaluate a side_by_side convention (lingbot_va_libero)")
    vae = VAEConfig.from_diffusers(json.loads((folder / "vae" / "config.json").read_text()))
    return LingBotVAConfig.under(inputs, transformer_config(folder / "transformer"), vae)


def load_release(folder: str | Path, inputs: LingBotVAInputs, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> Release:
    """Every part of a release folder, on ``device`` in ``dtype``, in eval mode."""
    folder = Path(folder)
    _check_parts(folder)
    config = config_for(inputs, folder)
    model, vae, encoder, tokenizer = read_parts(folder, device, dtype)
    return Release(model, vae, PromptEncoder(tokenizer, encoder, config.text_tokens), config)


def _check_parts(folder: Path) -> None:
    missing = [part for part in PARTS if not (folder / part).is_dir()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(p + '/' for p in missing)}: give a LingBot-VA release "
                                f"folder as published ({', '.join(p + '/' for p in PARTS)})")


def read_parts(folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple:
    """(transformer, vae, text_encoder, tokenizer) of a folder in their layout (a release, or one of our LingBot-VA
    checkpoints), on ``device`` in ``dtype``, in eval mode, frozen."""
    from diffusers import AutoencoderKLWan
    from transformers import AutoTokenizer, UMT5EncoderModel

    folder = Path(folder)
    _check_parts(folder)
    model = load_transformer(folder / "transformer", dtype=dtype, device=device)
    vae = AutoencoderKLWan.from_pretrained(folder / "vae", torch_dtype=dtype, use_safetensors=True).to(device).eval()
    encoder = UMT5EncoderModel.from_pretrained(folder / "text_encoder", torch_dtype=dtype, use_safetensors=True).to(device)
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    return model, vae.requires_grad_(False), encoder.eval().requires_grad_(False), tokenizer


def save_release(folder: str | Path, model: torch.nn.Module, vae, text_encoder, tokenizer,
                 attn_mode: str = "flashattn", weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write a release folder in their layout (what :func:`load_release` and their ``load_transformer`` read):
    transformer/config.json names their class and ``attn_mode`` (their server overrides it with ``torch``).
    ``weights``: the transformer's to write (e.g. with LoRA adapters merged in), else its own."""
    folder = Path(folder)
    write_transformer(folder / "transformer", model, weights, attn_mode)
    vae.save_pretrained(folder / "vae", safe_serialization=True)
    text_encoder.save_pretrained(folder / "text_encoder", safe_serialization=True)
    tokenizer.save_pretrained(folder / "tokenizer")
    return folder


def write_transformer(folder: Path, model: torch.nn.Module, weights: dict[str, torch.Tensor] | None = None,
                      attn_mode: str = "flashattn") -> Path:
    """Their transformer/ folder: config.json naming their class, and the weights (``weights``, else the model's)."""
    import json

    from safetensors.torch import save_file

    from agents.wam.lingbot_va.checkpoint import THEIR_CLASS, WEIGHTS

    folder.mkdir(parents=True)
    config = {"_class_name": THEIR_CLASS, **dict(model.config), "attn_mode": attn_mode}
    config["patch_size"] = list(config["patch_size"])
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if not k.startswith("_")
                                                     or k == "_class_name"}, indent=2))
    state = model.state_dict() if weights is None else weights
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / WEIGHTS))
    return folder
