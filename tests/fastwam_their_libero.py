"""FastWAM's LIBERO preprocessing and post-processing, transcribed from reading their code (FastWAM commit
45d8e14: experiments/libero/eval_libero_single.py ``_obs_to_model_input``, ``_center_crop_resize``,
``_normalize_proprio``, ``_predict_action_chunk``; libero_utils.py ``get_libero_image``,
``invert_gripper_action``; src/fastwam/datasets/lerobot/utils/normalizer.py ``SingleFieldLinearNormalizer``
in min/max mode, which their processor also runs on a training sample's actions). Written here, apart from
wam_gym's implementation, so the tests compare two readings.

Their observation is robosuite's: ``agentview_image`` and ``robot0_eye_in_hand_image`` as robosuite's
renderer returns them (bottom row first), the state read from ``robot0_eef_pos``, ``robot0_eef_quat``,
``robot0_gripper_qpos``.
"""

from __future__ import annotations

import html
import math
import re

import numpy as np
import torch
from PIL import Image

PROMPT = "A video recorded from a robot's point of view executing the following instruction: {task}"


def prompt(task: str) -> str:
    """DEFAULT_PROMPT filled, then their HuggingfaceTokenizer's clean='whitespace' (ftfy absent: a no-op here)."""
    text = html.unescape(html.unescape(PROMPT.format(task=task))).strip()
    return re.sub(r"\s+", " ", text).strip()


def center_crop_resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    pil_image = Image.fromarray(image)
    src_w, src_h = pil_image.size
    scale = max(width / src_w, height / src_h)
    resized = pil_image.resize((round(src_w * scale), round(src_h * scale)), resample=Image.BILINEAR)
    rw, rh = resized.size
    left, top = max((rw - width) // 2, 0), max((rh - height) // 2, 0)
    return np.asarray(resized.crop((left, top, left + width, top + height)), dtype=np.uint8)


def model_image(agentview_raw: np.ndarray, wrist_raw: np.ndarray, size: int = 224) -> torch.Tensor:
    """(1, 3, size, 2 * size) in [-1, 1]: each camera turned 180 degrees, cropped and resized, side by side."""
    image = np.ascontiguousarray(agentview_raw[::-1, ::-1])
    wrist = np.ascontiguousarray(wrist_raw[::-1, ::-1])
    rgb = np.concatenate([center_crop_resize(image, size, size), center_crop_resize(wrist, size, size)], axis=1)
    x = torch.tensor(rgb).permute(2, 0, 1).unsqueeze(0).to(dtype=torch.float32)
    return x * (2.0 / 255.0) - 1.0


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    quat = np.array(quat, dtype=np.float64)
    quat[3] = min(max(quat[3], -1.0), 1.0)
    den = np.sqrt(1.0 - quat[3] * quat[3])
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return (quat[:3] * 2.0 * math.acos(quat[3])) / den


def state(eef_pos, eef_quat, gripper_qpos) -> np.ndarray:
    return np.concatenate((eef_pos, quat2axisangle(eef_quat), gripper_qpos)).astype(np.float32)


def _scale_offset(stats: dict) -> tuple[torch.Tensor, torch.Tensor]:
    low, high = torch.tensor(stats["global_min"]), torch.tensor(stats["global_max"])
    span = high - low
    ignore = span < 1e-4
    span[ignore] = 2.0
    scale = 2.0 / span
    offset = -1.0 - scale * low
    offset[ignore] = 0.0 - low[ignore]
    return scale.float(), offset.float()


def normalize_state(x: np.ndarray, stats: dict, group: str = "state") -> torch.Tensor:
    """Their SingleFieldLinearNormalizer.forward: the affine map, then a clamp to [-5, 5] (actions in training too)."""
    scale, offset = _scale_offset(stats[group]["default"])
    return torch.clamp(torch.as_tensor(x, dtype=torch.float32) * scale + offset, -5.0, 5.0)


def env_actions(normalized: torch.Tensor, stats: dict, binarize: bool = True) -> np.ndarray:
    scale, offset = _scale_offset(stats["action"]["default"])
    action = ((normalized.float() - offset) / scale).numpy()
    action[..., -1] = action[..., -1] * 2 - 1
    action[..., -1] = action[..., -1] * -1.0
    if binarize:
        action[..., -1] = np.sign(action[..., -1])
    return action
