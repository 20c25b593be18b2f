"""Random clip augmentation (dataset.deterministic=false): what each op does, that a clip's
frames move together, that draws depend only on (seed, epoch, position), and that training
with it stays exact across DataLoader workers and resumes."""

import pytest
import torch
import torch.nn.functional as F

from training.data.augment import AugmentConfig, AugmentedClips, augment_clip

OFF = dict(random_shift=0, brightness=0.0, contrast=0.0, saturation=0.0)


def clip(frames=3, h=16, w=16, cameras=2, seed=0) -> torch.Tensor:
    """(3, F, H, W * cameras) in [-1, 1]; every frame of a camera the same picture."""
    g = torch.Generator().manual_seed(seed)
    views = [torch.rand(3, 1, h, w, generator=g).expand(3, frames, h, w) * 2 - 1 for _ in range(cameras)]
    return torch.cat(views, dim=-1).contiguous()


def draw(seed=0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_all_ops_off_is_the_identity():
    video = clip()
    assert torch.equal(augment_clip(video, 2, AugmentConfig(**OFF), draw()), video)


def test_shift_is_a_crop_of_the_replicate_padded_view_the_same_for_every_frame():
    video, pad = clip(), 3
    out = augment_clip(video, 2, AugmentConfig(**{**OFF, "random_shift": pad}), draw(1))
    assert out.shape == video.shape
    for cam in range(2):
        view, moved = video[..., cam * 16 : (cam + 1) * 16], out[..., cam * 16 : (cam + 1) * 16]
        padded = F.pad(view, (pad,) * 4, mode="replicate")
        found = [(top, left) for top in range(2 * pad + 1) for left in range(2 * pad + 1)
                 if torch.equal(padded[..., top : top + 16, left : left + 16], moved)]
        assert found, "not a crop of the padded view (or frames moved differently)"
    assert all(torch.equal(out[:, 0], out[:, f]) for f in range(3))  # identical frames stay identical


def test_colour_jitter_keeps_range_and_differs_per_camera():
    video = torch.cat([clip(cameras=1, seed=3)] * 2, dim=-1)  # two cameras with the same picture
    out = augment_clip(video, 2, AugmentConfig(random_shift=0, brightness=0.4, contrast=0.4, saturation=0.4), draw(2))
    assert out.min() >= -1 and out.max() <= 1
    assert not torch.equal(out[..., :16], out[..., 16:])  # each camera its own draw
    assert all(torch.equal(out[:, 0], out[:, f]) for f in range(3))


class FakeClips:
    cameras = ("a", "b")

    def __len__(self):
        return 5

    def __getitem__(self, position):
        return {"video": clip(seed=position), "index": position}


def test_draws_depend_only_on_seed_epoch_and_position():
    config = AugmentConfig(random_shift=4, brightness=0.3)
    a, b = AugmentedClips(FakeClips(), config, seed=7), AugmentedClips(FakeClips(), config, seed=7)
    assert torch.equal(a[(0, 2)]["video"], b[(0, 2)]["video"])
    assert torch.equal(a[(1, 2)]["video"], a[(1, 2)]["video"])
    assert not torch.equal(a[(0, 2)]["video"], a[(1, 2)]["video"])  # a new epoch, a new draw
    assert not torch.equal(a[(0, 2)]["video"], AugmentedClips(FakeClips(), config, seed=8)[(0, 2)]["video"])


@pytest.mark.parametrize("field, value", [("random_shift", -1), ("random_shift", 1.5), ("brightness", 1.0),
                                          ("saturation", -0.1)])
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=f"dataset.augment.{field}"):
        AugmentConfig(**{field: value})
