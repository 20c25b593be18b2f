"""What the broker's model workers serve, for evaluation and for ``python -m wam_gym.serve``.

``EVALUATION.agent=wam`` serves a checkpoint's :class:`~agents.wam.WAMPolicy`;
``EVALUATION.agent=python`` serves the Policy that ``EVALUATION.policy=pkg.module:factory``
builds (agents/policy.py). The factories are module-level functions bound with
``functools.partial``, so the spawned workers (or Ray actors) import them by reference.
"""

from __future__ import annotations

import functools
from pathlib import Path

from agents.policy import build_policy
from agents.wam.lingbot_va.folder import is_lingbot_va
from wam_gym.broker.model_worker import PolicyFactory

SERVED_AGENTS = ("wam", "python")  # the agents whose model calls go through the broker


def checkpoint_policy(
    ckpt: str, inference, dataset_stats_path: str | None, prompt_cache_size: int, overrides: dict, device: str
):
    """Builds the checkpoint's policy (its architecture's: agents/wam/architectures.py) inside a model worker."""
    from agents.wam.policy import WAMPolicy

    return WAMPolicy.from_checkpoint(
        ckpt, inference, dataset_stats_path, device=device, prompt_cache_size=prompt_cache_size, **overrides
    )


def release_policy(folder: str, inputs: str, device: str):
    """Builds a LingBot-VA's policy inside a model worker (a release folder, or a checkpoint python -m training
    wrote), evaluated by the input convention ``inputs`` (bf16 on a GPU, as their server runs it; fp32 on the CPU)."""
    import torch

    from agents.wam.lingbot_va.policy import LingBotVAPolicy

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return LingBotVAPolicy.load(folder, inputs, device=device, dtype=dtype)


def policy_factory(evaluation, prompt_cache_size: int, ckpt: Path | None, stats: Path | None,
                   model_inputs: str | None = None) -> PolicyFactory:
    """The factory model workers call with their device, for ``evaluation.agent`` (wam or python); ``model_inputs``:
    the protocol's input convention, by which a LingBot-VA is fed."""
    if evaluation.agent == "python":
        return functools.partial(build_policy, evaluation.policy)
    if evaluation.agent != "wam":
        raise ValueError(f"EVALUATION.agent={evaluation.agent!r} is not served by model workers; use one of {SERVED_AGENTS}")
    if ckpt is not None and is_lingbot_va(ckpt):  # its settings are the protocol's input convention (checked to be its own)
        return functools.partial(release_policy, str(ckpt), model_inputs)
    overrides = {"video_mode": evaluation.video_mode} if evaluation.video_mode else {}
    return functools.partial(
        checkpoint_policy, str(ckpt), evaluation.inference(), str(stats), prompt_cache_size, overrides
    )
