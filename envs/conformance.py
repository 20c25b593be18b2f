"""Whether an env keeps the observation contract (envs/contract.py): what ``python -m wam_gym.envs check`` asks
of every registered id beside gymnasium's own checker.

gymnasium's checker holds observations to the env's own spaces; it cannot say that the spaces are the contract's
(a float image, a state of shape (2, 3), no instruction all pass it). A suite built on :class:`SuiteEnv` keeps the
contract by construction; a plugin's env need not be, so this checks the spaces and every observation it gives.
Each problem is one :class:`ContractError` line naming the key, what it is and what the contract wants.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from envs.protocol import INSTRUCTION, IS_SUCCESS, PIXELS, PRIVILEGED_STATE, STATE

CONTRACT = "the contract (envs/contract.py)"


class ContractError(ValueError):
    """An env's spaces or observations are not the observation contract's."""


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise ContractError(f"{problem}; {CONTRACT} wants it")


def _is_vector(space: Any) -> bool:
    return isinstance(space, spaces.Box) and space.dtype == np.float32 and len(space.shape) == 1


def check_spaces(env) -> None:
    """The observation space is a Dict of pixels (a uint8 (H, W, 3) Box per camera), a 1-d float32 state and a
    Text instruction (and, if any, a 1-d float32 privileged_state); the action space a float32 Box."""
    obs_space = env.observation_space
    _require(isinstance(obs_space, spaces.Dict), f"observation_space is {type(obs_space).__name__}, not a Dict")
    missing = [k for k in (PIXELS, STATE, INSTRUCTION) if k not in obs_space.spaces]
    _require(not missing, f"observation_space has no {missing}: it has {list(obs_space.spaces)}")
    pixels = obs_space[PIXELS]
    _require(isinstance(pixels, spaces.Dict) and len(pixels.spaces) > 0,
             f"observation_space['{PIXELS}'] is {pixels}, not a Dict of one Box per camera")
    for camera, box in pixels.spaces.items():
        _require(isinstance(box, spaces.Box) and box.dtype == np.uint8 and len(box.shape) == 3 and box.shape[2] == 3,
                 f"observation_space['{PIXELS}']['{camera}'] is {box}, not a uint8 Box (H, W, 3)")
    _require(_is_vector(obs_space[STATE]), f"observation_space['{STATE}'] is {obs_space[STATE]}, not a 1-d float32 Box")
    _require(isinstance(obs_space[INSTRUCTION], spaces.Text),
             f"observation_space['{INSTRUCTION}'] is {obs_space[INSTRUCTION]}, not a Text space")
    if PRIVILEGED_STATE in obs_space.spaces:
        _require(_is_vector(obs_space[PRIVILEGED_STATE]),
                 f"observation_space['{PRIVILEGED_STATE}'] is {obs_space[PRIVILEGED_STATE]}, not a 1-d float32 Box")
    action = env.action_space
    _require(isinstance(action, spaces.Box) and action.dtype == np.float32,
             f"action_space is {action}, not a float32 Box")


def check_observation(env, obs: dict, info: dict, when: str) -> None:
    """``obs`` lies in the observation space key by key, with an instruction, and ``info`` says is_success."""
    for key, space in env.observation_space.spaces.items():
        _require(key in obs, f"{when}: the observation has no '{key}' (it has {sorted(obs)})")
        if key == PIXELS:
            _require(isinstance(obs[PIXELS], dict), f"{when}: obs['{PIXELS}'] is {type(obs[PIXELS]).__name__}, "
                                                    "not a dict of camera name -> frame")
            for camera, box in space.spaces.items():
                frame = np.asarray(obs[PIXELS].get(camera))
                _require(box.contains(frame), f"{when}: obs['{PIXELS}']['{camera}'] is {frame.dtype} "
                                              f"{frame.shape}, not uint8 {box.shape}")
        else:
            _require(space.contains(obs[key]), f"{when}: obs['{key}'] = {obs[key]!r:.80} is not in {space}")
    _require(bool(obs[INSTRUCTION].strip()), f"{when}: obs['{INSTRUCTION}'] is empty")
    _require(isinstance(info.get(IS_SUCCESS), (bool, np.bool_)),
             f"{when}: info['{IS_SUCCESS}'] is {info.get(IS_SUCCESS)!r}, not a bool")


def check_contract(env, steps: int, seed: int = 0) -> dict:
    """The spaces, then the observation of a seeded reset and of ``steps`` random steps (resetting where an
    episode ends); returns the last observation."""
    check_spaces(env)
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    check_observation(env, obs, info, "reset")
    for step in range(steps):
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        check_observation(env, obs, info, f"step {step + 1}")
        if terminated or truncated:
            obs, info = env.reset()
            check_observation(env, obs, info, f"reset after step {step + 1}")
    return obs
