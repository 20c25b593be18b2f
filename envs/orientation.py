"""Which way up a camera frame is: one name per orientation, and the one conversion between them. Numpy only.

Every wam_gym env returns **upright** frames (the sky at the top, the robot's left on the image's left), and
so does everything inside wam_gym: the observation contract, datasets we write, the broker's requests. A
frame from elsewhere says how it is turned relative to upright, and is converted into the contract once,
where it enters (the policy server for a driver's frames, the dataset reader for a dataset's); a model whose
own convention is another orientation (FastWAM's LIBERO release) converts out of the contract once, in its
processor. The four orientations, as index flips of an upright frame ``(H, W, C)``:

``upright``       as is
``mirrored``      left and right swapped, ``[:, ::-1]``: what the field's LIBERO drivers send (openpi's
                  ``examples/libero/main.py`` and vla-eval's LIBERO benchmarks turn robosuite's raw frame,
                  which is upside down, by 180 degrees, ``[::-1, ::-1]``; the result is upright mirrored),
                  and what LIBERO datasets made by openpi's and LeRobot's converters store
``upside_down``   top and bottom swapped, ``[::-1]``: robosuite's and MuJoCo's raw OpenGL frame
``rotated_180``   both, ``[::-1, ::-1]``

Each is its own inverse, so converting ``a`` to ``b`` flips the axes where they differ.
"""

from __future__ import annotations

import numpy as np

# orientation -> (rows flipped, columns flipped) relative to upright
ORIENTATIONS: dict[str, tuple[bool, bool]] = {
    "upright": (False, False),
    "mirrored": (False, True),
    "upside_down": (True, False),
    "rotated_180": (True, True),
}
UPRIGHT = "upright"


def check_orientation(name: str, knob: str) -> str:
    """``name`` when it is an orientation, else a one-line error naming ``knob`` and the choices."""
    if name not in ORIENTATIONS:
        raise ValueError(f"{knob}={name!r} is not a frame orientation: choose one of {sorted(ORIENTATIONS)} "
                         "(how the frames are turned relative to an upright image)")
    return name


def reorient(images: np.ndarray, source: str, target: str) -> np.ndarray:
    """``images`` (..., H, W, C) stored ``source`` -> the same pixels as ``target`` would store them (a view
    where nothing moves; flipped views otherwise, which numpy and torch copy when made contiguous)."""
    rows = ORIENTATIONS[source][0] != ORIENTATIONS[target][0]
    cols = ORIENTATIONS[source][1] != ORIENTATIONS[target][1]
    images = np.asarray(images)
    if images.ndim < 3:
        raise ValueError(f"a frame is (H, W, C), got shape {images.shape}")
    index = [slice(None)] * images.ndim
    if rows:
        index[-3] = slice(None, None, -1)
    if cols:
        index[-2] = slice(None, None, -1)
    return images[tuple(index)]


def reorient_tiles(images: np.ndarray, tiles: int, source: str, target: str) -> np.ndarray:
    """``images`` (..., H, W * tiles, C) of ``tiles`` cameras side by side: each camera reoriented in its own
    place (mirroring the whole row would also swap the cameras)."""
    views = np.split(np.asarray(images), tiles, axis=-2)
    return np.concatenate([reorient(view, source, target) for view in views], axis=-2)


def to_upright(images: np.ndarray, source: str) -> np.ndarray:
    """Frames stored ``source`` as the contract stores them (upright), contiguous."""
    return np.ascontiguousarray(reorient(images, source, UPRIGHT))
