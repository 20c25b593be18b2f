"""Offscreen MuJoCo rendering: GL backend choice, fork safety and multi-camera frames."""

from __future__ import annotations

import ctypes.util
import os
import weakref
from collections.abc import Iterable, Sequence

import numpy as np

_GL_BACKENDS = {"egl": "EGL", "osmesa": "OSMesa"}
_GL_PACKAGES = "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri libosmesa6"


class _GLState:
    live_contexts = 0  # GL contexts open in this process
    forked_with_gl = False  # this process was forked while its parent held one


class GLBackendError(RuntimeError):
    pass


def select_gl_backend() -> str:
    """Set MUJOCO_GL (and PyOpenGL's platform) before mujoco is imported.

    A user's MUJOCO_GL wins; otherwise EGL when libEGL is present, else OSMesa.
    """
    chosen = os.environ.get("MUJOCO_GL", "").lower()
    if not chosen:
        chosen = next((b for b, lib in _GL_BACKENDS.items() if ctypes.util.find_library(lib)), "")
        if not chosen:
            raise GLBackendError(f"no offscreen GL library found (EGL or OSMesa): {_GL_PACKAGES}")
        os.environ["MUJOCO_GL"] = chosen
    if chosen in _GL_BACKENDS:
        os.environ.setdefault("PYOPENGL_PLATFORM", chosen)
    return chosen


def _mark_inherited_gl() -> None:
    # a child inherits the parent's context handles but not a usable context
    _GLState.forked_with_gl = _GLState.live_contexts > 0


os.register_at_fork(after_in_child=_mark_inherited_gl)


def _check_not_forked_with_gl() -> None:
    if _GLState.forked_with_gl:
        raise GLBackendError(
            "this process was forked from a parent that holds a GL context, which hangs EGL/OSMesa. "
            "Create vector envs with the spawn or forkserver context: "
            "gymnasium.make_vec(id, n, vectorization_mode='async', vector_kwargs={'context': 'forkserver'}) "
            "or envs.make_vec(id, n)"
        )


def geoms_of_bodies(model, prefix: str) -> list[int]:
    """Ids of the geoms on bodies whose name starts with ``prefix``."""
    return [g for g in range(model.ngeom) if model.body(model.geom_bodyid[g]).name.startswith(prefix)]


def _close_renderer(renderer) -> None:
    renderer.close()
    _GLState.live_contexts -= 1


class MujocoCameras:
    """Renders named cameras of one MuJoCo model into uint8 HxWx3 frames.

    The renderer (and so the GL context) is made on the first call, inside whichever
    process steps the env, never at construction: constructing envs in a parent and
    forking is then safe.
    """

    def __init__(
        self,
        model,
        cameras: Sequence[str],
        height: int,
        width: int,
        flip_vertical: Iterable[str] = (),
        shadows: bool = False,
    ):
        import mujoco

        available = [model.camera(i).name for i in range(model.ncam)]
        unknown = [c for c in cameras if c not in available]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; this scene has cameras {available}")
        self.model, self.cameras, self.height, self.width = model, tuple(cameras), height, width
        self.flip_vertical = frozenset(flip_vertical)
        if not shadows:  # software GL spends ~25x longer on shadow maps than on the scene
            model.vis.quality.shadowsize = 0
            model.vis.quality.offsamples = 0
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        self._mujoco = mujoco
        self._renderer = None

    def _ensure_renderer(self):
        if self._renderer is None:
            _check_not_forked_with_gl()
            self._renderer = self._mujoco.Renderer(self.model, self.height, self.width)
            _GLState.live_contexts += 1
            # free the context at exit while EGL is still up, not in __del__ during teardown
            self._finalizer = weakref.finalize(self, _close_renderer, self._renderer)
        return self._renderer

    def render(self, data, segmentation: bool = False) -> dict[str, np.ndarray]:
        """RGB frames, or with ``segmentation`` the geom id of each pixel (-1 for none)."""
        renderer = self._ensure_renderer()
        if segmentation:
            renderer.enable_segmentation_rendering()
        frames = {}
        try:
            for cam in self.cameras:
                renderer.update_scene(data, camera=cam)
                frame = renderer.render()
                frame = frame[..., 0] if segmentation else frame
                frames[cam] = np.ascontiguousarray(frame[::-1] if cam in self.flip_vertical else frame)
        finally:
            renderer.disable_segmentation_rendering()
        return frames

    def mean_row(self, data, camera: str, geoms) -> float:
        """Mean image row of the pixels showing ``geoms``: where a part sits in the picture."""
        seg = self.render(data, segmentation=True)[camera]
        rows, _ = np.nonzero(np.isin(seg, list(geoms)))
        if rows.size == 0:
            raise ValueError(f"none of geoms {list(geoms)[:5]}... is visible from camera {camera!r}")
        return float(rows.mean())

    def close(self) -> None:
        if self._renderer is not None:
            self._finalizer()
            self._renderer = None


def robosuite_cameras(env, cameras, height: int, width: int) -> MujocoCameras:
    """A camera rig on a robosuite env's MuJoCo model (LIBERO's envs are robosuite's); a camera the model lacks
    closes the env first, so a constructor that fails leaks no simulator."""
    try:
        return MujocoCameras(env.sim.model._model, cameras, height, width)
    except ValueError:
        env.close()
        raise
