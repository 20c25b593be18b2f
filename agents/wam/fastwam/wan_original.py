"""Wan's original-layout encoder files, as FastWAM's loader reads them, into diffusers' and transformers' classes.

FastWAM loads its VAE and text encoder from Wan's own release (Wan-AI/Wan2.2-TI2V-5B):

    Wan2.2_VAE.pth                        the state dict of Wan's VideoVAE38_ (optionally under "model_state")
    models_t5_umt5-xxl-enc-bf16.pth       the state dict of Wan's T5 encoder (UMT5-XXL)
    google/umt5-xxl/                      the tokenizer (transformers' files)

Both ``.pth`` files are read with ``torch.load(weights_only=True)`` only (tensors and containers; anything
else is refused, never run); a ``.safetensors`` file of the same layout is read too. Every key is renamed
to diffusers' ``AutoencoderKLWan`` or transformers' ``UMT5EncoderModel`` by the rules below, and loaded with
``strict=True``: a key without a rule, or one the model does not have, is an error naming it.
Parity with their code: tests/test_fastwam_parity.py (fixture: scripts/fastwam_encoders_reference.py).
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file
from transformers import UMT5Config, UMT5EncoderModel

from agents.wam.checkpoint import MissingCheckpointError, load_tokenizer
from agents.wam.config import TextEncoderConfig, VAEConfig

VAE_FILE, T5_FILE, TOKENIZER_DIR = "Wan2.2_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", "google/umt5-xxl"


class WanLayoutError(ValueError):
    """A key of a Wan original-layout file has no place in the diffusers/transformers model."""


# ----------------------------------------------------------------------------- the VAE
# Inside a residual block: Wan's Sequential indices -> diffusers' names.
_RESNET = {"residual.0.gamma": "norm1.gamma", "residual.2.weight": "conv1.weight", "residual.2.bias": "conv1.bias",
           "residual.3.gamma": "norm2.gamma", "residual.6.weight": "conv2.weight", "residual.6.bias": "conv2.bias",
           "shortcut.weight": "conv_shortcut.weight", "shortcut.bias": "conv_shortcut.bias"}
_TOP = {"conv1.weight": "quant_conv.weight", "conv1.bias": "quant_conv.bias",
        "conv2.weight": "post_quant_conv.weight", "conv2.bias": "post_quant_conv.bias"}


def vae_key(key: str, num_res_blocks: int) -> str:
    """A key of Wan's VideoVAE38_ -> AutoencoderKLWan's. Stage ``i`` of the encoder holds ``num_res_blocks``
    residual blocks then its resampler; the decoder's one residual block more."""
    if key in _TOP:
        return _TOP[key]
    part, _, rest = key.partition(".")
    if part not in ("encoder", "decoder"):
        raise WanLayoutError(key)
    if m := re.fullmatch(r"conv1\.(weight|bias)", rest):
        return f"{part}.conv_in.{m[1]}"
    if m := re.fullmatch(r"head\.0\.gamma", rest):
        return f"{part}.norm_out.gamma"
    if m := re.fullmatch(r"head\.2\.(weight|bias)", rest):
        return f"{part}.conv_out.{m[1]}"
    if m := re.fullmatch(r"middle\.1\.(.+)", rest):
        return f"{part}.mid_block.attentions.0.{m[1]}"
    if m := re.fullmatch(r"middle\.([02])\.(.+)", rest):
        return f"{part}.mid_block.resnets.{int(m[1]) // 2}.{_resnet(m[2], key)}"
    if m := re.fullmatch(r"(downsamples|upsamples)\.(\d+)\.\1\.(\d+)\.(.+)", rest):
        kind, stage, index, inner = m[1], int(m[2]), int(m[3]), m[4]
        blocks = num_res_blocks + (kind == "upsamples")
        group = "down_blocks" if kind == "downsamples" else "up_blocks"
        if index < blocks:
            return f"{part}.{group}.{stage}.resnets.{index}.{_resnet(inner, key)}"
        if index == blocks and inner.startswith(("resample.", "time_conv.")):
            return f"{part}.{group}.{stage}.{'downsampler' if kind == 'downsamples' else 'upsampler'}.{inner}"
    raise WanLayoutError(key)


def _resnet(inner: str, key: str) -> str:
    if inner not in _RESNET:
        raise WanLayoutError(key)
    return _RESNET[inner]


def load_vae(path: str | Path, config: VAEConfig, dtype: torch.dtype = torch.float32) -> AutoencoderKLWan:
    """``Wan2.2_VAE.pth`` (or a safetensors file of its layout) as diffusers' AutoencoderKLWan of ``config``'s
    geometry (the Wan2.2 preset's: 48 channels, decoder 256 wide, Wan2.2's latent statistics)."""
    state = read_weights(path)
    state = state.get("model_state", state) if isinstance(state.get("model_state"), dict) else state
    renamed = _renamed(state, lambda key: vae_key(key, config.num_res_blocks), path)
    vae = AutoencoderKLWan(**config.vae_kwargs())
    _load_strict(vae, renamed, path)
    return (vae if dtype == torch.float32 else vae.to(dtype)).eval()


# ----------------------------------------------------------------------------- the text encoder
_T5_BLOCK = {"norm1.weight": "layer.0.layer_norm.weight", "attn.q.weight": "layer.0.SelfAttention.q.weight",
             "attn.k.weight": "layer.0.SelfAttention.k.weight", "attn.v.weight": "layer.0.SelfAttention.v.weight",
             "attn.o.weight": "layer.0.SelfAttention.o.weight",
             "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
             "norm2.weight": "layer.1.layer_norm.weight", "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
             "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight", "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight"}


def umt5_key(key: str) -> str:
    """A key of Wan's T5 encoder -> UMT5EncoderModel's (UMT5: a relative position bias in every layer; the
    gated feed-forward's GELU branch is ``wi_0``)."""
    if key == "token_embedding.weight":
        return "shared.weight"
    if key == "norm.weight":
        return "encoder.final_layer_norm.weight"
    if (m := re.fullmatch(r"blocks\.(\d+)\.(.+)", key)) and m[2] in _T5_BLOCK:
        return f"encoder.block.{m[1]}.{_T5_BLOCK[m[2]]}"
    raise WanLayoutError(key)


def load_umt5(path: str | Path, config: TextEncoderConfig, dtype: torch.dtype = torch.float32) -> UMT5EncoderModel:
    """``models_t5_umt5-xxl-enc-bf16.pth`` (or a safetensors file of its layout) as UMT5EncoderModel; its
    vocabulary size is the file's."""
    renamed = _renamed(read_weights(path), umt5_key, path)
    renamed["encoder.embed_tokens.weight"] = renamed["shared.weight"]  # tied, as in transformers' own files
    vocab = renamed["shared.weight"].shape[0]
    model = UMT5EncoderModel(UMT5Config(vocab_size=vocab, d_model=config.d_model, d_kv=config.d_kv, d_ff=config.d_ff,
                                        num_layers=config.num_layers, num_heads=config.num_heads))
    _load_strict(model, renamed, path)
    return (model if dtype == torch.float32 else model.to(dtype)).eval()


def load_encoders(root: str | Path, vae: VAEConfig, text: TextEncoderConfig, dtypes: tuple[torch.dtype, torch.dtype]
                  ) -> dict:
    """A Wan2.2-TI2V-5B original folder's VAE, text encoder and tokenizer (the names of :data:`VAE_FILE`,
    :data:`T5_FILE` and :data:`TOKENIZER_DIR` inside it)."""
    root = Path(root).expanduser()
    missing = [name for name in (VAE_FILE, T5_FILE, TOKENIZER_DIR) if not (root / name).exists()]
    if missing:
        raise MissingCheckpointError(f"{root} lacks {', '.join(missing)}: pass Wan-AI/Wan2.2-TI2V-5B's own folder "
                                     "(the one FastWAM's loader reads), or --encoders with its diffusers folder")
    return {"vae": load_vae(root / VAE_FILE, vae, dtypes[0]), "text_encoder": load_umt5(root / T5_FILE, text, dtypes[1]),
            "tokenizer": load_tokenizer(root / TOKENIZER_DIR)}


# ----------------------------------------------------------------------------- shared
def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A ``.pth``/``.pt`` (tensors and containers only) or ``.safetensors`` file's state dict."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MissingCheckpointError(f"{path} is not a file")
    if path.suffix == ".safetensors":
        return load_file(str(path))
    payload = read_torch_file(path, "re-save its state dict")
    if not isinstance(payload, dict):
        raise MissingCheckpointError(f"{path} holds a {type(payload).__name__}, not a state dict")
    return payload


def read_torch_file(path: Path, fix: str):
    """A ``torch.save`` file from another project, unpickling tensors, containers and numbers only (anything
    else is refused with the reason, never run): FastWAM's checkpoints and Wan's ``.pth`` files."""
    if not zipfile.is_zipfile(path):  # torch.save's archive; an empty, cut-short or foreign file is not one
        raise MissingCheckpointError(f"{path} is not a torch.save archive ({path.stat().st_size} bytes: empty, cut short "
                                     "or another kind of file); download or copy it again")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line), lines[0] if lines else "")
        raise MissingCheckpointError(f"{path} holds more than tensors and containers, and is not unpickled "
                                     f"({reason}); {fix}") from exc
    except (RuntimeError, EOFError, OSError) as exc:
        raise MissingCheckpointError(f"{path} cannot be read as a torch.save file ({' '.join(str(exc).split())}); it is "
                                     "truncated or not a checkpoint: download or copy it again") from exc


def _renamed(state: dict[str, torch.Tensor], rule, path) -> dict[str, torch.Tensor]:
    renamed, unknown = {}, []
    for key, value in state.items():
        try:
            renamed[rule(key)] = value
        except WanLayoutError:
            unknown.append(key)
    if unknown:
        raise WanLayoutError(f"{path}: {len(unknown)} key(s) have no place in the model: {', '.join(sorted(unknown)[:8])}")
    return renamed


def _load_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], path) -> None:
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [f"{k} {tuple(state[k].shape)} (needs {tuple(v.shape)})" for k, v in expected.items()
             if k in state and state[k].shape != v.shape]
    if missing or unexpected or wrong:
        raise WanLayoutError(f"{path} does not fit {type(model).__name__}: missing {missing[:5]}, unexpected "
                             f"{unexpected[:5]}, shapes {wrong[:5]}; check the preset's vae.* / text_encoder.* sizes")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)
