"""What one model call does, as plain data: the sampler, the compile, and four switches.

Kept apart from ``policy.py`` (which pulls in diffusers and transformers) so that building or
validating an evaluation config, e.g. to report a typo in an override, imports no model code.

:class:`InferenceConfig` nests one owner per group: :class:`SamplerConfig` (here) and
:class:`~agents.wam.compile.CompileConfig`. Command lines spell the same settings flat, with
EasyWAM's names (``EVALUATION.num_inference_steps``, ``EVALUATION.torch_compile_mode``, ...):
:data:`KNOBS` lists those names and :meth:`InferenceConfig.from_knobs` is the one place that
turns them into the nested config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agents.rtc import RTCConfig
from agents.wam.compile import CompileConfig

SAMPLERS = ("flow_euler", "unipc", "dpmpp", "ddim")
MOT_SAMPLER, MOT_SHIFT = "unipc", 5.0  # what the MoT samples with when the config leaves name and shift null
FUTURE_VIDEOS = ("sample", "expected")


@dataclass
class SamplerConfig:
    """Which solver, how many model calls, and the flow shift.

    ``shift`` warps the schedule as ``s * u / (1 + (s - 1) * u)``: values above 1 spend
    more steps at high noise (Wan's default is 5.0); ``1.0`` means no shift.

    ``name`` and ``shift`` left null are the model's own: the MoT's are ``unipc`` and 5.0
    (:meth:`with_defaults`); a FastWAM steps with Euler on its schedules' shifts, as its own code does.
    """

    name: str | None = None  # flow_euler | unipc | dpmpp | ddim (diffusers, flow mode); null: the model's own
    num_inference_steps: int = 10  # denoising steps: model calls per action chunk
    shift: float | None = None  # flow shift; 1.0 = none, above 1 = more steps at high noise; null: the model's own

    def __post_init__(self) -> None:
        if self.name is not None and self.name not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.name!r}; choose one of {', '.join(SAMPLERS)}, or null")
        if not isinstance(self.num_inference_steps, int) or self.num_inference_steps < 1:
            raise ValueError(
                f"num_inference_steps must be an int >= 1, got {self.num_inference_steps!r}"
            )
        if self.shift is not None and not self.shift > 0:
            raise ValueError(f"shift must be > 0 (1.0 = no shift), or null, got {self.shift!r}")

    def with_defaults(self, name: str, shift: float) -> SamplerConfig:
        """This config with ``name`` and ``shift`` where it leaves them null."""
        return dataclasses.replace(self, name=self.name or name, shift=shift if self.shift is None else self.shift)


@dataclass
class InferenceConfig:
    """What :class:`~agents.wam.policy.WAMPolicy` does in one model call."""

    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # solver, steps, flow shift
    compile: CompileConfig = field(default_factory=CompileConfig)  # torch.compile of the denoiser
    inference_cross_kv_reuse: bool = True  # text cross-attention K/V once per call, not per step (same outputs)
    visualize_future_video: bool = False  # decode the predicted latents into frames (Prediction.video)
    # Which future is decoded: the sample denoised with the actions, or the expected future (the model's
    # estimate from pure noise, its first step: the mean over what it thinks may happen, which PSNR rewards).
    future_video: str = "sample"
    seed: int = 0  # of the sampling noise: the same observations give the same actions
    rtc: RTCConfig = field(default_factory=RTCConfig)  # real-time chunking's guidance, for calls that carry a prefix

    def __post_init__(self) -> None:
        if self.future_video not in FUTURE_VIDEOS:
            raise ValueError(f"future_video={self.future_video!r}: choose one of {', '.join(FUTURE_VIDEOS)}")

    @classmethod
    def from_knobs(cls, **knobs: Any) -> InferenceConfig:
        """The config from EasyWAM's flat knob names (:data:`KNOBS`); knobs not given keep their defaults.

        ``InferenceConfig.from_knobs(num_inference_steps=4, torch_compile=True)`` equals
        ``InferenceConfig(sampler=SamplerConfig(num_inference_steps=4), compile=CompileConfig(enabled=True))``.
        """
        unknown = sorted(set(knobs) - set(KNOBS))
        if unknown:
            raise TypeError(f"unknown inference knob(s) {unknown}; known: {sorted(KNOBS)}")
        groups: dict[str | None, dict[str, Any]] = {None: {}, "sampler": {}, "compile": {}, "rtc": {}}
        for name, value in knobs.items():
            group, key = KNOBS[name]
            groups[group][key] = value
        return cls(sampler=SamplerConfig(**groups["sampler"]), compile=CompileConfig(**groups["compile"]),
                   rtc=RTCConfig(**groups["rtc"]), **groups[None])


# EasyWAM's flat knob names (EVALUATION.<name>) -> (group of InferenceConfig or None, field there).
KNOBS: dict[str, tuple[str | None, str]] = {
    "num_inference_steps": ("sampler", "num_inference_steps"),
    "sampler": ("sampler", "name"),
    "shift": ("sampler", "shift"),
    "inference_cross_kv_reuse": (None, "inference_cross_kv_reuse"),
    "visualize_future_video": (None, "visualize_future_video"),
    "future_video": (None, "future_video"),
    "torch_compile": ("compile", "enabled"),
    "torch_compile_mode": ("compile", "mode"),
    "torch_compile_backend": ("compile", "backend"),
    "torch_compile_fullgraph": ("compile", "fullgraph"),
    "torch_compile_dynamic": ("compile", "dynamic"),
    "torch_compile_options": ("compile", "options"),
    "torch_compile_batch_sizes": ("compile", "batch_sizes"),
    "seed": (None, "seed"),
    "rtc_max_guidance_weight": ("rtc", "max_guidance_weight"),
    "rtc_schedule": ("rtc", "schedule"),
    "rtc_execution_horizon": ("rtc", "execution_horizon"),
}
