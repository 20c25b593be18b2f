"""World Action Models: the MoT model family, its samplers, and the chunked agent.

    from agents.wam import MoTWAM, WAMAgent, WAMPolicy, preset
    policy = WAMPolicy(build_model(preset("tiny")))
    agent = WAMAgent(policy, action_horizon=16, replan_steps=8)
"""

from agents.wam.agent import WAMAgent, WAMAgentConfig
from agents.wam.checkpoint import MissingCheckpointError, build_model, load_pretrained, save_pretrained
from agents.wam.config import PRESETS, MoTConfig, preset
from agents.wam.lora import LoraSettings, add_lora
from agents.wam.mot import MoTWAM
from agents.wam.normalization import Normalizer
from agents.wam.policy import InferenceConfig, NonFiniteOutputError, Prediction, WAMPolicy
from agents.wam.sampling import SAMPLERS, FlowSampler, SamplerConfig

__all__ = [
    "PRESETS", "SAMPLERS", "FlowSampler", "InferenceConfig", "LoraSettings", "MissingCheckpointError",
    "MoTConfig", "MoTWAM", "NonFiniteOutputError", "Normalizer", "Prediction", "SamplerConfig",
    "WAMAgent", "WAMAgentConfig", "WAMPolicy", "add_lora", "build_model", "load_pretrained", "preset",
    "save_pretrained",
]
