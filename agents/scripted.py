"""Scripted experts: Meta-World's hand-written policies behind the agent interface."""

from __future__ import annotations

from functools import cache

import numpy as np

from agents.base import Agent
from envs.errors import import_simulator
from envs.metaworld import INSTRUCTIONS
from envs.protocol import INSTRUCTION, PRIVILEGED_STATE

_TASK_OF_INSTRUCTION = {text: task for task, text in INSTRUCTIONS.items()}


@cache
def _policy(task: str):
    policies = import_simulator("metaworld.policies", "Meta-World", "metaworld")
    return policies.ENV_POLICY_MAP[f"{task}-v3"]()


class MetaWorldExpertAgent(Agent):
    """Meta-World's scripted expert for whichever task each observation's instruction names.

    It reads ``privileged_state`` (object and goal positions), so one agent serves a batch
    of envs running different tasks. Closed loop every step: nothing to replan.
    """

    def reads_pixels(self, env_index: int = 0) -> bool:
        return False  # acts on the simulator's privileged state

    def act_one(self, obs, env_index: int) -> np.ndarray:
        task = _TASK_OF_INSTRUCTION.get(obs[INSTRUCTION])
        if task is None:
            raise ValueError(f"no Meta-World expert for instruction {obs[INSTRUCTION]!r}")
        if PRIVILEGED_STATE not in obs:
            raise ValueError(f"MetaWorldExpertAgent needs obs[{PRIVILEGED_STATE!r}] (wam_gym Meta-World envs provide it)")
        action = _policy(task).get_action(np.asarray(obs[PRIVILEGED_STATE], dtype=np.float64))
        return np.clip(action, -1.0, 1.0).astype(np.float32)
