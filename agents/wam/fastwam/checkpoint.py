"""FastWAM's released checkpoints in, ours out, and back to theirs.

Their file (``torch.save``): ``{"mot": <MoT state dict>, "proprio_encoder": <state dict>, "step": int,
"torch_dtype": "torch.bfloat16", ...}``. It is read with ``torch.load(weights_only=True)`` only, which
unpickles tensors, containers and numbers and refuses anything else (a file that needs more is refused
with the reason, never run). Every key is mapped through :mod:`agents.wam.fastwam.layout`; a missing,
unexpected or mis-shaped key is an error naming it, never a partial load. (Their own loader uses
``strict=False``.)

Our checkpoint is a directory like our MoT's (:mod:`agents.wam.checkpoint`), each component in its
library's format, safetensors only:

    wam_config.json     the FastWAMConfig ("architecture": "fastwam")
    transformer/        diffusers WanTransformer3DModel: the video expert, loadable by diffusers alone
    action_expert/      FastWAMActionDiT
    proprio_encoder/    ProprioEncoder
    vae/ text_encoder/ tokenizer/   the encoders (a converted release has them with --encoders)
    lora/               optional peft adapters (agents/wam/lora.py); their .pt gets them merged in
    dataset_stats.json  the statistics actions are un-normalised with (theirs, or training's)
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan
from safetensors import SafetensorError
from transformers import UMT5EncoderModel

from agents.wam import wan_adapter as wan
from agents.wam.checkpoint import (
    CONFIG_FILE,
    STATS_FILE,
    MissingCheckpointError,
    SavedKind,
    _require_dir,
    _require_weights,
    load_tokenizer,
    publish,
    read_model_config,
)
from agents.wam.fastwam import wan_original
from agents.wam.fastwam.action_dit import FastWAMActionDiT
from agents.wam.fastwam.config import FastWAMConfig
from agents.wam.fastwam.embeddings import ProprioEncoder
from agents.wam.fastwam.layout import CheckpointMismatchError, LayoutError, to_ours, to_theirs
from agents.wam.fastwam.model import BUILDERS, FastWAM
from agents.wam.fastwam.their_config import TheirArchitecture, read_shapes
from agents.wam.fastwam.their_stats import read_their_stats
from agents.wam.finite_weights import check_finite
from agents.wam.lora import load_lora, merged_state_dict
from agents.wam.precision import module_dtype
from wam_gym.utils.publish import atomic_dir, atomic_path

DENOISER = {"transformer": wan.WanTransformer3DModel, "action_expert": FastWAMActionDiT, "proprio_encoder": ProprioEncoder}
ENCODERS = {"vae": AutoencoderKLWan, "text_encoder": UMT5EncoderModel}
_PRECISION_GROUP = {"transformer": "backbone", "action_expert": "backbone", "proprio_encoder": "projectors",
                    "vae": "vae", "text_encoder": "text_encoder"}


# ----------------------------------------------------------------------------- their file
def read_their_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Their ``.pt`` -> flat tensors in their layout (``mot.<key>``, ``proprio_encoder.<key>``), on the CPU: every
    value a floating tensor holding no NaN or inf, else refused naming it."""
    path = Path(path).expanduser()
    if not path.is_file():
        what = "a directory" if path.is_dir() else "not a file"
        raise MissingCheckpointError(f"{path} is {what}; pass FastWAM's checkpoint (.pt), e.g. its LIBERO release")
    payload = wan_original.read_torch_file(path, "a FastWAM checkpoint is a dict of state dicts: re-save it with "
                                                 "torch.save({'mot': model.mot.state_dict(), ...})")
    if not isinstance(payload, Mapping) or "mot" not in payload:
        found = sorted(map(str, payload)) if isinstance(payload, Mapping) else type(payload).__name__
        raise MissingCheckpointError(
            f"{path} is not a FastWAM checkpoint: it needs a 'mot' entry (found {found}); a legacy 'dit'-only "
            "file holds the video expert alone and is not loaded"
        )
    flat = {}
    for group in ("mot", "proprio_encoder"):
        state = payload.get(group, {})
        if not isinstance(state, Mapping):
            raise CheckpointMismatchError(f"{path}: its '{group}' entry is a {type(state).__name__}, not a state dict; "
                                          "re-save it with torch.save({'mot': model.mot.state_dict(), ...})")
        flat.update({f"{group}.{k}": v for k, v in state.items()})
    _check_tensors(flat, path)
    return flat


def _check_tensors(flat: Mapping[str, object], path: Path) -> None:
    """Every value a floating-point tensor (weights), none holding NaN or inf."""
    for key, value in flat.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointMismatchError(f"{path}: {key} is a {type(value).__name__}, not a tensor; it is not a FastWAM "
                                          "checkpoint (their .pt's 'mot' and 'proprio_encoder' are state dicts of tensors)")
        if not value.is_floating_point():
            raise CheckpointMismatchError(f"{path}: {key} is {value.dtype}, and a FastWAM's weights are floating point; "
                                          "re-save it from the trained model (its state_dict, not a quantised copy)")
    check_finite(flat, path, "their model diverged or the file is damaged: convert an earlier checkpoint of the run")


def their_state(model: FastWAM) -> dict[str, torch.Tensor]:
    """The model's denoiser weights in their flat layout."""
    return {to_theirs(f"{name}.{key}"): value for name in DENOISER for key, value in getattr(model, name).state_dict().items()}


def export_their_checkpoint(model: FastWAM, path: str | Path, step: int | None = None) -> Path:
    """Write the model's denoiser as their ``.pt``, which their ``FastWAM.load_checkpoint`` loads."""
    return write_their_checkpoint(their_state(model), path, step)


def write_their_checkpoint(flat: Mapping[str, torch.Tensor], path: str | Path, step: int | None = None) -> Path:
    """Flat weights in their layout -> their ``.pt``: ``{"mot", "proprio_encoder", "step", "torch_dtype"}``."""
    groups = {"mot": {}, "proprio_encoder": {}}
    for key, value in flat.items():
        group, _, inner = key.partition(".")
        groups[group][inner] = value.detach().cpu().contiguous()
    payload = {**groups, "step": step, "torch_dtype": str(next(iter(groups["mot"].values())).dtype)}
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, and their checkpoint is one file: name the .pt to write "
                                f"(e.g. {path / 'fastwam.pt'})")
    with atomic_path(path) as tmp:  # a crash leaves the old file or the new one, never half of one, nor a temp file
        torch.save(payload, tmp)
    return path


# ----------------------------------------------------------------------------- mapping onto a model
def _our_states(flat: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    states: dict[str, dict[str, torch.Tensor]] = {name: {} for name in DENOISER}
    unknown = []
    for key, value in flat.items():
        try:
            component, _, inner = to_ours(key).partition(".")
        except LayoutError:
            unknown.append(key)
            continue
        states[component][inner] = value
    if unknown:
        raise CheckpointMismatchError(f"{len(unknown)} key(s) of the checkpoint have no place in FastWAM: {_names(unknown)}; "
                                      "it is another model's (or was edited): convert the .pt FastWAM's training wrote")
    return states


def _names(keys: list[str], limit: int = 10) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _check(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor], component: str) -> list[str]:
    problems = []
    if missing := sorted(set(expected) - set(given)):
        problems.append(f"missing {_names([to_theirs(f'{component}.{k}') for k in missing])}")
    if unexpected := sorted(set(given) - set(expected)):
        problems.append(f"unexpected {_names([to_theirs(f'{component}.{k}') for k in unexpected])}")
    wrong = [f"{to_theirs(f'{component}.{k}')} is {tuple(given[k].shape)}, the model needs {tuple(v.shape)}"
             for k, v in expected.items() if k in given and given[k].shape != v.shape]
    if wrong:
        problems.append("shape " + "; ".join(wrong[:10]))
    return problems


def load_their_state(model: FastWAM, flat: Mapping[str, torch.Tensor]) -> FastWAM:
    """Load their flat weights into the model's denoiser, every key or none."""
    _load_denoiser({name: getattr(model, name) for name in DENOISER}, flat, model.config.preset)
    return model


def _load_denoiser(components: Mapping[str, torch.nn.Module], flat: Mapping[str, torch.Tensor], what: str) -> None:
    """Map and load every key; components built on the meta device get the tensors themselves (no second
    copy, in their dtype if they were cast to it), and the Wan RoPE tables are then built afresh."""
    states = _our_states(flat)
    problems = []
    for name, module in components.items():
        problems += [f"{name}: {p}" for p in _check(module.state_dict(), states[name], name)]
    if problems:
        raise CheckpointMismatchError(f"the checkpoint does not fit {what}: " + " | ".join(problems) + "; pass the config "
                                      "of the run that wrote it (--their-config) or the preset of its size, or convert "
                                      "an unedited .pt")
    for name, module in components.items():
        expected = module.state_dict()
        on_meta = any(p.is_meta for p in module.parameters())
        module.load_state_dict({k: v.to(expected[k].dtype) for k, v in states[name].items()}, strict=True, assign=on_meta)
    transformer = components["transformer"]
    if any(b.is_meta for b in transformer.buffers()):
        wan.rebuild_rotary(transformer)  # non-persistent: no checkpoint holds them


def _denoiser_on_meta(config: FastWAMConfig, dtype: torch.dtype | None = None) -> dict[str, torch.nn.Module]:
    """The denoiser's components without memory (their weights will be a checkpoint's tensors)."""
    with torch.device("meta"):
        components = {name: build(config) for name, build in BUILDERS.items()}
    return components if dtype is None else {name: module.to(dtype) for name, module in components.items()}


def their_model_config(flat: Mapping[str, torch.Tensor], architecture: FastWAMConfig | TheirArchitecture) -> FastWAMConfig:
    """The config a checkpoint (their flat layout) loads into: read from it (a :class:`TheirArchitecture`: sizes
    from its shapes, the rest from their config, a preset or flags), or a given config with the checkpoint's
    action and proprio sizes. Either way a checkpoint whose sizes contradict the input convention is refused."""
    if isinstance(architecture, TheirArchitecture):
        return architecture.config(flat)
    shapes = read_shapes(flat)
    architecture.inputs.check_fits(shapes.action_dim, shapes.state_dim, None, "the checkpoint")
    return dataclasses.replace(architecture, action_dim=shapes.action_dim, state_dim=shapes.state_dim)


def from_their_checkpoint(
    path: str | Path, architecture: FastWAMConfig | TheirArchitecture, encoders_from: str | Path | None = None
) -> FastWAM:
    """A FastWAM with their checkpoint's weights, of the config :func:`their_model_config` gives. The VAE,
    UMT5 and tokenizer (not in their file) come from ``encoders_from`` (:func:`_load_encoders`: Wan2.2-TI2V-5B's
    own folder, as their loader reads it, or its diffusers folder), else they are built with random weights."""
    flat = read_their_checkpoint(path)
    config = their_model_config(flat, architecture)
    encoders = {} if encoders_from is None else _load_encoders(Path(encoders_from).expanduser(), config)
    # In the backbone's dtype from the start: a bf16 release is never upcast whole to fp32 on the way in.
    denoiser = _denoiser_on_meta(config, dtype=module_dtype(config.encoder_mode.backbone))
    _load_denoiser(denoiser, flat, config.preset)
    return FastWAM(config, **denoiser, **encoders)


def convert_their_checkpoint(
    path: str | Path, directory: str | Path, architecture: FastWAMConfig | TheirArchitecture,
    stats: str | Path | None = None, encoders_from: str | Path | None = None,
) -> Path:
    """Their ``.pt`` -> our checkpoint directory (wam_config.json, transformer/, action_expert/,
    proprio_encoder/; safetensors, in the checkpoint's own dtype), of the config :func:`their_model_config`
    gives. ``stats``: their ``dataset_stats.json``, kept as the directory's (evaluation un-normalises with it).
    ``encoders_from``: a Wan2.2-TI2V-5B diffusers folder whose ``vae/``, ``text_encoder/`` and ``tokenizer/`` are
    copied in (their file has none), so the directory is a whole model; else :func:`load_fastwam` takes them
    from such a folder when loading."""
    their_stats = read_their_stats(stats) if stats is not None else None  # before the weights: it is quick
    flat = read_their_checkpoint(path)
    config = their_model_config(flat, architecture)
    if their_stats is not None:
        their_stats.check_fits(config.action_dim, config.state_dim)
    denoiser = _denoiser_on_meta(config, dtype=next(iter(flat.values())).dtype)
    _load_denoiser(denoiser, flat, config.preset)
    wan = Path(encoders_from).expanduser() if encoders_from else None
    folders = _encoder_folders(wan) if wan is not None and not is_wan_original(wan) else {}
    encoders = _load_encoders(wan, config) if wan is not None and not folders else {}
    target = Path(directory)
    with atomic_dir(target) as staging:
        tokenizer = encoders.pop("tokenizer", None)
        for name, module in {**denoiser, **encoders}.items():
            module.save_pretrained(str(staging / name), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(staging / "tokenizer"))
        for name, folder in folders.items():  # already diffusers/transformers folders: copied as they are
            shutil.copytree(folder, staging / name)
        if stats is not None:
            shutil.copyfile(stats, staging / STATS_FILE)
        config.save(staging / CONFIG_FILE)
    return target


def is_wan_original(root: Path) -> bool:
    """Whether a folder is Wan's own release layout (Wan2.2_VAE.pth, ...) rather than its diffusers one."""
    return (root / wan_original.VAE_FILE).is_file()


def _encoder_folders(root: Path) -> dict[str, Path]:
    """The encoder folders of a Wan2.2-TI2V-5B diffusers directory, each checked to hold safetensors weights."""
    _require_dir(root, "encoders_from", _ENCODERS_HELP)
    for name in ENCODERS:
        _require_weights(root / name, root)
    _require_dir(root / "tokenizer", "tokenizer folder", f"{root} lacks tokenizer/: copy the whole diffusers folder")
    return {name: root / name for name in (*ENCODERS, "tokenizer")}


_ENCODERS_HELP = ("pass Wan-AI/Wan2.2-TI2V-5B's own folder (Wan2.2_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth, "
                  "google/umt5-xxl/: what FastWAM's loader reads) or its diffusers folder (vae/, text_encoder/, tokenizer/)")


def _load_encoders(root: Path, config: FastWAMConfig) -> dict:
    """The VAE, UMT5 and tokenizer from Wan2.2-TI2V-5B's own folder (their original layout, mapped by
    :mod:`agents.wam.fastwam.wan_original`) or from its diffusers folder."""
    _require_dir(root, "encoders_from", _ENCODERS_HELP)
    if is_wan_original(root):
        dtypes = tuple(module_dtype(getattr(config.encoder_mode, _PRECISION_GROUP[n])) for n in ENCODERS)
        encoders = wan_original.load_encoders(root, config.vae, config.text_encoder, dtypes)
        for name in ENCODERS:
            check_finite(encoders[name].state_dict(), f"{root} ({name})")
        return encoders
    parts = {name: _load(name, root / name, config) for name in ENCODERS}
    parts["tokenizer"] = load_tokenizer(root / "tokenizer")
    return parts


# ----------------------------------------------------------------------------- our directory
def build_fastwam(config: FastWAMConfig) -> FastWAM:
    """A model to train from ``config``: random weights at the tiny size; the released size trains from
    their weights only (``init_from``), never from scratch."""
    if config.preset != "fastwam_tiny":
        raise MissingCheckpointError(
            f"model={config.preset} fine-tunes FastWAM's released weights: convert them (python "
            "scripts/convert_fastwam_checkpoint.py to-ours <their .pt> DIR --inputs fastwam_libero --preset fastwam "
            "--encoders <Wan2.2-TI2V-5B-Diffusers>) and "
            "set init_from=DIR (model=fastwam_tiny trains from random weights)")
    return FastWAM(config)


def save_fastwam(
    model: FastWAM, directory: str | Path, extra_files: Mapping[str, str | Path] | None = None, encoders: bool = True,
) -> Path:
    """Write our checkpoint directory atomically (safetensors): the denoiser, with ``encoders`` the VAE, UMT5
    and tokenizer, LoRA adapters in ``lora/`` (the base weights under their plain names), and ``extra_files``
    (name -> source file, e.g. training's dataset_stats.json), all published in one rename."""
    encoder_parts = (*ENCODERS, "tokenizer") if encoders else ()
    return publish(model, directory, (*DENOISER, *encoder_parts), extra_files)


SAVED = SavedKind("fastwam", "FastWAM", FastWAMConfig, "scripts/convert_fastwam_checkpoint.py to-ours or python -m training",
                  "convert one with scripts/convert_fastwam_checkpoint.py", "to-ours",
                  "re-convert the checkpoint, or restore the file")


def _our_config(root: Path) -> FastWAMConfig:
    return read_model_config(root, SAVED)


def read_our_checkpoint(directory: str | Path) -> dict[str, torch.Tensor]:
    """Our directory's denoiser weights in their flat layout (no encoders are built); LoRA adapters
    (``lora/``) merged into the weights they adapt, as their format has no adapters."""
    root = Path(directory).expanduser()
    config = _our_config(root)
    parts = {name: _load(name, root / name, config) for name in DENOISER}
    if (root / "lora").is_dir():
        experts = torch.nn.Module()  # load_lora finds the experts by their attribute names
        experts.transformer, experts.action_expert = parts["transformer"], parts["action_expert"]
        load_lora(experts, root / "lora")
        states = {name: merged_state_dict(module) for name, module in parts.items()}
    else:
        states = {name: module.state_dict() for name, module in parts.items()}
    return {to_theirs(f"{name}.{key}"): value for name, state in states.items() for key, value in state.items()}


def load_fastwam(directory: str | Path, encoders_from: str | Path | None = None, **overrides) -> FastWAM:
    """Load what :func:`save_fastwam` wrote. Encoders: the directory's own, else ``encoders_from``'s
    (a Wan2.2-TI2V-5B diffusers folder), else random weights. ``overrides`` replace fields of the saved
    config that change no weights (``video_mode``, ``encoder_mode``, ``sampler_precision``)."""
    root = Path(directory).expanduser()
    config = dataclasses.replace(_our_config(root), **overrides)
    parts = {name: _load(name, root / name, config) for name in DENOISER}
    source = root if (root / "vae").is_dir() else (Path(encoders_from).expanduser() if encoders_from else None)
    if source is not None:
        parts.update(_load_encoders(source, config))
    model = FastWAM(config, **parts)
    if (root / "lora").is_dir():
        load_lora(model, root / "lora")
    return model


def _load(name: str, folder: Path, config: FastWAMConfig) -> torch.nn.Module:
    _require_weights(folder, folder.parent)
    dtype = module_dtype(getattr(config.encoder_mode, _PRECISION_GROUP[name]))
    try:
        module = {**DENOISER, **ENCODERS}[name].from_pretrained(
            str(folder), torch_dtype=dtype, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise MissingCheckpointError(f"{folder} cannot be loaded ({_one_line(exc)}); re-convert or copy the checkpoint "
                                     "again") from exc
    check_finite(module.state_dict(), folder)
    return module


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
