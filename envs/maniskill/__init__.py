"""ManiSkill3 table-top tasks whose assets ship with ``mani-skill`` (no download), on its CPU sim.

Ids: ``wam_gym/ManiSkill-<Task>-v1`` (e.g. ``wam_gym/ManiSkill-PickCube-v1``).
Action: ManiSkill's ``pd_ee_delta_pose`` controller in its own units, Box(-1, 1): end-effector
xyz delta and axis-angle rotation delta (normalized; the controller scales them to 0.1 m and
0.1 rad per step) then, for gripper robots, the gripper target (-1 closed, 1 open): (7,).
PushT's panda_stick has no gripper: (6,).
State: the robot's qpos, qvel and TCP pose (xyz + wxyz quaternion): (25,) for the Panda.
``privileged_state`` is ManiSkill's full sim state (``env.get_state()``: every actor's pose and
velocity, every articulation's qpos/qvel), which scripted experts read.
Cameras: the task's sensor cameras, ``base_camera`` and, for ``panda_wristcam`` tasks,
``hand_camera``. Reward is ManiSkill's ``normalized_dense``; ``terminated`` is ManiSkill's
(success, or failure where a task defines one). ``reset(seed=s)`` fixes the episode exactly.

Rendering needs Vulkan. On CPU that is Mesa's lavapipe, and Debian 12's (22.3) is too old for
SAPIEN 3; see :data:`VULKAN_FIX`.
"""

from __future__ import annotations

from envs.suite import Suite, env_id

# instruction, max_episode_steps (ManiSkill's registered TimeLimit)
TASKS: dict[str, tuple[str, int]] = {
    "PickCube": ("pick up the red cube and move it to the green goal position", 50),
    "StackCube": ("pick up the red cube and stack it on top of the green cube", 50),
    "PushCube": ("push the cube to the red and white target on the table", 50),
    "PullCube": ("pull the cube back to the red and white target on the table", 50),
    "PokeCube": ("grasp the peg and use it to push the cube to the goal", 50),
    "PlaceSphere": ("pick up the blue ball and place it in the bin", 50),
    "LiftPegUpright": ("lift the peg lying on the table and stand it upright", 50),
    "RollBall": ("push the ball so that it rolls to the goal region", 80),
    "PullCubeTool": ("grasp the L-shaped tool and use it to pull the cube towards the robot", 100),
    "PegInsertionSide": ("pick up the peg and insert it sideways into the hole in the box", 100),
    "PlugCharger": ("pick up the charger and plug it into the receptacle", 200),
    "StackPyramid": ("stack the three cubes into a pyramid", 250),
    "PushT": ("push the T-shaped block to match the T-shaped goal on the table", 100),
}
CONTROL_MODE = "pd_ee_delta_pose"
VULKAN_FIX = (
    "echo 'deb http://deb.debian.org/debian bookworm-backports main' > /etc/apt/sources.list.d/bookworm-backports.list"
    " && apt-get update && apt-get install -y -t bookworm-backports mesa-vulkan-drivers libvulkan1"
)

SUITE = Suite(
    name="maniskill",
    title="ManiSkill3",
    entry_point="envs.maniskill.env:ManiSkillEnv",
    simulator_module="mani_skill",
    max_episode_steps=50,
    env_kwargs={env_id(f"ManiSkill-{t}", 1): {"task": t} for t in TASKS},
    assets=f"none for these tasks (they ship with mani-skill); rendering needs Vulkan (lavapipe on CPU): {VULKAN_FIX}",
    max_steps_by_id={env_id(f"ManiSkill-{t}", 1): steps for t, (_, steps) in TASKS.items()},
)
