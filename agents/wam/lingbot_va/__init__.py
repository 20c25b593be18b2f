"""LingBot-VA (Robbyant/lingbot-va) in wam_gym: an autoregressive World Action Model.

    from agents.wam.lingbot_va import infer_chunk, feed_back, load_transformer, new_episode, preset
    config = preset("lingbot_va")  # their LIBERO release
    model = load_transformer("/data/lingbot-va-libero/transformer", dtype=torch.bfloat16, device="cuda")
    state = new_episode(config, vae, prompt, empty_prompt, torch.Generator("cuda").manual_seed(0), torch.bfloat16)
    chunk = infer_chunk(model, vae, config, state, first_pixels)   # latents and model-space actions
    feed_back(model, vae, config, state, key_frame_pixels, executed_actions)

Modules: ``config`` (LingBotVAConfig, presets ``lingbot_va``, ``lingbot_va_tiny`` and ``lingbot_va_libero_tiny``),
``model`` (LingBotVATransformer: the video and action streams), ``positions`` (3-axis positions and RoPE), ``cache``
(the per-episode KV cache and its write modes), ``observations`` (the streaming VAE encoder), ``schedule``
(their flow-matching schedule), ``state`` (EpisodeState), ``sampling`` (one chunk; feedback), ``checkpoint``
(their transformer/ folder), ``teacher`` (every chunk in one call: the block-causal mask), ``objective`` (their
training loss), ``wam`` (LingBotVA, the WAMModel training holds), ``trained`` (our checkpoint directory, the model
a run starts from, the export to their release). Parity with their code: tests/test_lingbot_va_parity.py
(inference), tests/test_lingbot_va_train_parity.py (the training loss).

Names load on first use (PEP 562), so ``agents.wam.lingbot_va.config`` imports no model code.
"""

from __future__ import annotations

from agents.wam.architectures import Architecture
from agents.wam.exports import lazy_exports

_SOURCES = {
    "agents.wam.lingbot_va.config": ("LingBotVAConfig", "TransformerConfig", "PRESETS", "preset"),
    "agents.wam.lingbot_va.model": ("LingBotVATransformer",),
    "agents.wam.lingbot_va.cache": ("KVCache", "WriteMode"),
    "agents.wam.lingbot_va.observations": ("encode_frames", "new_feature_cache"),
    "agents.wam.lingbot_va.schedule": ("FlowSchedule",),
    "agents.wam.lingbot_va.state": ("EpisodeState", "new_episode"),
    "agents.wam.lingbot_va.sampling": ("Chunk", "feed_back", "infer_chunk"),
    "agents.wam.lingbot_va.checkpoint": ("CheckpointMismatchError", "load_transformer", "read_weights", "transformer_config"),
    "agents.wam.lingbot_va.objective": ("Draws", "draw", "flow_matching_loss", "model_actions"),
    "agents.wam.lingbot_va.wam": ("LingBotVA",),
    "agents.wam.lingbot_va.trained": ("build_lingbot_va", "export_release", "load_lingbot_va", "save_lingbot_va"),
    "agents.wam.lingbot_va.policy": ("LingBotVAPolicy",),
}
__all__, __getattr__, __dir__ = lazy_exports(globals(), _SOURCES)

ARCHITECTURE = Architecture("lingbot_va", __name__, config="LingBotVAConfig", presets="PRESETS",
                            policy="LingBotVAPolicy", build="build_lingbot_va", load="load_lingbot_va",
                            save="save_lingbot_va")
