"""RoboTwin 2.0: 50 dual-arm (aloha-agilex) table-top tasks on SAPIEN.

Ids: ``wam_gym/RoboTwin-<task>-v0`` (e.g. ``wam_gym/RoboTwin-beat_block_hammer-v0``).
Action: RoboTwin's ``qpos`` action in its own units: absolute joint targets (rad) of the left
arm, left gripper opening (0 closed, 1 open), right arm, right gripper: (14,) for aloha-agilex.
State: the same joint vector as measured (``get_obs()["joint_action"]["vector"]``).
Cameras: ``head_camera``, ``left_camera``, ``right_camera`` (``front_camera`` also exists),
resized to ``image_size`` from the camera type's native resolution (D435: 320x240).
Resets follow RoboTwin's evaluation protocol (script/eval_policy.py): a seed is kept only if the
scene is stable and the scripted expert solves it; the instruction is then drawn from that
episode's generated descriptions (``instruction_type``: "seen" or "unseen").
``info["is_success"]`` is RoboTwin's ``eval_success``; RoboTwin stops an episode at its
per-task step limit, which ends ours too (``terminated``).

RoboTwin is not on PyPI, its code is a repository checkout (its top-level package is also named
``envs``, so it is loaded here as ``robotwin_envs``) and its assets come from Hugging Face:
see :data:`INSTALL_STEPS`. Point ``ROBOTWIN_ROOT`` at the checkout. It is built for a GPU
(ray-traced cameras, CuRobo planning).
"""

from __future__ import annotations

from envs.suite import Suite, env_id

TASKS = (
    "adjust_bottle", "beat_block_hammer", "blocks_ranking_rgb", "blocks_ranking_size", "click_alarmclock",
    "click_bell", "dump_bin_bigbin", "grab_roller", "handover_block", "handover_mic", "hanging_mug",
    "lift_pot", "move_can_pot", "move_pillbottle_pad", "move_playingcard_away", "move_stapler_pad",
    "open_laptop", "open_microwave", "pick_diverse_bottles", "pick_dual_bottles", "place_a2b_left",
    "place_a2b_right", "place_bread_basket", "place_bread_skillet", "place_burger_fries", "place_can_basket",
    "place_cans_plasticbox", "place_container_plate", "place_dual_shoes", "place_empty_cup", "place_fan",
    "place_mouse_pad", "place_object_basket", "place_object_scale", "place_object_stand", "place_phone_stand",
    "place_shoe", "press_stapler", "put_bottles_dustbin", "put_object_cabinet", "rotate_qrcode",
    "scan_object", "shake_bottle", "shake_bottle_horizontally", "stack_blocks_three", "stack_blocks_two",
    "stack_bowls_three", "stack_bowls_two", "stamp_seal", "turn_switch",
)  # fmt: skip
CAMERAS = ("head_camera", "left_camera", "right_camera", "front_camera")
ROOT_ENV = "ROBOTWIN_ROOT"
INSTALL_STEPS = (
    "git clone https://github.com/RoboTwin-Platform/RoboTwin.git && cd RoboTwin && bash script/_install.sh "
    "(in a Python 3.10 virtual environment with an NVIDIA GPU); then download the assets with "
    "bash script/_download_assets.sh (from Hugging Face; it also writes the embodiment paths); "
    f"then export {ROOT_ENV}=/path/to/RoboTwin"
)
ASSET_DIRS = ("assets/embodiments", "assets/objects")
MAX_EPISODE_STEPS = 1000  # RoboTwin's step limit for a task its _eval_step_limit.yml does not list
EXPERT_SEED_TRIES = 20

SUITE = Suite(
    name="robotwin",
    title="RoboTwin 2.0",
    entry_point="envs.robotwin.env:RoboTwinEnv",
    simulator_module="toppra",  # a RoboTwin-only dependency; the code itself is the checkout at $ROBOTWIN_ROOT
    max_episode_steps=MAX_EPISODE_STEPS,
    env_kwargs={env_id(f"RoboTwin-{t}", 0): {"task": t} for t in TASKS},
    assets=f"RoboTwin checkout and assets at ${ROOT_ENV}: {INSTALL_STEPS}",
)
