"""Video quality metrics for predicted vs. ground-truth videos (numpy in, numbers out).

Inputs are uint8 or float arrays shaped ``(T, H, W, C)`` (a video) or ``(H, W, C)`` (one
frame); both arguments must have the same shape (see :func:`resize_video` to match sizes).
``data_range`` is the value span of the inputs: 255 for uint8, pass 1.0 for floats in [0, 1].

Conventions:

* PSNR of a frame is ``10 log10(data_range^2 / MSE)``; identical frames give ``inf`` in
  :func:`per_frame_psnr` (set explicitly, no division by zero). The video score
  :func:`psnr` is the mean of per-frame PSNR with each frame capped at :data:`PSNR_CAP_DB`,
  so one perfect frame cannot make the whole video ``inf``.
* SSIM follows Wang et al. (2004): an 11x11 Gaussian window with sigma 1.5, K1=0.01,
  K2=0.03, population (not sample) statistics, computed per channel over the "valid" region
  (windows fully inside the frame) and averaged over channels and pixels. This equals
  scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
  use_sample_covariance=False, channel_axis=-1)``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

PSNR_CAP_DB = 100.0
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03


def _as_video(x: np.ndarray, name: str) -> np.ndarray:
    """``(T, H, W, C)`` view of a video or single frame; rejects other ranks."""
    x = np.asarray(x)
    if x.ndim == 3:
        return x[None]
    if x.ndim != 4:
        raise ValueError(f"{name} must be (T, H, W, C) or (H, W, C), got shape {x.shape}")
    return x


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as float64 ``(T, H, W, C)``, after checking their shapes agree."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        if a.ndim != b.ndim:
            detail = f"ndim {a.ndim} vs {b.ndim}"
        else:
            names = {3: "HWC", 4: "THWC"}.get(a.ndim) or [f"dim{i}" for i in range(a.ndim)]
            detail = ", ".join(
                f"{n}: {x} vs {y}" for n, x, y in zip(names, a.shape, b.shape) if x != y
            )
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape} ({detail})")
    # float64 first: uint8 subtraction would wrap around.
    return _as_video(a, "a").astype(np.float64), _as_video(b, "b").astype(np.float64)


def per_frame_psnr(a: np.ndarray, b: np.ndarray, data_range: float = 255.0) -> np.ndarray:
    """PSNR in dB of each frame, shape ``(T,)`` (``(1,)`` for one frame); ``inf`` if identical."""
    x, y = _pair(a, b)
    mse = ((x - y) ** 2).mean(axis=(1, 2, 3))
    out = np.full(mse.shape, np.inf)
    nz = mse > 0
    out[nz] = 10.0 * np.log10(data_range**2 / mse[nz])
    return out


def psnr(a: np.ndarray, b: np.ndarray, data_range: float = 255.0) -> float:
    """Mean over frames of per-frame PSNR, each capped at :data:`PSNR_CAP_DB` (so finite)."""
    return float(np.minimum(per_frame_psnr(a, b, data_range), PSNR_CAP_DB).mean())


def _gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(r**2) / (2 * sigma**2))
    return g / g.sum()


def per_frame_ssim(a: np.ndarray, b: np.ndarray, data_range: float = 255.0) -> np.ndarray:
    """Mean SSIM of each frame (channels averaged), shape ``(T,)``; needs H, W >= 11."""
    x, y = _pair(a, b)
    t, h, w, c = x.shape
    if h < SSIM_WINDOW or w < SSIM_WINDOW:
        raise ValueError(f"ssim needs frames of at least {SSIM_WINDOW}x{SSIM_WINDOW}, got {h}x{w}")
    # Each channel of each frame is one single-channel image: (T*C, 1, H, W).
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).reshape(t * c, 1, h, w)
    yt = torch.from_numpy(y).permute(0, 3, 1, 2).reshape(t * c, 1, h, w)
    g = _gaussian_window()
    gh, gw = g.view(1, 1, -1, 1), g.view(1, 1, 1, -1)

    def blur(z: torch.Tensor) -> torch.Tensor:  # separable Gaussian, "valid" region only
        return F.conv2d(F.conv2d(z, gh), gw)

    mx, my = blur(xt), blur(yt)
    vx = blur(xt * xt) - mx * mx
    vy = blur(yt * yt) - my * my
    cov = blur(xt * yt) - mx * my
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    smap = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return smap.mean(dim=(1, 2, 3)).view(t, c).mean(dim=1).numpy()


def ssim(a: np.ndarray, b: np.ndarray, data_range: float = 255.0) -> float:
    """Mean over frames of :func:`per_frame_ssim`; 1.0 for identical inputs, symmetric."""
    return float(per_frame_ssim(a, b, data_range).mean())


def resize_video(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize ``(T, H, W, C)`` or ``(H, W, C)`` frames to ``size=(H, W)``, keeping rank and dtype.

    Bilinear with antialiasing (so downscaling does not alias); uint8 is rounded and clipped.
    """
    frames = np.asarray(frames)
    video = _as_video(frames, "frames")
    out_h, out_w = int(size[0]), int(size[1])
    if video.shape[1:3] == (out_h, out_w):
        return frames.copy()
    work = np.float64 if frames.dtype == np.float64 else np.float32
    z = torch.from_numpy(np.ascontiguousarray(video, dtype=work)).permute(0, 3, 1, 2)
    z = F.interpolate(z, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=True)
    out = z.permute(0, 2, 3, 1).numpy()
    if frames.dtype == np.uint8:
        out = np.clip(np.rint(out), 0, 255)
    out = out.astype(frames.dtype, copy=False)
    return out if frames.ndim == 4 else out[0]
