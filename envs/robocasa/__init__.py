"""RoboCasa (v0.2) atomic kitchen tasks: the PandaOmron mobile manipulator on robosuite.

Ids: ``wam_gym/RoboCasa-<Task>-v0`` (e.g. ``wam_gym/RoboCasa-PnPCounterToCab-v0``).
Action: RoboCasa's default composite controller for PandaOmron in its own units, Box from
``env.action_spec`` (12,): arm OSC pose delta (6), gripper (1), base motion (3), torso (1),
base mode (1).
State: end effector pose relative to the base (xyz + quaternion), gripper qpos, base pose
(xyz + quaternion): (16,) for PandaOmron.
Instruction: ``env.get_ep_meta()["lang"]``, which RoboCasa writes per episode (the object and
fixture differ per episode), so it is refreshed on every reset.
``reset(seed=s)`` reseeds RoboCasa's generator (kitchen layout, style, objects) from ``s``.
max_episode_steps: RoboCasa's own evaluation horizons (robocasa/utils/dataset_registry.py).

RoboCasa is not on PyPI and its kitchen assets (~5 GB) download from an external host, so both
are a manual step: see :data:`INSTALL_STEPS`.
"""

from __future__ import annotations

from envs.suite import Suite, env_id

# RoboCasa's atomic tasks (robocasa/environments/kitchen/single_stage) and their eval horizons
HORIZONS: dict[str, int] = {
    "PnPCounterToCab": 500,
    "PnPCabToCounter": 500,
    "PnPCounterToSink": 700,
    "PnPSinkToCounter": 500,
    "PnPCounterToMicrowave": 600,
    "PnPMicrowaveToCounter": 500,
    "PnPCounterToStove": 500,
    "PnPStoveToCounter": 500,
    "OpenSingleDoor": 500,
    "CloseSingleDoor": 500,
    "OpenDoubleDoor": 1000,
    "CloseDoubleDoor": 700,
    "OpenDrawer": 500,
    "CloseDrawer": 500,
    "TurnOnSinkFaucet": 500,
    "TurnOffSinkFaucet": 500,
    "TurnSinkSpout": 500,
    "TurnOnStove": 500,
    "TurnOffStove": 500,
    "CoffeeSetupMug": 600,
    "CoffeeServeMug": 600,
    "CoffeePressButton": 300,
    "TurnOnMicrowave": 500,
    "TurnOffMicrowave": 500,
}
TASKS = tuple(HORIZONS)
CAMERAS = ("robot0_agentview_left", "robot0_agentview_right", "robot0_eye_in_hand")
ROBOT = "PandaOmron"
# proprio keys of robosuite's observation, in the order they form `state`
STATE_KEYS = (
    "robot0_base_to_eef_pos",
    "robot0_base_to_eef_quat",
    "robot0_gripper_qpos",
    "robot0_base_pos",
    "robot0_base_quat",
)
INSTALL_STEPS = (
    "pip install 'wam_gym[robocasa]' (robosuite + MuJoCo), then "
    "git clone https://github.com/robocasa/robocasa && cd robocasa && pip install -e . && "
    "python robocasa/scripts/download_kitchen_assets.py (~5 GB) && python robocasa/scripts/setup_macros.py"
)
# folders download_kitchen_assets.py fills (relative to the robocasa package)
ASSET_DIRS = ("models/assets/textures", "models/assets/fixtures", "models/assets/objects/objaverse")

SUITE = Suite(
    name="robocasa",
    title="RoboCasa",
    entry_point="envs.robocasa.env:RoboCasaEnv",
    simulator_module="robocasa",
    max_episode_steps=500,
    env_kwargs={env_id(f"RoboCasa-{t}", 0): {"task": t} for t in TASKS},
    assets="kitchen assets: python robocasa/robocasa/scripts/download_kitchen_assets.py",
    max_steps_by_id={env_id(f"RoboCasa-{t}", 0): h for t, h in HORIZONS.items()},
)
