"""The EVALUATION knobs that act on one model call, and the sampler choice, as plain data.

Kept apart from ``policy.py`` (which pulls in diffusers and transformers) so that building or
validating an evaluation config, e.g. to report a typo in an override, imports no model code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SAMPLERS = ("flow_euler", "unipc", "dpmpp", "ddim")


@dataclass
class SamplerConfig:
    """Which solver, how many model calls, and the flow shift.

    ``shift`` warps the schedule as ``s * u / (1 + (s - 1) * u)``: values above 1 spend
    more steps at high noise (Wan's default is 5.0); ``1.0`` means no shift.
    """

    name: str = "unipc"
    num_inference_steps: int = 10
    shift: float = 5.0

    def __post_init__(self) -> None:
        if self.name not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.name!r}; choose one of {', '.join(SAMPLERS)}")
        if not isinstance(self.num_inference_steps, int) or self.num_inference_steps < 1:
            raise ValueError(
                f"num_inference_steps must be an int >= 1, got {self.num_inference_steps!r}"
            )
        if not self.shift > 0:
            raise ValueError(f"shift must be > 0 (1.0 = no shift), got {self.shift!r}")


@dataclass
class InferenceConfig:
    """The EVALUATION knobs that act on one model call (seeds' names)."""

    num_inference_steps: int = 10
    sampler: str = "unipc"
    shift: float = 5.0
    inference_cross_kv_reuse: bool = True
    visualize_future_video: bool = False  # decode the predicted latents into frames
    torch_compile: bool = False
    torch_compile_mode: str | None = "reduce-overhead"
    torch_compile_backend: str = "inductor"
    torch_compile_fullgraph: bool = False
    torch_compile_dynamic: bool | None = None
    torch_compile_options: dict[str, Any] | None = None
    seed: int = 0  # of the sampling noise: the same observations give the same actions

    def sampler_config(self) -> SamplerConfig:
        return SamplerConfig(name=self.sampler, num_inference_steps=self.num_inference_steps, shift=self.shift)

    def compile_config(self):
        from agents.wam.compile import CompileConfig

        return CompileConfig(
            enabled=self.torch_compile, mode=self.torch_compile_mode, backend=self.torch_compile_backend,
            fullgraph=self.torch_compile_fullgraph, dynamic=self.torch_compile_dynamic,
            options=self.torch_compile_options,
        )
