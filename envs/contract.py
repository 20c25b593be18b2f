"""The observation/action contract every wam_gym suite follows (key names: envs/protocol.py).

Observation (a ``spaces.Dict``):
    ``pixels``      Dict of camera name -> uint8 Box (H, W, 3)
    ``state``       float32 Box: the robot's proprioception in the suite's native units
    ``instruction`` Text: the task's language instruction
    ``privileged_state`` (optional) float32 Box: full simulator state, for scripted experts
Action: a float32 Box in the suite's native units. ``info["is_success"]`` on every step;
an episode terminates on success unless ``terminate_on_success=False`` (benchmarks count
an episode as solved the first time it succeeds).

Rendering is most of a step's cost (a 224 px camera costs ~100x the physics of a Meta-World
step), and an agent that executes action chunks reads one observation per chunk. An env made
with ``lazy_pixels=True`` renders its cameras only at reset and on the steps asked for: set
``env.unwrapped.pixels_requested = True`` before the step whose observation you will read (a
vector env: ``envs.set_attr("pixels_requested", [True, False, ...])``); each step clears it.
Other steps' ``pixels`` are black frames, and ``info["pixels_rendered"]`` says which is which.
Physics, rewards and success never depend on it. By default (``lazy_pixels=False``) every
observation has its pixels.

:class:`SuiteEnv` implements the contract once; a suite only supplies the simulator hooks.
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import read_from_shared_memory

from envs.protocol import INSTRUCTION, IS_SUCCESS, PIXELS, PIXELS_RENDERED, PRIVILEGED_STATE, STATE

INSTRUCTION_MAX_LENGTH = 512
INSTRUCTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "


class InstructionSpace(spaces.Text):
    """The instruction's Text space; exists so async vector envs can batch it correctly."""


class _SharedInstructions(Sequence):
    """Live view of instructions in an AsyncVectorEnv's shared memory.

    gymnasium reads shared memory once, when the vector env is built, and relies on numpy
    views staying live; its Text reader returns a tuple of copies instead, so every later
    batch would show the (empty) strings of construction time. This view decodes on access,
    and a deepcopy (what AsyncVectorEnv returns with copy=True) is a plain tuple.
    """

    def __init__(self, space: spaces.Text, shared_memory, n: int):
        self._codes = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, space.max_length)
        self._chars = space.character_list

    def __len__(self) -> int:
        return len(self._codes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        return "".join(self._chars[c] for c in self._codes[i] if c < len(self._chars))

    def __eq__(self, other):
        return tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __deepcopy__(self, memo) -> tuple[str, ...]:
        return tuple(self)


@read_from_shared_memory.register(InstructionSpace)
def _read_instructions(space, shared_memory, n: int = 1) -> _SharedInstructions:
    return _SharedInstructions(space, shared_memory, n)


def instruction_space() -> InstructionSpace:
    return InstructionSpace(max_length=INSTRUCTION_MAX_LENGTH, min_length=0, charset=INSTRUCTION_CHARSET)


def pixel_space(cameras: Sequence[str], height: int, width: int) -> spaces.Dict:
    return spaces.Dict({c: spaces.Box(0, 255, (height, width, 3), np.uint8) for c in cameras})


def vector_space(dim: int, low: float = -np.inf, high: float = np.inf) -> spaces.Box:
    return spaces.Box(low, high, (dim,), np.float32)


MAX_IMAGE_SIZE = 4096  # pixels a side: more is a typo (a camera's buffer of 10^5 x 10^5 would not fit in memory)


def parse_image_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    """``128`` or ``(height, width)`` -> (height, width)."""
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= MAX_IMAGE_SIZE
                                 for s in size):
        raise ValueError(f"image_size must be a positive int or (height, width), got {image_size!r}: give sides "
                         f"in [1, {MAX_IMAGE_SIZE}] pixels")
    return size


class SuiteEnv(gym.Env, ABC):
    """One task of one benchmark suite, with pixels, state and an instruction.

    Subclasses set ``suite`` and implement the ``_sim_*`` hooks; this class owns the spaces,
    input validation, seeding and the ``is_success`` bookkeeping.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 20}
    suite: ClassVar[str]

    def __init__(
        self,
        cameras: Sequence[str],
        image_size: int | Sequence[int],
        state_dim: int,
        action_space: spaces.Box,
        instruction: str,
        privileged_state_dim: int | None = None,
        render_mode: str | None = None,
        terminate_on_success: bool = True,
        lazy_pixels: bool = False,
    ):
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        if not cameras:
            raise ValueError("at least one camera is required")
        self.cameras = tuple(cameras)
        self.height, self.width = parse_image_size(image_size)
        self.render_mode = render_mode
        self.instruction = instruction
        self.terminate_on_success = terminate_on_success
        self.action_space = action_space
        obs = {
            PIXELS: pixel_space(self.cameras, self.height, self.width),
            STATE: vector_space(state_dim),
            INSTRUCTION: instruction_space(),
        }
        if privileged_state_dim is not None:
            obs[PRIVILEGED_STATE] = vector_space(privileged_state_dim)
        self.observation_space = spaces.Dict(obs)
        self._last_frames: dict[str, np.ndarray] | None = None
        self.lazy_pixels = lazy_pixels  # render only at reset and when pixels_requested (see the module's doc)
        self.pixels_requested = False  # lazy_pixels: the next step renders its cameras; every step clears it
        # whether the step being taken renders: a simulator that renders inside its own step reads it
        self._rendering = True

    # -- simulator hooks ---------------------------------------------------------------
    @abstractmethod
    def _sim_reset(self, seed: int | None, options: dict[str, Any]) -> None:
        """Reset the simulator; ``seed`` (when given) fixes the initial state exactly."""

    @abstractmethod
    def _sim_step(self, action: np.ndarray) -> tuple[float, bool, bool, dict[str, Any]]:
        """Apply one action; return (reward, success, terminated, extra info)."""

    @abstractmethod
    def _sim_frames(self) -> dict[str, np.ndarray]:
        """uint8 HxWx3 frame for every camera in ``self.cameras``."""

    @abstractmethod
    def _sim_state(self) -> np.ndarray:
        """Proprioceptive state."""

    def _sim_privileged_state(self) -> np.ndarray | None:
        return None

    def _sim_control_hz(self) -> float:
        """Env steps per simulated second, as the simulator sets them (its control frequency)."""
        return float(self.metadata["render_fps"])

    @property
    def control_hz(self) -> float:
        """Env steps per simulated second: what a real-time evaluation converts model latency with."""
        return self._sim_control_hz()

    # -- gymnasium API -----------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._rendering, self.pixels_requested = True, False
        self._sim_reset(seed, dict(options or {}))
        info = {IS_SUCCESS: False, **({PIXELS_RENDERED: True} if self.lazy_pixels else {})}
        return self._observation(), info

    def step(self, action):
        action = self._checked_action(action)
        self._rendering, self.pixels_requested = not self.lazy_pixels or self.pixels_requested, False
        reward, success, terminated, info = self._sim_step(action)
        info[IS_SUCCESS] = bool(success)
        if self.lazy_pixels:
            info[PIXELS_RENDERED] = self._rendering
        terminated = terminated or (success and self.terminate_on_success)
        return self._observation(), float(reward), bool(terminated), False, info

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        frames = self._last_frames or self._sim_frames()
        return frames[self.cameras[0]]

    # -- contract ------------------------------------------------------------------------
    def _checked_action(self, action) -> np.ndarray:
        arr = np.asarray(action, dtype=np.float32)
        expected = self.action_space.shape
        if arr.shape != expected:
            raise ValueError(
                f"{self.suite} action must have shape {expected} (got {arr.shape}); "
                f"for a batch of envs use a VectorEnv, which takes shape (num_envs, *{expected})"
            )
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{self.suite} action contains NaN or inf: {arr}; send finite actions "
                             "(the policy that produced it diverged: check its inputs and weights)")
        return arr

    def _black_frames(self) -> dict[str, np.ndarray]:
        """A lazy step's pixels: new arrays each time (a user may keep every observation), zeros cost ~nothing."""
        return {c: np.zeros((self.height, self.width, 3), np.uint8) for c in self.cameras}

    def _observation(self) -> dict[str, Any]:
        self._last_frames = self._sim_frames() if self._rendering else None
        obs = {
            PIXELS: self._last_frames or self._black_frames(),
            STATE: np.asarray(self._sim_state(), dtype=np.float32),
            INSTRUCTION: self.instruction,
        }
        if PRIVILEGED_STATE in self.observation_space.spaces:
            obs[PRIVILEGED_STATE] = np.asarray(self._sim_privileged_state(), dtype=np.float32)
        return obs
