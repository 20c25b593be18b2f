"""World Action Models: the MoT model family (and FastWAM's), their samplers and policies.

    from agents import make_agent
    from agents.wam import WAMPolicy, build_model, preset
    policy = WAMPolicy(build_model(preset("tiny")))
    agent = make_agent("wam", policy=policy, action_horizon=16, replan_steps=8)  # agents/chunk_queue.py

Names load on first use (PEP 562), so importing a light submodule such as
``agents.wam.config`` or ``agents.wam.inference_config`` does not import diffusers.
"""

from __future__ import annotations

from agents.wam.exports import lazy_exports

_SOURCES = {
    "agents.wam.checkpoint": ("MissingCheckpointError", "build_model", "load_pretrained", "save_pretrained"),
    "agents.wam.config": ("PRESETS", "MoTConfig", "preset"),
    "agents.wam.frames": ("model_frames",),
    "agents.wam.inference_config": ("InferenceConfig", "SAMPLERS", "SamplerConfig"),
    "agents.wam.lora": ("LoraSettings", "add_lora"),
    "agents.wam.mot": ("MoTWAM",),
    "agents.wam.normalization": ("Normalizer",),
    "agents.wam.wam_policy": ("NonFiniteOutputError", "WAMPolicy"),
    "agents.policy": ("Prediction",),  # the Policy protocol's answer; re-exported for WAM users
    "agents.wam.sampling": ("FlowSampler",),
}
__all__, __getattr__, __dir__ = lazy_exports(globals(), _SOURCES)
