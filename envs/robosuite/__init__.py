"""robosuite 1.5: the single-arm Panda manipulation tasks, with language and pixels.

Ids: ``wam_gym/Robosuite-<Task>-v0`` (e.g. ``wam_gym/Robosuite-Lift-v0``).
Action: Box(-1, 1, (7,)), robosuite's own OSC_POSE units: end-effector position and
axis-angle deltas (scaled by the controller to 5 cm / 0.5 rad at +-1) and gripper (-1 open, +1 close).
State (9,): end-effector position (3), quaternion (4, xyzw as robosuite reports it), gripper qpos (2).
Pixels come from MuJoCo's renderer on robosuite's own model (robosuite's renderer is off, so
its vertically flipped images never appear); every camera is upright.
``reset(seed=s)`` reseeds robosuite's generator in place, so a seed fixes the object
placement and the arm's initial noise exactly.

Not registered: PickPlaceSingle / NutAssemblySingle (the object, and so the instruction,
changes each reset), Wipe (its wiping gripper has no gripper action) and the two-arm tasks.
"""

from __future__ import annotations

from envs.suite import Suite, env_id

INSTRUCTIONS = {
    "Lift": "lift the red cube",
    "Stack": "stack the red cube on top of the green cube",
    "Door": "open the door",
    "NutAssembly": "put the square nut on the square peg and the round nut on the round peg",
    "NutAssemblySquare": "put the square nut on the square peg",
    "NutAssemblyRound": "put the round nut on the round peg",
    "PickPlace": "put each object into its matching bin",
    "PickPlaceMilk": "pick up the milk carton and place it into its bin",
    "PickPlaceBread": "pick up the bread and place it into its bin",
    "PickPlaceCereal": "pick up the cereal box and place it into its bin",
    "PickPlaceCan": "pick up the can and place it into its bin",
    "ToolHang": "insert the hook into the stand and hang the tool on the hook",
}
TASKS = tuple(INSTRUCTIONS)
# robomimic's rollout horizons where it has one (Lift, Can, Square, ToolHang), else room to finish
MAX_EPISODE_STEPS = 500
_STEPS = {"Lift": 400, "PickPlaceCan": 400, "NutAssemblySquare": 400, "ToolHang": 700, "PickPlace": 1000, "NutAssembly": 800}
DEFAULT_CAMERAS = ("agentview", "robot0_eye_in_hand")
STATE_DIM = 9
ACTION_DIM = 7


def _id(task: str) -> str:
    return env_id(f"Robosuite-{task}", 0)


SUITE = Suite(
    name="robosuite",
    title="robosuite",
    entry_point="envs.robosuite.env:RobosuiteEnv",
    simulator_module="robosuite",
    max_episode_steps=MAX_EPISODE_STEPS,
    env_kwargs={_id(t): {"task": t} for t in TASKS},
    max_steps_by_id={_id(t): n for t, n in _STEPS.items()},
)
