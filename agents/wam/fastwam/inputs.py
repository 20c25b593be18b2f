"""How observations become a FastWAM's inputs, and its answers env actions: the conventions it was trained with.

A checkpoint's conventions are part of it (``wam_config.json``'s ``"inputs"``), never a flag an evaluation
can forget: a mirrored camera or a gripper of the wrong sign would silently lose most of a score.

``wam_gym``
    what ``python -m training`` feeds a model trained on wam_gym's datasets: upright frames resized as
    :func:`agents.wam.frames.model_frames` resizes them, the instruction as it is, actions as they are.
``fastwam_libero``
    FastWAM's LIBERO release (their ``experiments/libero/eval_libero_single.py`` and ``libero_utils.py``, read
    at commit 45d8e14): frames ``mirrored`` (envs/orientation.py: their frames are robosuite's raw frames turned
    180 degrees; robosuite's raw frame is our upright frame upside down, so theirs is ours mirrored), scaled
    to cover ``image_size`` and centre-cropped (PIL bilinear, to uint8), cameras side by side, ``x * 2/255 - 1``;
    the prompt ``A video recorded from a robot's point of view executing the following instruction: {task}``,
    cleaned as their tokenizer cleans it;
    the gripper action from their dataset's 0 = closed, 1 = open to LIBERO's -1 = open, +1 = closed
    (``-(2 g - 1)``), then its sign.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from agents.wam.frames import model_frames
from envs.orientation import UPRIGHT, check_orientation, reorient

RESIZES = ("stretch", "cover_crop")
GRIPPERS = ("as_is", "open_one_to_libero")


@dataclass
class FastWAMInputs:
    """One input/output convention (see the module docstring for the named ones)."""

    name: str = "wam_gym"  # the convention's name, which evaluation protocols check (fastwam_libero: their LIBERO eval)
    suite: str | None = None  # the benchmark suite (envs.registry) its frames and actions are of; null: any
    # the orientation the model was trained on (envs/orientation.py); the contract's upright frames are turned to it
    # before anything else (fastwam_libero: mirrored, the field's LIBERO frames)
    orientation: str = UPRIGHT
    # how a camera frame reaches image_size: stretch (model_frames: bilinear with antialiasing, in float) |
    # cover_crop (PIL bilinear to cover it, centre crop, rounded to uint8: their _center_crop_resize)
    resize: str = "stretch"
    prompt_template: str = "{task}"  # the instruction becomes this, {task} replaced by it
    # their tokenizer's clean="whitespace": HTML entities unescaped, whitespace runs made one space, ends stripped
    # (ftfy's mojibake repair, which it also runs when installed, is left out: our instructions are already text)
    clean_prompt: bool = False
    # the action's last dimension: as_is | open_one_to_libero (their 0 closed / 1 open -> LIBERO's -1 open / +1 closed)
    gripper: str = "as_is"
    binarize_gripper: bool = False  # send only the gripper action's sign
    # What a checkpoint of this convention must be, checked when one is converted (null: any): the action it
    # predicts and the state it reads (fastwam_libero: LIBERO's 7 and 8), and the env cameras it tiles, in order
    action_dim: int | None = None
    state_dim: int | None = None
    cameras: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.resize not in RESIZES:
            raise ValueError(f"inputs.resize={self.resize!r}: choose one of {RESIZES}")
        check_orientation(self.orientation, "inputs.orientation")
        if self.gripper not in GRIPPERS:
            raise ValueError(f"inputs.gripper={self.gripper!r}: choose one of {GRIPPERS}")
        if "{task}" not in self.prompt_template:
            raise ValueError(f"inputs.prompt_template={self.prompt_template!r} must contain {{task}}, where the "
                             "instruction goes")

    def check_fits(self, action_dim: int, state_dim: int, num_cameras: int | None, source: str) -> None:
        """Refuse a checkpoint whose sizes contradict this convention (a RoboTwin model read as LIBERO's)."""
        sizes = {"-d actions": (action_dim, self.action_dim), "-d state": (state_dim, self.state_dim),
                 " cameras": (num_cameras, None if self.cameras is None else len(self.cameras))}
        wrong = {what: pair for what, pair in sizes.items() if None not in pair and pair[0] != pair[1]}
        if wrong:
            has, needs = (", ".join(f"{pair[i]}{what}" for what, pair in wrong.items()) for i in (0, 1))
            raise ValueError(f"{source} has {has}, and the input convention {self.name!r} has {needs}: pass the "
                             f"--inputs its run was trained with (one of {sorted(CONVENTIONS)})")

    # ----------------------------------------------------------------- observation -> model
    def frames(self, pixels: Mapping[str, Any], cameras: Sequence[str], image_size: Sequence[int], batch: int,
               device: torch.device | str | None = None) -> torch.Tensor:
        """Upright uint8 (B, H, W, 3) per camera -> float32 (B, 3, h, w * cameras) in [-1, 1], turned to
        ``orientation``."""
        views = {camera: reorient(pixels[camera], UPRIGHT, self.orientation) for camera in cameras}
        if self.resize == "stretch":
            return model_frames(views, cameras, image_size, batch, device)
        height, width = (int(s) for s in image_size)
        tiled = np.stack([
            np.concatenate([cover_crop(_image(views, camera, batch)[row], height, width) for camera in cameras], axis=1)
            for row in range(batch)
        ])
        x = torch.from_numpy(tiled).to(device).permute(0, 3, 1, 2).float()
        return x * (2.0 / 255.0) - 1.0

    def prompts(self, instructions: Sequence[str]) -> list[str]:
        prompts = [self.prompt_template.format(task=text) for text in instructions]
        if self.clean_prompt:
            prompts = [re.sub(r"\s+", " ", html.unescape(html.unescape(p))).strip() for p in prompts]
        return prompts

    # ----------------------------------------------------------------- env -> model (training data)
    def dataset_actions(self, actions: np.ndarray) -> np.ndarray:
        """A dataset's env actions (..., A) in the units the model predicts (the inverse of :meth:`env_actions`
        before its binarization)."""
        if self.gripper == "as_is":
            return actions
        scale, offset = _gripper_affine(actions.shape[-1])
        return (actions * scale + offset).astype(actions.dtype)

    def dataset_stats(self, stats: Mapping[str, Any]) -> dict[str, Any]:
        """A dataset's statistics file (LeRobot's layout) with the action statistics in the model's units."""
        if self.gripper == "as_is":
            return dict(stats)
        from agents.wam.normalization import affine_stats
        from envs.protocol import LEROBOT_ACTION

        dim = len(stats[LEROBOT_ACTION]["min"])
        return {**stats, LEROBOT_ACTION: affine_stats(stats[LEROBOT_ACTION], *_gripper_affine(dim))}

    # ----------------------------------------------------------------- model -> env
    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Un-normalised actions (B, T, A) -> what the env is sent."""
        actions = np.array(actions, dtype=np.float32)
        if self.gripper == "open_one_to_libero":
            actions[..., -1] = -(actions[..., -1] * 2 - 1)
        if self.binarize_gripper:
            actions[..., -1] = np.sign(actions[..., -1])
        return actions


def _gripper_affine(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(scale, offset) taking env actions to the model's (their 0 closed / 1 open): ``g = (1 - env) / 2``."""
    scale, offset = np.ones(dim), np.zeros(dim)
    scale[-1], offset[-1] = -0.5, 0.5
    return scale, offset


def _image(views: Mapping[str, np.ndarray], camera: str, batch: int) -> np.ndarray:
    image = views[camera]
    if image.dtype != np.uint8 or image.ndim != 4 or image.shape[0] != batch or image.shape[-1] != 3 or 0 in image.shape[1:3]:
        raise ValueError(f"pixels/{camera} is {image.dtype} {image.shape}; the contract is uint8 (B, H, W, 3) with "
                         f"B={batch} and H, W >= 1 (0-255 RGB, as wam_gym envs return)")
    return image


def cover_crop(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Scale ``image`` (H, W, 3) uint8 to cover (height, width) keeping its aspect (PIL bilinear), then
    cut the centre out: one camera as FastWAM's LIBERO evaluation prepares it."""
    source = Image.fromarray(np.ascontiguousarray(image))
    scale = max(width / source.width, height / source.height)
    scaled = source.resize((round(source.width * scale), round(source.height * scale)), resample=Image.BILINEAR)
    left, top = max((scaled.width - width) // 2, 0), max((scaled.height - height) // 2, 0)
    return np.asarray(scaled.crop((left, top, left + width, top + height)), dtype=np.uint8)


CONVENTIONS = {
    "wam_gym": FastWAMInputs(),
    "fastwam_libero": FastWAMInputs(
        name="fastwam_libero", suite="libero", orientation="mirrored", resize="cover_crop",
        prompt_template="A video recorded from a robot's point of view executing the following instruction: {task}",
        clean_prompt=True, gripper="open_one_to_libero", binarize_gripper=True,
        action_dim=7, state_dim=8, cameras=("agentview", "robot0_eye_in_hand"),
    ),
}


def from_saved(data: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``inputs`` as this version names them: one written before frame orientations were named
    says ``mirror: true`` for ``orientation: mirrored``."""
    data = dict(data)
    if "mirror" in data:
        data.setdefault("orientation", "mirrored" if data.pop("mirror") else UPRIGHT)
    return data


def convention(name: str) -> FastWAMInputs:
    if name not in CONVENTIONS:
        raise ValueError(f"unknown FastWAM input convention {name!r}; choose one of {sorted(CONVENTIONS)}")
    return dataclasses.replace(CONVENTIONS[name])
