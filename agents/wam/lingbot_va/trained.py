"""Our checkpoint directory of a LingBot-VA (what ``python -m training`` writes), the model a run starts from, and
the way back to their release layout.

    wam_config.json     the LingBotVAConfig ("architecture": "lingbot_va"; "inputs": {"name": <its convention>})
    transformer/        their layout (config.json naming their WanTransformer3DModel, diffusion_pytorch_model.safetensors):
                        the base weights, which their own load_transformer reads
    vae/ text_encoder/ tokenizer/   as a release holds them
    lora/               the transformer's peft adapters (agents/wam/lora.py, expert ``video``) when trained with LoRA
    dataset_stats.json  the training data's statistics: a record only (the convention's quantiles normalise)

A run starts from their release folder (``model.pretrained_path``; it must be of the preset's size) or, at a tiny
preset, from random weights. :func:`export_release` merges LoRA adapters into the weights they adapt and writes
their release folder, which :func:`~agents.wam.lingbot_va.release.load_release` and their server read.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from pathlib import Path

from agents.wam.architectures import CONFIG_FILE
from agents.wam.checkpoint import SavedKind, _require_dir, read_model_config
from agents.wam.errors import MissingCheckpointError
from agents.wam.lingbot_va.config import LingBotVAConfig
from agents.wam.lingbot_va.release import config_for, read_parts, save_release, write_transformer
from agents.wam.lingbot_va.wam import LingBotVA
from agents.wam.lora import base_state_dict, has_lora, load_lora, merged_state_dict, save_lora
from wam_gym.utils.publish import atomic_dir

# What of a VAE's config shapes its weights (its latent statistics are measured, and travel with its folder).
VAE_SHAPE = ("base_dim", "decoder_base_dim", "z_dim", "dim_mult", "num_res_blocks", "temperal_downsample",
             "is_residual", "patch_size", "in_channels", "out_channels")


def random_parts(config: LingBotVAConfig) -> dict:
    """A transformer, Wan2.2-style VAE, 2-layer UMT5 and byte-level tokenizer of the config's sizes, random weights
    (drawn in this order from torch's generator)."""
    from diffusers import AutoencoderKLWan
    from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

    from agents.wam.lingbot_va.model import LingBotVATransformer

    tokenizer = ByT5Tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=config.transformer.text_dim, d_kv=8,
                                               d_ff=32, num_layers=2, num_heads=2))
    vae = AutoencoderKLWan(**config.vae.vae_kwargs())
    transformer = LingBotVATransformer(**config.transformer.kwargs())
    return dict(model=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer)


def build_lingbot_va(config: LingBotVAConfig) -> LingBotVA:
    """The model a run trains: their release at ``config.pretrained_path`` (of the preset's size), or random
    weights at a tiny preset."""
    if config.pretrained_path is None:
        if not config.preset.endswith("_tiny"):
            raise MissingCheckpointError(
                f"model={config.preset} fine-tunes their released weights: set model.pretrained_path=<their release "
                "folder> (hf download robbyant/lingbot-va-posttrain-libero-long); model=lingbot_va_libero_tiny trains "
                "from random weights")
        parts = random_parts(config)
        return LingBotVA(config, parts["model"], parts["vae"], parts["text_encoder"], parts["tokenizer"])
    root = Path(config.pretrained_path).expanduser()
    _require_dir(root, "model.pretrained_path", "give their release folder as published (transformer/, vae/, ...)")
    found = config_for(config.convention(), root)
    mine, theirs = ({k: _listed(getattr(vae, k)) for k in VAE_SHAPE} for vae in (config.vae, found.vae))
    if found.transformer != config.transformer or mine != theirs:
        part = "transformer" if found.transformer != config.transformer else "vae"
        raise ValueError(f"model.pretrained_path={root} holds a {part} of another size than model={config.preset}'s "
                         f"({getattr(found, part)}): pick the preset of its size (lingbot_va: their release; "
                         "lingbot_va_libero_tiny: scripts/tiny_lingbot_va_release.py's)")
    transformer, vae, text_encoder, tokenizer = read_parts(root)
    return LingBotVA(config, transformer.requires_grad_(True), vae, text_encoder, tokenizer)


def _listed(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def save_lingbot_va(model: LingBotVA, directory: str | Path, extra_files: Mapping[str, str | Path] | None = None) -> Path:
    """Write our directory atomically (safetensors): the transformer's base weights in their layout, the frozen
    parts, LoRA adapters in ``lora/``, the config and ``extra_files`` (name -> source file), in one rename."""
    target = Path(directory)
    adapted = has_lora(model.transformer)
    with atomic_dir(target) as staging:
        for name, source in (extra_files or {}).items():
            shutil.copyfile(source, staging / name)
        write_transformer(staging / "transformer", model.transformer,
                          base_state_dict(model.transformer) if adapted else None)
        model.vae.save_pretrained(staging / "vae", safe_serialization=True)
        model.text_encoder.save_pretrained(staging / "text_encoder", safe_serialization=True)
        model.tokenizer.save_pretrained(str(staging / "tokenizer"))
        if adapted:
            save_lora(model, staging / "lora")
        model.config.save(staging / CONFIG_FILE)
    return target


SAVED = SavedKind("lingbot_va", "LingBot-VA", LingBotVAConfig, "python -m training",
                  "give a directory python -m training wrote", "python -m training",
                  "restore the file, or save the checkpoint again")


def load_lingbot_va(directory: str | Path, **overrides) -> LingBotVA:
    """Load what :func:`save_lingbot_va` wrote (adapters injected again, unmerged); ``overrides`` replace fields of
    the saved config that change no weights (``vae_micro_batch_size``)."""
    root = Path(directory).expanduser()
    config = dataclasses.replace(read_model_config(root, SAVED), **overrides)
    transformer, vae, text_encoder, tokenizer = read_parts(root)
    model = LingBotVA(config, transformer.requires_grad_(True), vae, text_encoder, tokenizer)
    if (root / "lora").is_dir():
        load_lora(model, root / "lora")
    return model


def export_release(directory: str | Path, folder: str | Path) -> Path:
    """Our checkpoint -> their release folder (transformer/, vae/, text_encoder/, tokenizer/): LoRA adapters merged
    into the weights they adapt, as their format holds none."""
    model = load_lingbot_va(directory)
    adapted = has_lora(model.transformer)
    weights = merged_state_dict(model.transformer) if adapted else None
    return save_release(folder, model.transformer, model.vae, model.text_encoder, model.tokenizer, weights=weights)

