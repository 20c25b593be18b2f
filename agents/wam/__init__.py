"""World Action Models: the MoT model family, its samplers, and the chunked agent.

    from agents.wam import MoTWAM, WAMAgent, WAMPolicy, preset
    policy = WAMPolicy(build_model(preset("tiny")))
    agent = WAMAgent(policy, action_horizon=16, replan_steps=8)

Names load on first use (PEP 562), so importing a light submodule such as
``agents.wam.config`` or ``agents.wam.inference_config`` does not import diffusers.
"""

from __future__ import annotations

from agents.wam.exports import lazy_exports

_SOURCES = {
    "agents.wam.agent": ("WAMAgent",),
    "agents.wam.checkpoint": ("MissingCheckpointError", "build_model", "load_pretrained", "save_pretrained"),
    "agents.wam.config": ("PRESETS", "MoTConfig", "preset"),
    "agents.wam.frames": ("model_frames",),
    "agents.wam.inference_config": ("InferenceConfig", "SAMPLERS", "SamplerConfig"),
    "agents.wam.lora": ("LoraSettings", "add_lora"),
    "agents.wam.mot": ("MoTWAM",),
    "agents.wam.normalization": ("Normalizer",),
    "agents.wam.policy": ("NonFiniteOutputError", "WAMPolicy"),
    "agents.policy": ("Prediction",),  # the Policy protocol's answer; re-exported for WAM users
    "agents.wam.sampling": ("FlowSampler",),
}
__all__, __getattr__, __dir__ = lazy_exports(globals(), _SOURCES)
