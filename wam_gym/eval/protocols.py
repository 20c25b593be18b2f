"""Named evaluation protocols (``EVALUATION.protocol``): another project's benchmark side, as plain data.

wam_gym's own defaults follow openpi (``EVALUATION.protocol=null``). A named protocol fixes what an
episode is under another project's evaluation, so that a score can be set beside theirs:

- the env side: the env kwargs of every task (cameras, image size, settle steps), the policy steps an
  episode may take per suite, the init-state rule, the suite it is defined for (tasks of another are refused);
- the agent side that decides which actions run: actions executed per predicted chunk (``replan_steps``),
  the chunk's length (``action_horizon``), denoising steps per call and the noise seed;
- for ``EVALUATION.agent=wam``, the name of the model-side input convention (image orientation, crop,
  camera layout, prompt, gripper post-processing) a checkpoint must declare as ``inputs.name`` in its
  ``wam_config.json``. For agent=remote or python the env side applies and the model side is the caller's.

How it meets the user's knobs (:func:`apply`, from ``EvalConfig.__post_init__``): a knob left at its
default takes the protocol's value; one set to another value than the protocol's is refused, naming both.
protocol.json records the protocol's name and every setting it fixes, so ``python -m wam_gym.compare``
refuses to pair a run under another protocol, and a resume under another protocol is refused.

Read a protocol from other code as ``PROTOCOLS["fastwam_libero"]`` (an :class:`EvalProtocol`), or
:func:`named` for ``EVALUATION.protocol``'s value (None for null).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.contract import parse_image_size
from envs.registry import suite_of

CONFIG_FILE = "wam_config.json"  # agents.wam.checkpoint.CONFIG_FILE (importing that module costs seconds)
# EVALUATION knobs a protocol fixes, besides max_episode_steps (fixed per suite) and the env kwargs
FIXED_KNOBS = ("replan_steps", "action_horizon", "num_inference_steps", "seed")


@dataclass(frozen=True)
class EvalProtocol:
    """What a named protocol fixes. A subclass per protocol gives every field its value, and says where
    each comes from."""

    name: str  # EVALUATION.protocol's value
    suite: str  # the env suite (envs.registry.Suite.name) it is defined for; tasks of other suites are refused
    env_kwargs: dict[str, Any]  # constructor kwargs of every task's env
    max_steps: dict[str, int]  # policy steps an episode may take (after the settle steps), by LIBERO base benchmark
    replan_steps: int | None  # actions executed of each predicted chunk before the next model call
    action_horizon: int | None  # actions of a chunk the agent may use; null: the model's full horizon
    action_ensembling: bool  # whether overlapping chunks are averaged (wam_gym has none: protocols say false)
    num_inference_steps: int  # denoising steps per model call
    seed: int  # EVALUATION.seed: the sampling noise's, and trial k's env seed is seed + k
    init_state: str  # which init state trial k starts from
    model_inputs: str | None  # agent=wam: the input convention the checkpoint must declare (wam_config.json inputs.name)

    def max_steps_for(self, env_id: str) -> int | None:
        """The step limit this protocol gives ``env_id``'s episodes (None: it fixes none for that suite)."""
        return self.max_steps.get(_benchmark_of(env_id))

    def fixed(self) -> dict[str, Any]:
        """Every setting it fixes, as protocol.json records them (the name apart)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "name"}


@dataclass(frozen=True)
class FastWAMLibero(EvalProtocol):
    """FastWAM's LIBERO evaluation (github.com/yuantianyuan01/FastWAM), benchmark side.

    Where each fact comes from, in their repository:

    - cameras ``agentview`` and ``robot0_eye_in_hand`` at 256 x 256: ``experiments/libero/libero_utils.py``,
      ``LIBERO_ENV_RESOLUTION = 256`` and ``get_libero_env`` (camera_heights/widths) and ``get_libero_image``
      (the two cameras); the model's own crop and resize to 224 belong to its input convention, not here;
    - 30 settle steps of ``[0, 0, 0, 0, 0, 0, -1]`` after the init state is set: ``configs/sim_libero.yaml``
      ``EVALUATION.num_steps_wait: 30``, run by ``eval_libero_single.py`` ``run_single_episode`` with
      ``libero_utils.get_libero_dummy_action`` (wam_gym's LiberoEnv settles 10 by default);
    - policy steps per suite, counted after the settle steps: ``eval_libero_single.py`` ``_get_max_steps``
      (LIBERO-Pro's sets take their base suite's figure);
    - 10 actions executed per chunk, no ensembling, the model's full chunk: ``sim_libero.yaml``
      ``replan_steps: 10``, ``use_action_ensembler: false``, ``action_horizon: null`` (``eval_single_process``:
      the model's ``num_frames - 1``);
    - 10 denoising steps: ``configs/train.yaml`` ``eval_num_inference_steps: 10`` (``sim_libero.yaml``
      ``num_inference_steps: ${eval_num_inference_steps}``); noise seed 42: ``train.yaml`` ``seed: 42``, passed
      as ``seed`` to every model call by ``_predict_action_chunk``;
    - trial k starts from init state k: ``run_single_task`` (``initial_states[trial_idx]``);
    - the model-side convention ``fastwam_libero`` (image orientation, crop, camera layout, prompt, gripper):
      ``agents/wam/fastwam/inputs.py``, from ``_obs_to_model_input``, ``_predict_action_chunk`` and
      ``libero_utils.get_libero_image``.

    Known differences, not reproduced:

    - their ``env.seed(42)`` (``get_libero_env``) moves the fixtures the init states leave out; wam_gym draws
      that placement jitter from the init-state id, so an init state fixes the whole scene;
    - they render with robosuite's renderer and store its raw frames (flipped); wam_gym renders upright with
      MuJoCo's renderer, and the model-side convention turns our frames into theirs;
    - they pass the same seed to every model call, so every call draws the same noise; wam_gym derives each
      row's noise from its episode's seed and call count (the same whatever the batching).
    """

    name: str = "fastwam_libero"  # EVALUATION.protocol=fastwam_libero
    suite: str = "libero"  # their LIBERO evaluation (experiments/libero)
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {  # libero_utils.py, sim_libero.yaml num_steps_wait
        "cameras": ["agentview", "robot0_eye_in_hand"], "image_size": [256, 256], "settle_steps": 30})
    max_steps: dict[str, int] = field(default_factory=lambda: {  # eval_libero_single.py _get_max_steps
        "libero_spatial": 400, "libero_object": 400, "libero_goal": 400, "libero_10": 700, "libero_90": 700})
    replan_steps: int | None = 10  # sim_libero.yaml replan_steps
    action_horizon: int | None = None  # sim_libero.yaml action_horizon: null (the model's num_frames - 1)
    action_ensembling: bool = False  # sim_libero.yaml use_action_ensembler
    num_inference_steps: int = 10  # train.yaml eval_num_inference_steps
    seed: int = 42  # train.yaml seed
    init_state: str = "init state k for trial k"  # eval_libero_single.py run_single_task
    model_inputs: str | None = "fastwam_libero"  # agents/wam/fastwam/inputs.py


PROTOCOLS: dict[str, EvalProtocol] = {p.name: p for p in (FastWAMLibero(),)}


def named(name: str | None) -> EvalProtocol | None:
    """``EVALUATION.protocol``'s protocol (None for null), or an error listing the known names."""
    if name is None:
        return None
    if name not in PROTOCOLS:
        raise ValueError(f"EVALUATION.protocol={name!r} is not a known protocol: choose one of {sorted(PROTOCOLS)}, "
                         "or null (wam_gym's defaults)")
    return PROTOCOLS[name]


def of_convention(convention: str | None) -> EvalProtocol | None:
    """The protocol a checkpoint of input convention ``convention`` was made for (FastWAM's LIBERO release:
    fastwam_libero), None when no protocol names it: the policy server serves such a checkpoint by it."""
    return next((p for p in PROTOCOLS.values() if convention is not None and p.model_inputs == convention), None)


def _benchmark_of(env_id: str) -> str:
    """The key a protocol's per-suite figures use: a LIBERO id's base benchmark (libero_spatial), else the id."""
    suite = suite_of(env_id)
    if suite.name != "libero":
        return env_id
    from envs.libero import base_benchmark

    return base_benchmark(suite.env_kwargs[env_id]["suite"])


# ----------------------------------------------------------------- the user's knobs
def _refuse(protocol: EvalProtocol, knob: str, value: Any, fixed: Any) -> ValueError:
    return ValueError(f"{knob}={json.dumps(value)} conflicts with EVALUATION.protocol={protocol.name}, which fixes it "
                      f"to {json.dumps(fixed)}: drop the override, or drop EVALUATION.protocol")


def _same_env_kwarg(key: str, a: Any, b: Any) -> bool:
    if key == "image_size":
        try:
            return parse_image_size(a) == parse_image_size(b)
        except (TypeError, ValueError):
            return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def apply(config) -> None:
    """Set what ``config.EVALUATION.protocol`` fixes on ``config`` (an EvalConfig), refusing a knob the user
    set to another value. A knob left at its default takes the protocol's value."""
    from wam_gym.eval.config import EvaluationConfig

    ev = config.EVALUATION
    protocol = named(ev.protocol)
    if protocol is None:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(EvaluationConfig)}
    for knob in FIXED_KNOBS:
        value, fixed = getattr(ev, knob), getattr(protocol, knob)
        if value != fixed and value != defaults[knob]:
            raise _refuse(protocol, f"EVALUATION.{knob}", value, fixed)
        setattr(ev, knob, fixed)
    if ev.max_episode_steps is not None:
        raise _refuse(protocol, "EVALUATION.max_episode_steps", ev.max_episode_steps, protocol.max_steps)
    for key, fixed in protocol.env_kwargs.items():
        if key in config.env_kwargs and not _same_env_kwarg(key, config.env_kwargs[key], fixed):
            raise _refuse(protocol, f"env_kwargs.{key}", config.env_kwargs[key], fixed)
    config.env_kwargs = {**config.env_kwargs, **copy.deepcopy(protocol.env_kwargs)}


def episode_steps(evaluation, env_id: str) -> int:
    """The policy steps an episode of ``env_id`` may take: EVALUATION.max_episode_steps, else the protocol's
    figure for its suite, else the suite's own limit."""
    if evaluation.max_episode_steps is not None:
        return evaluation.max_episode_steps
    protocol = named(evaluation.protocol)
    steps = protocol.max_steps_for(env_id) if protocol is not None else None
    return steps if steps is not None else suite_of(env_id).episode_steps(env_id)


# ----------------------------------------------------------------- what a run evaluates
def check_plan(protocol: EvalProtocol | None, tasks, jobs) -> None:
    """Every task is of the protocol's suite, and trial k starts from init state k."""
    if protocol is None:
        return
    for task in tasks:
        suite = suite_of(task.env_id).name
        if suite != protocol.suite:
            raise ValueError(f"EVALUATION.protocol={protocol.name} evaluates {protocol.suite} tasks, and {task.name} "
                             f"is a {suite} task: evaluate {protocol.suite} tasks (benchmark={protocol.suite}), "
                             "or drop EVALUATION.protocol")
    for job in jobs:  # the planner's rule (tasks.Job.reset_options); a protocol states it, so it is held to it
        if job.reset_options != {"init_state_id": job.trial}:
            raise ValueError(f"EVALUATION.protocol={protocol.name} starts trial k from init state k, and "
                             f"{job.task.name} trial {job.trial} would reset with {job.reset_options}: "
                             "evaluate tasks with init states, or drop EVALUATION.protocol")


def check_checkpoint_inputs(protocol: EvalProtocol | None, ckpt: str | None) -> None:
    """agent=wam: the checkpoint declares the protocol's model-side input convention (``inputs.name`` in its
    wam_config.json). A missing or unreadable file is left to the checkpoint's own checks."""
    if protocol is None or protocol.model_inputs is None or ckpt is None:
        return
    path = Path(ckpt).expanduser() / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    inputs = data.get("inputs") if isinstance(data, dict) else None
    found = inputs.get("name") if isinstance(inputs, dict) else None
    if found != protocol.model_inputs:
        raise ValueError(f"EVALUATION.protocol={protocol.name} feeds the model by the input convention "
                         f"{protocol.model_inputs!r}, and ckpt={ckpt} declares {'none' if found is None else repr(found)} "
                         f"(inputs.name in its {CONFIG_FILE}): evaluate a checkpoint made with that convention "
                         "(a converted FastWAM LIBERO release), or drop EVALUATION.protocol")


def record(protocol: EvalProtocol | None) -> dict[str, Any]:
    """protocol.json's entries for the protocol: its name and every setting it fixes ({} for null, so runs
    without one keep the record, and the hash, they had before protocols existed)."""
    if protocol is None:
        return {}
    return {"EVALUATION.protocol": protocol.name, "protocol_settings": protocol.fixed()}
