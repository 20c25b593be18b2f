"""Named evaluation protocols (the config group ``protocol``): another project's benchmark side, as plain data.

wam_gym's own defaults follow openpi (``protocol=none``). A named protocol fixes what an episode is
under another project's evaluation, so that a score can be set beside theirs:

- the env side: the env kwargs of every task (cameras, image size, settle steps), the policy steps an
  episode may take per suite, the init-state rule, the suite it is defined for (tasks of another are refused);
- the agent side that decides which actions run: actions executed per predicted chunk (``replan_steps``),
  the chunk's length (``action_horizon``), denoising steps per call and the noise seed;
- for ``EVALUATION.agent=wam``, the name of the model-side input convention (image orientation, crop,
  camera layout, prompt, gripper post-processing) a checkpoint must declare as ``inputs.name`` in its
  ``wam_config.json``. For agent=remote or python the env side applies and the model side is the caller's.

How it meets the user's knobs: each protocol is an option of the Hydra config group ``protocol``
(:func:`register_group`), which sets its knobs and env kwargs before the command line's overrides are
applied; :func:`check` then refuses any that an override moved away from the protocol's value, naming
both. So a knob typed on the command line is always the user's, whatever its value: an explicitly typed
wam_gym default (``EVALUATION.seed=0``) is refused under a protocol that fixes another, never taken for
"unset". protocol.json records the protocol's name and every setting it fixes, so
``python -m wam_gym.compare`` refuses to pair a run under another protocol, and a resume under another
protocol is refused.

Read a protocol from other code as ``PROTOCOLS["fastwam_libero"]`` (an :class:`EvalProtocol`), or
:func:`named` for the ``protocol`` key's value (None for null).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from envs.contract import parse_image_size
from envs.registry import suite_of

CONFIG_FILE = "wam_config.json"  # agents.wam.checkpoint.CONFIG_FILE (importing that module costs seconds)
# EVALUATION knobs a protocol fixes, besides max_episode_steps (fixed per suite) and the env kwargs
FIXED_KNOBS = ("replan_steps", "action_horizon", "num_inference_steps", "seed")
SERVED_KNOBS = FIXED_KNOBS[:3]  # what the policy server serves by (each call's noise is the client's episode's)
INIT_STATE_K = "init state k for trial k"  # the planner's LIBERO rule (tasks.Job.reset_options), checked per job


@dataclass(frozen=True)
class EvalProtocol:
    """What a named protocol fixes. A subclass per protocol gives every field its value, and says where
    each comes from."""

    name: str  # protocol's value
    suite: str  # the env suite (envs.suite.Suite.name) it is defined for; tasks of other suites are refused
    env_kwargs: dict[str, Any]  # constructor kwargs of every task's env
    max_steps: dict[str, int]  # policy steps an episode may take (after the settle steps), by LIBERO base benchmark
    replan_steps: int | None  # actions executed of each predicted chunk before the next model call
    action_horizon: int | None  # actions of a chunk the agent may use; null: the model's full horizon
    action_ensembling: bool  # whether overlapping chunks are averaged (wam_gym has none: protocols say false)
    num_inference_steps: int  # denoising steps per model call
    seed: int  # EVALUATION.seed: the sampling noise's, and trial k's env seed is seed + k
    init_state: str  # which init state trial k starts from
    model_inputs: str | None  # agent=wam: the input convention the checkpoint must declare (wam_config.json inputs.name)
    # why no episode can run under it yet (a setting no wam_gym env takes): None for a runnable protocol
    cannot_run: ClassVar[str | None] = None

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

    name: str = "fastwam_libero"  # protocol=fastwam_libero
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
    init_state: str = INIT_STATE_K  # eval_libero_single.py run_single_task
    model_inputs: str | None = "fastwam_libero"  # agents/wam/fastwam/inputs.py


@dataclass(frozen=True)
class LingBotVAProtocol(EvalProtocol):
    """A LingBot-VA evaluation (github.com/Robbyant/lingbot-va): the env side as fields; the model side is its
    input convention's (``model_inputs``, agents/wam/lingbot_va/inputs.py), recorded whole in protocol.json.

    Why the model side lives in the convention: their denoising steps (video and actions), guidance scales,
    flow shifts, attention window, chunk shape, action channels and quantile statistics are one config file
    with the checkpoint (``wan_va/configs/va_*_cfg.py``, read by their server), not settings of their
    benchmark client; a checkpoint converted with the convention carries them, and ``check_checkpoint_inputs``
    holds it to the name. The one knob they share with the env side, ``num_inference_steps``, is fixed to the
    action stream's steps (the chunk's actions come from it); the video stream's are the convention's."""

    def fixed(self) -> dict[str, Any]:
        from agents.wam.lingbot_va.inputs import convention, settings  # numpy only: no torch for a record

        return {**super().fixed(), "model_inputs_settings": settings(convention(self.model_inputs))}


@dataclass(frozen=True)
class LingBotVALibero(LingBotVAProtocol):
    """LingBot-VA's LIBERO evaluation, benchmark side: ``evaluation/libero/client.py`` (``run_one``,
    ``init_single_env``) and ``launch_client.sh``, against ``wan_va/wan_va_server.py`` serving
    ``wan_va/configs/va_libero_cfg.py`` (``--config-name libero``, ``launch_server.sh``).

    - cameras ``agentview`` and ``robot0_eye_in_hand`` at 128 x 128: ``run_one`` (``camera_heights`` and
      ``camera_widths``: 128) and ``_extract_obs``;
    - 5 settle steps of ``[0] * 7`` (a gripper command of 0) after the init state is set: ``init_single_env``
      (``env.step([0.] * 7)`` five times);
    - 796 policy steps in every suite: ``run_one`` loops ``while cur_env.env.timestep < 800``, robosuite's step
      count since the reset, the 5 settle steps included, checked before each chunk; chunks execute 12, then
      16 actions, so the last one starts at 5 + 780 and ends at 5 + 796 = 801;
    - 16 actions executed per chunk, the model's whole chunk, no ensembling: ``frame_chunk_size`` 4 x
      ``action_per_frame`` 4, every one executed before the next call (the first chunk's 4 of frame 0 are
      the convention's to drop: 12);
    - 50 denoising steps: ``action_num_inference_steps`` (the video stream's 20, guidance 5 / 1, shifts
      5.0 / 0.05 and window 30 are the convention's);
    - seed 0: they seed nothing (the server draws ``torch.randn`` from its process's generator, so their runs
      differ: their issue #104); 0 is wam_gym's default;
    - trial k starts from init state ``k % 50``: ``run_one`` (``init_states[episode_idx % init_states.shape[0]]``),
      init state k for the 50 trials of ``launch_client.sh --test-num 50``;
    - the prompt: the task's language (``benchmark_instance.get_task(task_idx).language``), our instruction.

    Known differences, not reproduced:

    - they build a new env for every episode and never seed it (``OffScreenRenderEnv``: the fixtures the init
      states leave out move at random); wam_gym draws that placement from the init-state id;
    - they render with robosuite's renderer; wam_gym with MuJoCo's, upright, as their client's flipped frame is;
    - their noise comes from an unseeded generator; wam_gym's from each episode's seed.
    """

    name: str = "lingbot_va_libero"  # protocol=lingbot_va_libero
    suite: str = "libero"  # their evaluation/libero
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {  # client.py run_one, init_single_env
        "cameras": ["agentview", "robot0_eye_in_hand"], "image_size": [128, 128], "settle_steps": 5,
        "settle_action": [0.0] * 7})
    max_steps: dict[str, int] = field(default_factory=lambda: {  # client.py run_one: timestep < 800, settle included
        "libero_spatial": 796, "libero_object": 796, "libero_goal": 796, "libero_10": 796, "libero_90": 796})
    replan_steps: int | None = 16  # va_libero_cfg.py frame_chunk_size 4 x action_per_frame 4, all executed
    action_horizon: int | None = None  # the model's chunk (the first one's frame 0 dropped by the convention)
    action_ensembling: bool = False  # client.py run_one executes each chunk whole
    num_inference_steps: int = 50  # va_libero_cfg.py action_num_inference_steps
    seed: int = 0  # they seed nothing; wam_gym's default
    init_state: str = INIT_STATE_K  # client.py run_one: init_states[episode_idx % 50]
    model_inputs: str | None = "lingbot_va_libero"  # agents/wam/lingbot_va/inputs.py


@dataclass(frozen=True)
class LingBotVARoboTwin(LingBotVAProtocol):
    """LingBot-VA's RoboTwin 2.0 evaluation, benchmark side: ``evaluation/robotwin/eval_polict_client_openpi.py``
    (``eval_policy``, ``format_obs``, ``add_init_pose``) run by ``launch_client.sh``, against the server on
    ``wan_va/configs/va_robotwin_cfg.py``. Recorded, not runnable: see ``cannot_run``.

    - cameras ``head_camera``, ``left_camera``, ``right_camera`` as RoboTwin renders them (``format_obs``), at
      the D435's 240 x 320 of ``demo_clean`` (the server resizes them: the convention's);
    - ``task_config`` ``demo_clean`` and ``seen`` instructions: ``launch_client.sh`` (``task_config=demo_clean``;
      their Hard figure is ``demo_randomized``) and ``main`` (``instruction_type = 'seen'``);
    - the step limit is RoboTwin's own per task (``TASK_ENV.step_lim``, set by each task's ``setup_demo``),
      which wam_gym's RoboTwinEnv ends episodes at too; the protocol fixes no other;
    - 32 actions executed per chunk: ``frame_chunk_size`` 2 x ``action_per_frame`` 16 (the first chunk's frame
      0 dropped: 16); 50 denoising steps: ``action_num_inference_steps`` (video 25, window 72: the convention's);
    - seeds: RoboTwin's from ``10000 * (1 + seed)`` upward, kept when its scripted expert solves them, 100
      episodes a task (``eval_policy``; ``--seed 0 --test_num 100``); wam_gym's RoboTwinEnv draws its seeds from
      the episode's.
    """

    cannot_run: ClassVar[str | None] = (
        "LingBot-VA's RoboTwin checkpoint sends end-effector targets (RoboTwin's take_action(action_type='ee')) "
        "and wam_gym's RoboTwinEnv steps joint targets (qpos) only")

    name: str = "lingbot_va_robotwin"  # protocol=lingbot_va_robotwin
    suite: str = "robotwin"  # envs/robotwin
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {  # eval_polict_client_openpi.py, launch_client.sh
        "cameras": ["head_camera", "left_camera", "right_camera"], "image_size": [240, 320],
        "task_config": "demo_clean", "instruction_type": "seen"})
    max_steps: dict[str, int] = field(default_factory=dict)  # RoboTwin's own per-task step_lim
    replan_steps: int | None = 32  # va_robotwin_cfg.py frame_chunk_size 2 x action_per_frame 16
    action_horizon: int | None = None  # the model's chunk
    action_ensembling: bool = False  # eval_policy executes each chunk whole
    num_inference_steps: int = 50  # va_robotwin_cfg.py action_num_inference_steps
    seed: int = 0  # launch_client.sh --seed 0
    init_state: str = "RoboTwin seeds from 10000 upward that its expert solves"  # eval_policy
    model_inputs: str | None = "lingbot_va_robotwin"  # agents/wam/lingbot_va/inputs.py


PROTOCOLS: dict[str, EvalProtocol] = {p.name: p for p in (FastWAMLibero(), LingBotVALibero(), LingBotVARoboTwin())}


def named(name: str | None) -> EvalProtocol | None:
    """``protocol``'s protocol (None for null), or an error listing the known names."""
    if name is None:
        return None
    if name not in PROTOCOLS:
        raise ValueError(f"protocol={name!r} is not a known protocol: choose one of {sorted(PROTOCOLS)}, "
                         "or none (wam_gym's defaults)")
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
    return ValueError(f"{knob}={json.dumps(value)} conflicts with protocol={protocol.name}, which fixes it "
                      f"to {json.dumps(fixed)}: drop the override, or leave the protocol out (protocol=none)")


def _same_env_kwarg(key: str, a: Any, b: Any) -> bool:
    if key == "image_size":
        try:
            return parse_image_size(a) == parse_image_size(b)
        except (TypeError, ValueError):
            return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def overlay(protocol: EvalProtocol | None, knobs: tuple[str, ...] = FIXED_KNOBS, env_side: bool = True) -> dict:
    """What selecting ``protocol`` sets in a config, from its root: the ``protocol`` key, its ``knobs`` under
    EVALUATION and, with ``env_side``, its env kwargs."""
    if protocol is None:
        return {"protocol": None}
    values: dict[str, Any] = {"protocol": protocol.name,
                              "EVALUATION": {knob: getattr(protocol, knob) for knob in knobs}}
    if env_side:
        values["env_kwargs"] = copy.deepcopy(protocol.env_kwargs)
    return values


def register_group(store, knobs: tuple[str, ...] = FIXED_KNOBS, env_side: bool = True) -> None:
    """Every protocol as an option of the config group ``protocol`` in Hydra's ``store`` (``protocol=fastwam_libero``;
    ``none``, wam_gym's defaults, is the default option). The policy server takes its chunk knobs alone."""
    store.store(group="protocol", name="none", node=overlay(None), package="_global_")
    for protocol in PROTOCOLS.values():
        store.store(group="protocol", name=protocol.name, node=overlay(protocol, knobs, env_side), package="_global_")


def check(config) -> None:
    """Every knob and env kwarg ``config.protocol`` fixes (an EvalConfig's) holds the protocol's value: one that
    departs was typed by the user, and is refused naming both."""
    protocol = named(config.protocol)
    if protocol is None:
        return
    ev = config.EVALUATION
    for knob in FIXED_KNOBS:
        if getattr(ev, knob) != getattr(protocol, knob):
            raise _refuse(protocol, f"EVALUATION.{knob}", getattr(ev, knob), getattr(protocol, knob))
    if ev.max_episode_steps is not None:
        raise _refuse(protocol, "EVALUATION.max_episode_steps", ev.max_episode_steps, protocol.max_steps)
    for key, fixed in protocol.env_kwargs.items():
        if not _same_env_kwarg(key, config.env_kwargs.get(key), fixed):
            raise _refuse(protocol, f"env_kwargs.{key}", config.env_kwargs.get(key), fixed)
    # an agreeing value in the protocol's spelling (image_size 256 -> [256, 256]): protocol.json records one form
    config.env_kwargs = {**config.env_kwargs, **copy.deepcopy(protocol.env_kwargs)}


def episode_steps(evaluation, protocol: EvalProtocol | None, env_id: str) -> int:
    """The policy steps an episode of ``env_id`` may take: EVALUATION.max_episode_steps, else the protocol's
    figure for its suite, else the suite's own limit."""
    if evaluation.max_episode_steps is not None:
        return evaluation.max_episode_steps
    steps = protocol.max_steps_for(env_id) if protocol is not None else None
    return steps if steps is not None else suite_of(env_id).episode_steps(env_id)


# ----------------------------------------------------------------- what a run evaluates
def check_plan(protocol: EvalProtocol | None, tasks, jobs) -> None:
    """The protocol can run, every task is of its suite, and trial k starts from init state k where it says so."""
    if protocol is None:
        return
    if protocol.cannot_run:
        raise ValueError(f"protocol={protocol.name} records their evaluation and runs no episode yet: "
                         f"{protocol.cannot_run}; leave the protocol out (protocol=none)")
    for task in tasks:
        suite = suite_of(task.env_id).name
        if suite != protocol.suite:
            raise ValueError(f"protocol={protocol.name} evaluates {protocol.suite} tasks, and {task.name} "
                             f"is a {suite} task: evaluate {protocol.suite} tasks (benchmark={protocol.suite}), "
                             "or leave the protocol out (protocol=none)")
    for job in jobs if protocol.init_state == INIT_STATE_K else ():  # the planner's rule, which the protocol states
        if job.reset_options != {"init_state_id": job.trial}:
            raise ValueError(f"protocol={protocol.name} starts trial k from init state k, and "
                             f"{job.task.name} trial {job.trial} would reset with {job.reset_options}: "
                             "evaluate tasks with init states, or leave the protocol out (protocol=none)")


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
        raise ValueError(f"protocol={protocol.name} feeds the model by the input convention "
                         f"{protocol.model_inputs!r}, and ckpt={ckpt} declares {'none' if found is None else repr(found)} "
                         f"(inputs.name in its {CONFIG_FILE}): evaluate a checkpoint made with that convention "
                         "(a converted FastWAM LIBERO release), or leave the protocol out (protocol=none)")


def record(protocol: EvalProtocol | None) -> dict[str, Any]:
    """protocol.json's entries for the protocol: its name and every setting it fixes ({} for null, so runs
    without one keep the record, and the hash, they had before protocols existed)."""
    if protocol is None:
        return {}
    return {"protocol": protocol.name, "protocol_settings": protocol.fixed()}
