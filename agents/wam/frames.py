"""Camera images -> the frames a WAM sees. One definition for inference and training.

The policy (one image per env) and the clip dataset (the frames of a clip) both call
:func:`model_frames`, so a model is trained on exactly the pixels it is later given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


def model_frames(
    pixels: Mapping[str, Any],
    cameras: Sequence[str],
    image_size: Sequence[int],
    num_images: int,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """uint8 RGB images ``(num_images, H, W, 3)`` per camera -> float32 ``(num_images, 3, h, w * len(cameras))``.

    Each image is mapped ``x / 127.5 - 1`` into [-1, 1], then resized to ``image_size`` (h, w)
    with bilinear antialiasing when stored at another size; cameras sit side by side in
    ``cameras`` order. Images move to ``device`` as uint8 (a quarter of the bytes) before
    the conversion.
    """
    size = tuple(int(s) for s in image_size)
    views = []
    for camera in cameras:
        image = np.asarray(pixels[camera])
        if (image.dtype != np.uint8 or image.ndim != 4 or image.shape[0] != num_images or image.shape[-1] != 3
                or 0 in image.shape[1:3]):
            raise ValueError(
                f"pixels/{camera} is {image.dtype} {image.shape}; the contract is uint8 (B, H, W, 3) "
                f"with B={num_images} and H, W >= 1 (0-255 RGB, as wam_gym envs return)"
            )
        x = torch.from_numpy(np.ascontiguousarray(image)).to(device).permute(0, 3, 1, 2).float() / 127.5 - 1
        if tuple(x.shape[-2:]) != size:
            x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
        views.append(x)
    return torch.cat(views, dim=-1)


def video_to_uint8(frames: torch.Tensor) -> np.ndarray:
    """(B, 3, T, H, W) in [-1, 1] -> (B, T, H, W, 3) uint8: the inverse of :func:`model_frames`'
    scaling, for decoded predictions and for real frames scored against them."""
    return ((frames.permute(0, 2, 3, 4, 1) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).cpu().numpy()
