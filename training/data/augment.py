"""Random image augmentation of training clips (``dataset.deterministic=false``).

Each camera of a clip gets one random shift (pad by replicating the border, crop back: DrQ's
shift) and one colour jitter (brightness, contrast, saturation), the same for all its frames, so
the clip stays a coherent video for the video expert. Draws come from ``(seed, epoch, position)``:
a sample is augmented the same way whatever the DataLoader workers, and again after a resume.

Static latent caches need deterministic preprocessing, so ``+infra=cache`` refuses augmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

GREY = (0.299, 0.587, 0.114)  # ITU-R 601 luma weights


@dataclass
class AugmentConfig:
    """``dataset.augment.*``: used only with ``dataset.deterministic=false``. 0 turns an op off."""

    random_shift: int = 4  # pixels, per camera (at the model's image_size)
    brightness: float = 0.2  # factors drawn uniformly in [1 - x, 1 + x]
    contrast: float = 0.2  # factors drawn uniformly in [1 - x, 1 + x]
    saturation: float = 0.2  # factors drawn uniformly in [1 - x, 1 + x]

    def __post_init__(self) -> None:
        if int(self.random_shift) != self.random_shift or self.random_shift < 0:
            raise ValueError(f"dataset.augment.random_shift must be an int >= 0 pixels, got {self.random_shift!r}")
        for name in ("brightness", "contrast", "saturation"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"dataset.augment.{name} must be in [0, 1), got {getattr(self, name)!r}")


def augment_clip(video: torch.Tensor, cameras: int, config: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """``video``: (3, F, H, W * cameras) in [-1, 1], cameras side by side; returns the same shape."""
    views = video.chunk(cameras, dim=-1)
    return torch.cat([_augment_view(v, config, generator) for v in views], dim=-1)


def _augment_view(view: torch.Tensor, config: AugmentConfig, g: torch.Generator) -> torch.Tensor:
    if config.random_shift:
        view = _shift(view, config.random_shift, g)
    x = (view + 1) / 2  # colour ops in [0, 1]
    if config.brightness:
        x = x * _factor(config.brightness, g)
    if config.contrast:
        x = (x - x.mean()) * _factor(config.contrast, g) + x.mean()
    if config.saturation:
        grey = sum(w * c for w, c in zip(GREY, x))
        x = grey + (x - grey) * _factor(config.saturation, g)
    return x.clamp(0, 1) * 2 - 1


def _factor(amount: float, g: torch.Generator) -> float:
    return 1 + amount * (2 * torch.rand((), generator=g).item() - 1)


def _shift(view: torch.Tensor, pad: int, g: torch.Generator) -> torch.Tensor:
    """Pad by ``pad`` replicated pixels, then crop the original size at a random offset."""
    h, w = view.shape[-2:]
    padded = F.pad(view, (pad, pad, pad, pad), mode="replicate")  # (3, F, ...) is a batch of F images
    top, left = torch.randint(0, 2 * pad + 1, (2,), generator=g).tolist()
    return padded[..., top : top + h, left : left + w]


class AugmentedClips(Dataset):
    """A :class:`~training.data.clips.ClipDataset` whose clips are augmented; indexed by
    ``(epoch, position)`` (what :class:`~training.loop.ResumableSampler` yields with ``keyed=True``)."""

    def __init__(self, clips, config: AugmentConfig, seed: int):
        self.clips, self.config, self.seed = clips, config, int(seed)

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        epoch, position = key
        sample = self.clips[position]
        draw = (self.seed * 1_000_003 + int(epoch)) * 1_000_003 + int(position)
        generator = torch.Generator().manual_seed(draw % 2**63)
        sample["video"] = augment_clip(sample["video"], len(self.clips.cameras), self.config, generator)
        return sample
