"""A LingBot-VA release folder told apart without loading anything, and what evaluation checks of it.

Their releases (transformer/, vae/, text_encoder/, tokenizer/) carry no wam_config.json: the transformer's
config.json names their class, and the evaluation settings (cameras, sizes, chunk, statistics) are those of the
input convention a protocol names (:mod:`agents.wam.lingbot_va.inputs`). A checkpoint ``python -m training`` wrote
has the same parts and a wam_config.json that names its convention (:mod:`agents.wam.lingbot_va.trained`).
Reading this module imports no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agents.wam.lingbot_va.inputs import LingBotVAInputs

PARTS = ("transformer", "vae", "text_encoder", "tokenizer")
THEIR_CLASS = "WanTransformer3DModel"  # transformer/config.json's _class_name in their releases
OUR_CONFIG = "wam_config.json"  # a folder holding one is one of our checkpoints, whatever else it holds


def is_lingbot_va(folder: str | Path) -> bool:
    """Whether ``folder`` holds a LingBot-VA: a release as published, or a checkpoint python -m training wrote (its
    wam_config.json names the architecture). Either is evaluated under the protocol of its input convention, and
    keeps each episode's state between calls."""
    if is_release(folder):
        return True
    try:
        return json.loads((Path(folder).expanduser() / OUR_CONFIG).read_text()).get("architecture") == "lingbot_va"
    except (OSError, ValueError, AttributeError):
        return False


def trained_inputs(folder: str | Path) -> str | None:
    """The input convention a checkpoint python -m training wrote declares (its wam_config.json's inputs.name)."""
    try:
        inputs = json.loads((Path(folder).expanduser() / OUR_CONFIG).read_text()).get("inputs")
    except (OSError, ValueError, AttributeError):
        return None
    return inputs.get("name") if isinstance(inputs, dict) else None


def is_release(folder: str | Path) -> bool:
    """Whether ``folder`` is a LingBot-VA release as published (its transformer/config.json names their class)."""
    folder = Path(folder).expanduser()
    if (folder / OUR_CONFIG).exists():
        return False
    try:
        return json.loads((folder / "transformer" / "config.json").read_text()).get("_class_name") == THEIR_CLASS
    except (OSError, ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class ReleaseFacts:
    """What evaluation reads of a checkpoint's config before any model loads, for a release under a convention."""

    cameras: tuple[str, ...]  # the env's cameras, in their obs_cam_keys order
    image_size: tuple[int, int]  # (height, width) the env renders: the convention's first camera size
    action_horizon: int  # actions of a chunk (an episode's first chunk runs action_per_frame fewer)
    action_dim: int  # the env's action size: the convention's used channels
    state_dim: int | None = None  # the model never sees proprioception
    crops_frames: bool = False  # frames are resized, never cropped
    video_mode: str | None = None  # no decoded video is served

    @classmethod
    def of(cls, inputs: LingBotVAInputs) -> ReleaseFacts:
        return cls(tuple(inputs.cameras), tuple(inputs.sizes[0]), inputs.chunk_actions, len(inputs.channels))
