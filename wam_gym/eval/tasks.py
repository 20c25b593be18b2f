"""What an evaluation runs: task sets, tasks, and the episode plan.

A task is an env id, optionally with a LIBERO task index: ``wam_gym/MetaWorld-reach-v3``,
``wam_gym/LIBERO-Spatial-v0:3``. ``MULTIRUN.task_sets`` lists named sets (below) or tasks.
Trial ``k`` of every task uses seed ``EVALUATION.seed + k``; LIBERO pins its init state to
the trial (``init_state_id = k``), and each record says which one it used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envs import libero, maniskill, metaworld, robosuite
from envs.registry import suite_of

_MT10 = ("reach", "push", "pick-place", "door-open", "drawer-open", "drawer-close", "button-press-topdown",
         "peg-insert-side", "window-open", "window-close")


def _libero(name: str) -> list[str]:
    count = libero.SUITES[name][1]
    return [f"wam_gym/LIBERO-{name}-v0:{i}" for i in range(count)]


TASK_SETS: dict[str, list[str]] = {
    # The embedded default (make demo): tasks the scripted expert solves in under 150 steps
    # and a random agent rarely does (0-30% in bench runs), in four distinct scenes.
    "metaworld_demo": [f"wam_gym/MetaWorld-{t}-v3" for t in ("door-close", "window-close", "button-press-topdown",
                                                               "drawer-close")],
    "metaworld_mt10": [f"wam_gym/MetaWorld-{t}-v3" for t in _MT10],
    "metaworld_mt50": [f"wam_gym/MetaWorld-{t}-v3" for t in metaworld.TASKS],
    # libero_spatial, ..., libero_90 and LIBERO-Pro's libero_pro_<base>_<perturbation> (libero_pro_spatial_swap)
    **{f"libero_{n.lower().replace('-', '_')}": _libero(n) for n in libero.SUITES},
    "robosuite": [f"wam_gym/Robosuite-{t}-v0" for t in robosuite.TASKS],
    "maniskill": [f"wam_gym/ManiSkill-{t}-v1" for t in maniskill.TASKS],
}
BENCHMARK_TASK_SETS = {
    "metaworld": ["metaworld_mt10"],
    "libero": ["libero_spatial", "libero_object", "libero_goal", "libero_10"],
    "libero_pro": [f"libero_pro_{b.lower()}_{p.lower()}" for b in libero.PRO_BASES for p in libero.PRO_PERTURBATIONS],
    "robosuite": ["robosuite"],
    "maniskill": ["maniskill"],
}


@dataclass(frozen=True)
class Task:
    name: str  # as written in task_sets and results
    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def pins_init_state(self) -> bool:
        return self.env_id.startswith("wam_gym/LIBERO-")


@dataclass(frozen=True)
class Job:
    """One episode to run (``attempts`` counts tries after worker deaths)."""

    task: Task
    trial: int
    seed: int
    attempts: int = 1

    @property
    def key(self) -> tuple[str, int]:
        return self.task.name, self.trial

    @property
    def reset_options(self) -> dict[str, Any] | None:
        return {"init_state_id": self.trial} if self.task.pins_init_state else None


def parse_task(name: str) -> Task:
    env_id, _, index = name.partition(":")
    suite = suite_of(env_id)  # unknown ids fail here, with suggestions
    if not index:
        return Task(name, env_id)
    if not index.isdigit():
        raise ValueError(f"task {name!r}: the part after ':' is a task index (e.g. wam_gym/LIBERO-Spatial-v0:3)")
    # Checked here: otherwise every actor would fail on its first episode, after the model loaded.
    count = _task_count(suite, env_id)
    if count is None:
        raise ValueError(f"task {name!r}: {env_id} takes no task index (only LIBERO ids do); drop the ':{index}'")
    if int(index) >= count:
        raise ValueError(f"task {name!r}: {env_id} has task indices 0..{count - 1}")
    return Task(name, env_id, {"task_id": int(index)})


def _task_count(suite, env_id: str) -> int | None:
    """How many task indices ``env_id:<k>`` takes; None for ids without any."""
    if suite.name != "libero":
        return None
    return libero.SUITES[suite.env_kwargs[env_id]["suite"]][1]


def resolve_tasks(task_sets: Sequence[str]) -> list[Task]:
    """Expand set names and task names, in order, without repeats."""
    names: list[str] = []
    for entry in task_sets:
        if entry in TASK_SETS:
            names += TASK_SETS[entry]
        elif "/" in entry:
            names.append(entry)
        else:
            raise ValueError(f"unknown task set {entry!r}; known sets: {sorted(TASK_SETS)} (or give env ids)")
    return [parse_task(n) for n in dict.fromkeys(names)]


def plan(tasks: Sequence[Task], num_trials: int, base_seed: int, by_trial: bool = False) -> list[Job]:
    """Every (task, trial) job, task by task (an actor keeps one env per task it met), or with
    ``by_trial`` trial by trial across the tasks (a run that may stop early covers every task evenly)."""
    if num_trials < 1:
        raise ValueError(f"EVALUATION.num_trials must be >= 1, got {num_trials}")
    if by_trial:
        return [Job(task, trial, base_seed + trial) for trial in range(num_trials) for task in tasks]
    return [Job(task, trial, base_seed + trial) for task in tasks for trial in range(num_trials)]
