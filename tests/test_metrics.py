import math

import numpy as np
import pytest

from wam_gym.utils.metrics import PSNR_CAP_DB, per_frame_psnr, per_frame_ssim, psnr, resize_video, ssim

RNG = np.random.default_rng(0)


def _video(t=3, h=16, w=20, c=3) -> np.ndarray:
    return RNG.integers(0, 256, size=(t, h, w, c), dtype=np.uint8)


# ---------------------------------------------------------------- PSNR


def test_psnr_constant_offset_uint8():
    a = np.full((2, 8, 8, 3), 100, np.uint8)
    b = a + np.uint8(10)
    expected = 20 * math.log10(255 / 10)
    assert psnr(a, b) == pytest.approx(expected)
    assert psnr(b, a) == pytest.approx(expected)  # no uint8 wrap-around either way
    np.testing.assert_allclose(per_frame_psnr(a, b), [expected, expected])


def test_psnr_known_mse_float_and_single_frame():
    a = np.zeros((4, 5, 1))
    b = a.copy()
    b[0, 0, 0] = 0.5  # MSE = 0.25 / 20
    assert psnr(a, b, data_range=1.0) == pytest.approx(10 * math.log10(20 / 0.25))
    assert per_frame_psnr(a, b, data_range=1.0).shape == (1,)


def test_psnr_identical_frames():
    a = _video()
    assert np.all(np.isinf(per_frame_psnr(a, a)))
    assert psnr(a, a) == PSNR_CAP_DB and math.isfinite(PSNR_CAP_DB)  # a number JSON can hold
    one_off = a.copy()
    one_off[0, 0, 0, 0] ^= 1  # the smallest difference a uint8 video can have still scores below the cap
    assert psnr(a, one_off) < PSNR_CAP_DB
    b = a.copy()
    b[1] = 255 - b[1]  # frame 1 differs, frames 0 and 2 are identical
    frames = per_frame_psnr(a, b)
    assert np.isinf(frames[[0, 2]]).all() and np.isfinite(frames[1])
    assert psnr(a, b) == pytest.approx((2 * PSNR_CAP_DB + frames[1]) / 3)


def test_shape_mismatch_names_dims():
    with pytest.raises(ValueError, match=r"H: 16 vs 8"):
        psnr(_video(h=16), _video(h=8))
    with pytest.raises(ValueError, match=r"T: 3 vs 2, W: 20 vs 10"):
        ssim(_video(t=3, w=20), _video(t=2, w=10))
    with pytest.raises(ValueError, match="ndim 4 vs 3"):
        psnr(_video(), _video()[0])
    with pytest.raises(ValueError, match=r"\(T, H, W, C\)"):
        psnr(np.zeros((4, 4)), np.zeros((4, 4)))


# ---------------------------------------------------------------- SSIM


def _ssim_by_loops(x: np.ndarray, y: np.ndarray, data_range: float) -> float:
    """SSIM of one (H, W) channel, window by window, straight from Wang et al.'s formula."""
    r = np.arange(11) - 5
    g = np.exp(-(r**2) / (2 * 1.5**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    vals = []
    for i in range(x.shape[0] - 10):
        for j in range(x.shape[1] - 10):
            px, py = x[i : i + 11, j : j + 11], y[i : i + 11, j : j + 11]
            mx, my = (w * px).sum(), (w * py).sum()
            vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
            cov = (w * (px - mx) * (py - my)).sum()
            num = (2 * mx * my + c1) * (2 * cov + c2)
            vals.append(num / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    return float(np.mean(vals))


def test_ssim_identical_is_one():
    a = _video()
    assert ssim(a, a) == pytest.approx(1.0)
    np.testing.assert_allclose(per_frame_ssim(a, a), np.ones(3))


def test_ssim_negative_is_low_and_symmetric():
    a = _video()
    neg = 255 - a
    assert ssim(a, neg) < 0.1
    noisy = np.clip(a.astype(int) + RNG.integers(-40, 41, a.shape), 0, 255).astype(np.uint8)
    assert ssim(a, noisy) == pytest.approx(ssim(noisy, a), abs=1e-12)
    assert 0.1 < ssim(a, noisy) < 1.0


def test_ssim_matches_windowed_reference():
    a = RNG.integers(0, 256, size=(2, 13, 15, 2)).astype(np.uint8)
    b = np.clip(a.astype(int) + RNG.integers(-60, 61, a.shape), 0, 255).astype(np.uint8)
    got = per_frame_ssim(a, b)
    x, y = a.astype(float), b.astype(float)
    want = [
        np.mean([_ssim_by_loops(x[t, ..., c], y[t, ..., c], 255.0) for c in range(2)])
        for t in range(2)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_ssim_constant_images_closed_form():
    # Flat images: no variance, so SSIM reduces to the luminance term everywhere.
    m, d = 0.4, 0.2
    a, b = np.full((12, 12, 1), m), np.full((12, 12, 1), m + d)
    c1 = 0.01**2
    expected = (2 * m * (m + d) + c1) / (m**2 + (m + d) ** 2 + c1)
    assert ssim(a, b, data_range=1.0) == pytest.approx(expected, rel=1e-12)


def test_ssim_rejects_small_frames():
    with pytest.raises(ValueError, match="11x11"):
        ssim(np.zeros((10, 12, 3)), np.zeros((10, 12, 3)))


# ---------------------------------------------------------------- resize


def test_resize_shapes_and_dtypes():
    v = _video(t=2, h=16, w=20)
    out = resize_video(v, (8, 10))
    assert out.shape == (2, 8, 10, 3) and out.dtype == np.uint8
    frame = resize_video(v[0].astype(np.float32) / 255, (32, 40))
    assert frame.shape == (32, 40, 3) and frame.dtype == np.float32
    same = resize_video(v, (16, 20))
    assert np.array_equal(same, v) and same is not v


def test_resize_keeps_constant_and_antialiases():
    flat = np.full((1, 16, 16, 3), 77, np.uint8)
    assert np.all(resize_video(flat, (5, 7)) == 77)
    # A 1-pixel checkerboard downscaled 8x must average out to grey, not alias to 0 or 255.
    checker = ((np.indices((64, 64)).sum(0) % 2) * 255).astype(np.uint8)[..., None]
    small = resize_video(checker, (8, 8))
    assert np.all(np.abs(small.astype(int) - 128) <= 2)
    # A horizontal ramp stays monotonic.
    ramp = np.tile(np.linspace(0, 1, 32), (4, 1))[..., None]
    assert np.all(np.diff(resize_video(ramp, (4, 12))[0, :, 0]) > 0)


def test_resize_then_compare():
    a = _video(t=1, h=32, w=32)
    b = resize_video(resize_video(a, (16, 16)), (32, 32))
    assert psnr(a, b) < PSNR_CAP_DB and -1 <= ssim(a, b) <= 1
