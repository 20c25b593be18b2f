"""Which FastWAMConfig one of their checkpoints is: its sizes from its tensors, the rest from their config.

Their ``.pt`` holds weights only. Its shapes tell every size (:class:`Shapes`): the layers, the experts'
widths, the attention's width (heads x head size), the feed-forwards, the latent channels and patch, the text
and timestep feature sizes, the action and state sizes. What no shape tells comes, first that has it, from

1. the converter's flags (``given``: ``--heads``, ``--num-frames``, ... :data:`FLAGS`);
2. their config file: the ``config.yaml`` their training writes into its output_dir (``run_training``: the
   resolved Hydra config; the checkpoints are ``checkpoints/weights/step_N.pt`` below it), whose sizes are
   checked against the shapes;
3. or a preset (:mod:`agents.wam.fastwam.config`; ``fastwam`` transcribes their released LIBERO model's
   configs), whose sizes the checkpoint must have.

A value none of them tells is refused in one line that names its flag. The input convention is never
guessed: nothing in their files records how the frames were turned or the gripper signed (their evaluation
script does it), so it is named (``inputs``) and checked against the sizes
(:meth:`~agents.wam.fastwam.inputs.FastWAMInputs.check_fits`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agents.wam.config import BackboneConfig, TextEncoderConfig, VAEConfig
from agents.wam.fastwam.config import FastWAMActionConfig, FastWAMConfig, FlowScheduleConfig, preset
from agents.wam.fastwam.inputs import convention
from agents.wam.fastwam.layout import CheckpointMismatchError
from agents.wam.precision import PrecisionConfig

# What no shape tells, and the converter flag that gives it.
FLAGS = {"heads": "--heads", "num_frames": "--num-frames", "action_video_freq_ratio": "--action-video-freq-ratio",
         "text_tokens": "--text-tokens", "shifts": "--shifts", "image_size": "--image-size", "cameras": "--cameras"}
_VIDEO, _ACTION = "mot.mixtures.video.", "mot.mixtures.action."
# Wan2.2-TI2V-5B's latent channels and UMT5-XXL's width: the encoders every run of theirs loads
_WAN22 = (48, 4096)


@dataclass(frozen=True)
class Shapes:
    """The sizes a checkpoint's tensors tell."""

    layers: int
    width: int  # of the video expert, which is its attention's (diffusers' Wan: heads x head size)
    action_width: int
    in_channels: int
    out_channels: int
    patch_size: tuple[int, int, int]
    ffn: int
    action_ffn: int
    text_dim: int
    freq_dim: int
    action_freq_dim: int
    action_dim: int
    state_dim: int


def _shape(flat: Mapping[str, torch.Tensor], key: str) -> tuple[int, ...]:
    if key not in flat:
        raise CheckpointMismatchError(f"the checkpoint lacks {key}: it is not a FastWAM of theirs (their .pt's 'mot' "
                                      "and 'proprio_encoder' state dicts): pass their release or a .pt their training wrote")
    return tuple(flat[key].shape)


def _layers(flat: Mapping[str, torch.Tensor], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"blocks\.(\d+)\.self_attn\.q\.weight")
    return len({m.group(1) for key in flat if (m := pattern.fullmatch(key))})


def read_shapes(flat: Mapping[str, torch.Tensor]) -> Shapes:
    """The sizes of a checkpoint in their flat layout (``mot.<key>``, ``proprio_encoder.<key>``)."""
    def dim(key: str, axis: int) -> int:
        return _shape(flat, key)[axis]

    patch = _shape(flat, _VIDEO + "patch_embedding.weight")  # a Conv3d: (width, channels, *patch)
    shapes = Shapes(
        layers=_layers(flat, _VIDEO), width=patch[0], action_width=dim(_ACTION + "action_encoder.weight", 0),
        in_channels=patch[1], out_channels=dim(_VIDEO + "head.head.weight", 0) // math.prod(patch[2:]),
        patch_size=patch[2:], ffn=dim(_VIDEO + "blocks.0.ffn.0.weight", 0), action_ffn=dim(_ACTION + "blocks.0.ffn.0.weight", 0),
        text_dim=dim(_VIDEO + "text_embedding.0.weight", 1), freq_dim=dim(_VIDEO + "time_embedding.0.weight", 1),
        action_freq_dim=dim(_ACTION + "time_embedding.0.weight", 1), action_dim=dim(_ACTION + "action_encoder.weight", 1),
        state_dim=dim("proprio_encoder.weight", 1),
    )
    attention = dim(_VIDEO + "blocks.0.self_attn.q.weight", 0)
    mixed = {"its video expert's attention width": (attention, shapes.width),
             "the action DiT's attention width": (dim(_ACTION + "blocks.0.self_attn.q.weight", 0), attention),
             "the action DiT's layers": (_layers(flat, _ACTION), shapes.layers)}
    if wrong := [f"{what} is {got}, not {want}" for what, (got, want) in mixed.items() if got != want]:
        raise CheckpointMismatchError(f"the checkpoint does not fit FastWAM ({'; '.join(wrong)}): wam_gym's video expert "
                                      "(diffusers' Wan) is as wide as its attention, which the action DiT shares layer by layer")
    return shapes


def config_shapes(config: FastWAMConfig) -> Shapes:
    """The sizes a config builds, as :func:`read_shapes` reads them."""
    bb, ax = config.backbone, config.action_expert
    return Shapes(
        layers=bb.num_layers, width=bb.num_attention_heads * bb.attention_head_dim, action_width=ax.dim,
        in_channels=bb.in_channels, out_channels=bb.out_channels, patch_size=tuple(bb.patch_size), ffn=bb.ffn_dim,
        action_ffn=ax.ffn_dim, text_dim=bb.text_dim, freq_dim=bb.freq_dim, action_freq_dim=ax.freq_dim,
        action_dim=config.action_dim, state_dim=config.state_dim,
    )


def read_their_config(path: str | Path) -> dict[str, Any]:
    """Their ``config.yaml`` (what their training writes: the resolved Hydra config) as plain data."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--their-config {path} is not a file; pass the config.yaml their training wrote into "
                                "the run's output_dir")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (yaml.YAMLError, UnicodeDecodeError, OmegaConfBaseException) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise ValueError(f"{path} is not a readable YAML config ({reason}); pass the config.yaml their training wrote "
                         "into the run's output_dir") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ValueError(f"{path} is not their training config (it has no 'model' section); pass the config.yaml "
                         "their training wrote into the run's output_dir")
    return data


@dataclass
class TheirArchitecture:
    """How to tell the config of one of their checkpoints (see the module docstring)."""

    inputs: str  # the input convention's name (agents/wam/fastwam/inputs.py CONVENTIONS): nothing in their files says it
    their_config: Mapping[str, Any] | None = None  # their config.yaml (read_their_config), or none
    preset: str | None = None  # a preset the checkpoint is the size of, for the values its shapes do not tell
    given: Mapping[str, Any] = field(default_factory=dict)  # flag values by FLAGS name (shifts: (video, action))

    def __post_init__(self) -> None:
        if self.their_config is not None and self.preset is not None:
            raise ValueError("both their config and a preset describe the checkpoint: pass one (--their-config or --preset)")
        if unknown := sorted(set(self.given) - set(FLAGS)):
            raise ValueError(f"unknown architecture value(s) {unknown}; known: {sorted(FLAGS)}")
        convention(self.inputs)  # an unknown name is refused before the checkpoint is read

    def config(self, flat: Mapping[str, torch.Tensor], source: str = "the checkpoint") -> FastWAMConfig:
        """The config of ``flat`` (their layout): sizes from its shapes, the rest from the sources."""
        shapes, inputs = read_shapes(flat), convention(self.inputs)
        values = their_values(self.their_config, shapes) if self.their_config is not None else {}
        if inputs.cameras is not None:  # the env cameras it reads (their config names their dataset's keys)
            values["cameras"] = inputs.cameras
        values.update(_values(self.given))
        if self.preset is not None:
            base = preset(self.preset)
            _check_preset_size(base, shapes, self.preset, source)
        else:
            _require(values, source)
            base = sized(shapes)
        config = dataclasses.replace(with_values(base, values), inputs=inputs, action_dim=shapes.action_dim,
                                     state_dim=shapes.state_dim)
        inputs.check_fits(shapes.action_dim, shapes.state_dim, values.get("num_cameras", len(config.cameras)), source)
        return config


def _values(given: Mapping[str, Any]) -> dict[str, Any]:
    """Flag values as config values: ``shifts`` (video, action) sets each schedule's train and inference shift."""
    values = {k: v for k, v in given.items() if v is not None and k != "shifts"}
    if given.get("shifts") is not None:
        video, action = given["shifts"]
        values["video_schedule"], values["action_schedule"] = FlowScheduleConfig(video, video), FlowScheduleConfig(action, action)
    return values


def _require(values: Mapping[str, Any], source: str) -> None:
    needed = {"heads", "num_frames", "action_video_freq_ratio", "text_tokens", "video_schedule", "image_size", "cameras"}
    if missing := sorted("shifts" if name == "video_schedule" else name for name in needed - set(values)):
        flags = ", ".join(FLAGS[name] for name in missing)
        raise ValueError(f"{source}'s shapes do not tell its {', '.join(missing)}: pass --their-config (the config.yaml "
                         f"its run wrote), --preset fastwam (their released LIBERO model) or {flags}")


def _check_preset_size(base: FastWAMConfig, shapes: Shapes, name: str, source: str) -> None:
    want = vars(dataclasses.replace(config_shapes(base), action_dim=shapes.action_dim, state_dim=shapes.state_dim))
    if wrong := [f"{size} {getattr(shapes, size)}, not {want[size]}" for size in want if getattr(shapes, size) != want[size]]:
        raise CheckpointMismatchError(f"{source} is not the {name} preset's size ({'; '.join(wrong)}): pass --their-config "
                                      f"(the config.yaml its run wrote) or the flags ({', '.join(FLAGS.values())}) instead")


def sized(shapes: Shapes) -> FastWAMConfig:
    """A config of ``shapes``' sizes, one head as wide as the attention until :func:`with_values` splits it. At
    their encoders' sizes it takes the ``fastwam`` preset's (Wan2.2's VAE, UMT5-XXL, bf16), else random test ones."""
    release = preset("fastwam")
    wan = (shapes.in_channels, shapes.text_dim) == _WAN22
    return FastWAMConfig(
        preset="fastwam" if wan else "fastwam_tiny",
        backbone=BackboneConfig(
            num_attention_heads=1, attention_head_dim=shapes.width, in_channels=shapes.in_channels,
            out_channels=shapes.out_channels, text_dim=shapes.text_dim, freq_dim=shapes.freq_dim, ffn_dim=shapes.ffn,
            num_layers=shapes.layers, patch_size=shapes.patch_size,
        ),
        action_expert=FastWAMActionConfig(dim=shapes.action_width, ffn_dim=shapes.action_ffn, freq_dim=shapes.action_freq_dim),
        vae=release.vae if wan else VAEConfig(z_dim=shapes.in_channels),
        text_encoder=release.text_encoder if wan else TextEncoderConfig(d_model=shapes.text_dim),
        encoder_mode=release.encoder_mode if wan else PrecisionConfig(),
    )


def with_values(config: FastWAMConfig, values: Mapping[str, Any]) -> FastWAMConfig:
    """``config`` with the values no shape tells (heads, frames, text tokens, schedules, cameras, ...)."""
    bb = dataclasses.replace(config.backbone, eps=values.get("eps", config.backbone.eps))
    if "heads" in values:
        width, heads = bb.num_attention_heads * bb.attention_head_dim, int(values["heads"])
        if heads < 1 or width % heads or (width // heads) % 2:
            raise ValueError(f"--heads {heads} does not split the attention ({width} wide) into heads of an even size "
                             "(RoPE turns channel pairs): pass the num_heads its run used")
        bb = dataclasses.replace(bb, num_attention_heads=heads, attention_head_dim=width // heads)
    horizon, future = _frames(config, values)
    changes = {
        "backbone": bb, "action_horizon": horizon, "num_future_frames": future,
        "action_expert": dataclasses.replace(config.action_expert, eps=values.get("action_eps", config.action_expert.eps)),
        "text_encoder": dataclasses.replace(config.text_encoder, max_length=int(values.get("text_tokens",
                                                                                          config.text_encoder.max_length))),
    }
    for name in ("video_schedule", "action_schedule", "encoder_mode"):
        changes[name] = values.get(name, getattr(config, name))
    for name in ("image_size", "cameras"):
        changes[name] = tuple(values.get(name, getattr(config, name)))
    return dataclasses.replace(config, **changes)


def _frames(config: FastWAMConfig, values: Mapping[str, Any]) -> tuple[int, int]:
    """(action_horizon, num_future_frames) from their num_frames (actions + 1) and action_video_freq_ratio."""
    frames = int(values.get("num_frames", config.action_horizon + 1))
    ratio = int(values.get("action_video_freq_ratio", config.action_horizon // config.num_future_frames))
    horizon = frames - 1
    if horizon < 1 or ratio < 1 or horizon % ratio or (horizon // ratio) % 4:
        raise ValueError(f"--num-frames {frames} at --action-video-freq-ratio {ratio} is no clip of theirs: num_frames - 1 "
                         "actions must hold a whole number of video frames, a multiple of 4 (their dataset's checks)")
    return horizon, horizon // ratio


# Where their config states each size (under model.), and which of Shapes it is.
_STATED = (
    ("video_dit_config.num_layers", "layers"), ("video_dit_config.hidden_dim", "width"),
    ("video_dit_config.in_dim", "in_channels"), ("video_dit_config.out_dim", "out_channels"),
    ("video_dit_config.patch_size", "patch_size"), ("video_dit_config.ffn_dim", "ffn"),
    ("video_dit_config.text_dim", "text_dim"), ("video_dit_config.freq_dim", "freq_dim"),
    ("action_dit_config.hidden_dim", "action_width"), ("action_dit_config.ffn_dim", "action_ffn"),
    ("action_dit_config.freq_dim", "action_freq_dim"), ("action_dit_config.action_dim", "action_dim"),
    ("proprio_dim", "state_dim"),
)


def their_values(data: Mapping[str, Any], shapes: Shapes) -> dict[str, Any]:
    """The values their config gives, its sizes checked against ``shapes``; what wam_gym does not run is refused."""
    _refuse_unsupported(data)
    model, train = _get(data, "model"), _get(data, "data.train")
    video, action = _get(model, "video_dit_config"), _get(model, "action_dit_config")
    stated = [(key, _get(model, key), size) for key, size in _STATED]
    heads = _get(video, "num_heads")
    stated.append(("video_dit_config.num_heads x attn_head_dim", heads * _get(video, "attn_head_dim"), "width"))
    wrong = [f"model.{key} {value}, the checkpoint {getattr(shapes, size)}" for key, value, size in stated
             if (tuple(value) if isinstance(value, list) else value) != getattr(shapes, size)]
    if wrong:
        raise CheckpointMismatchError(f"their config and the checkpoint disagree ({'; '.join(wrong)}): pass the "
                                      "config.yaml of the run that wrote this checkpoint")
    images = _get(train, "shape_meta.images")
    sizes = {tuple(image["shape"][1:]) for image in images}
    if len(sizes) != 1:
        raise ValueError(f"their config's cameras are of several sizes {sorted(sizes)}; wam_gym tiles cameras of one size")
    (height, width), tiled = next(iter(sizes)), list(_get(train, "video_size"))
    if tiled != [height, width * len(images)]:
        raise ValueError(f"their config's video_size {tiled} is not its {len(images)} cameras of {height}x{width} side by "
                         "side: their clips were scaled after tiling, which wam_gym does not do")
    schedules = {name: FlowScheduleConfig(**{key: _get(model, f"{name}.{key}") for key in ("train_shift", "infer_shift",
                                                                                      "num_train_timesteps")})
                 for name in ("video_scheduler", "action_scheduler")}
    return {"heads": heads, "text_tokens": _get(model, "tokenizer_max_len"),
            "num_frames": _get(train, "num_frames"), "action_video_freq_ratio": train.get("action_video_freq_ratio", 1),
            "video_schedule": schedules["video_scheduler"], "action_schedule": schedules["action_scheduler"],
            "image_size": (height, width), "cameras": [str(image["key"]).removeprefix("observation.images.") for image in images],
            "num_cameras": len(images), "eps": _get(video, "eps"), "action_eps": _get(action, "eps"),
            "encoder_mode": _precision(data.get("mixed_precision", "bf16"))}


def _refuse_unsupported(data: Mapping[str, Any]) -> None:
    """What their config can say that wam_gym's FastWAM does not compute (one line, the first found)."""
    target, video = _get(data, "model._target_"), _get(data, "model.video_dit_config")
    processor, train = _get(data, "data.train.processor"), _get(data, "data.train")
    rules = [
        (str(target).rsplit(".", 1)[-1] == "create_fastwam", f"model._target_ {target} (another mask or loss than "
         "create_fastwam's, their uncond model): wam_gym runs create_fastwam's"),
        (video.get("video_attention_mask_mode") == "first_frame_causal" and not video.get("action_conditioned", False),
         "video_dit_config other than first_frame_causal and action_conditioned false: wam_gym runs those"),
        (train.get("concat_multi_camera", "horizontal") == "horizontal" or len(_get(train, "shape_meta.images")) == 1,
         f"concat_multi_camera {train.get('concat_multi_camera')!r}: wam_gym tiles cameras side by side (horizontal)"),
        (processor.get("norm_default_mode") == "min/max" and not processor.get("norm_exception_mode")
         and not processor.get("use_stepwise_action_norm"), f"norm_default_mode {processor.get('norm_default_mode')!r}: "
         "wam_gym reads their dataset_stats.json as global min/max (normalization=fastwam_min_max)"),
    ]
    for supported, what in rules:
        if not supported:
            raise ValueError(f"their config has {what}")


def _precision(mixed_precision: str) -> PrecisionConfig:
    """Their ``mixed_precision`` (the dtype they build the model in) as ours; fp16 runs here in fp32."""
    return PrecisionConfig.uniform("bf16_full") if str(mixed_precision).lower() == "bf16" else PrecisionConfig()


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise ValueError(f"their config lacks {dotted}; pass the config.yaml their training wrote (it holds it)")
        value = value[part]
    return value
