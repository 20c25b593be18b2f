"""Meta-World (MT50): all 50 Sawyer tasks, with language instructions and pixels.

Ids: ``wam_gym/MetaWorld-<task>-v3`` (e.g. ``wam_gym/MetaWorld-pick-place-v3``).
Action: Box(-1, 1, (4,)) = end-effector xyz delta and gripper effort (Meta-World's own units).
State: end-effector xyz and gripper opening (4,). ``privileged_state`` is Meta-World's full
39-d observation (objects and goal), which the scripted experts read.
Each ``reset(seed=s)`` draws the object and goal positions from ``s``, so a seed fixes an
episode exactly; there are no init states, and LIBERO's ``options={"init_state_id": k}`` is refused.
"""

from envs.suite import Suite, env_id

INSTRUCTIONS = {
    "assembly": "pick up the nut and place it onto the peg",
    "basketball": "dunk the basketball into the basket",
    "bin-picking": "grasp the puck in one bin and place it into the other bin",
    "box-close": "grasp the lid and close the box with it",
    "button-press-topdown": "press the button from the top",
    "button-press-topdown-wall": "bypass the wall and press the button from the top",
    "button-press": "press the button",
    "button-press-wall": "bypass the wall and press the button",
    "coffee-button": "push the button on the coffee machine",
    "coffee-pull": "pull the mug out from under the coffee machine",
    "coffee-push": "push the mug under the coffee machine",
    "dial-turn": "rotate the dial 180 degrees",
    "disassemble": "pick the nut off the peg",
    "door-close": "close the door with its revolving joint",
    "door-lock": "lock the door by rotating the lock clockwise",
    "door-open": "open the door with its revolving joint",
    "door-unlock": "unlock the door by rotating the lock counter-clockwise",
    "hand-insert": "insert the gripper into the hole",
    "drawer-close": "push the drawer closed",
    "drawer-open": "pull the drawer open",
    "faucet-open": "rotate the faucet counter-clockwise",
    "faucet-close": "rotate the faucet clockwise",
    "hammer": "hammer the screw into the wall",
    "handle-press-side": "press the handle down sideways",
    "handle-press": "press the handle down",
    "handle-pull-side": "pull the handle up sideways",
    "handle-pull": "pull the handle up",
    "lever-pull": "pull the lever up",
    "pick-place-wall": "pick up the puck, bypass the wall and place it at the goal",
    "pick-out-of-hole": "pick the peg out of the hole",
    "pick-place": "pick up the puck and place it at the goal",
    "plate-slide": "slide the plate into the cabinet",
    "plate-slide-side": "slide the plate into the cabinet sideways",
    "plate-slide-back": "slide the plate out of the cabinet",
    "plate-slide-back-side": "slide the plate out of the cabinet sideways",
    "peg-insert-side": "insert the peg sideways into the hole",
    "peg-unplug-side": "unplug the peg sideways",
    "soccer": "kick the soccer ball into the goal",
    "stick-push": "grasp the stick and push the box with it",
    "stick-pull": "grasp the stick and pull the box with it",
    "push": "push the puck to the goal",
    "push-wall": "bypass the wall and push the puck to the goal",
    "push-back": "pull the puck back to the goal",
    "reach": "reach the goal position",
    "reach-wall": "bypass the wall and reach the goal position",
    "shelf-place": "pick up the puck and place it onto the shelf",
    "sweep-into": "sweep the puck into the hole",
    "sweep": "sweep the puck off the table",
    "window-open": "push the window open",
    "window-close": "push the window closed",
}
TASKS = tuple(INSTRUCTIONS)
CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
# Meta-World's corner cameras come out upside down from MuJoCo's renderer (tests/test_metaworld.py checks pixels)
_FLIPPED_CAMERAS = ("corner", "corner2", "corner3", "corner4")
MAX_EPISODE_STEPS = 500  # Meta-World's max_path_length

SUITE = Suite(
    name="metaworld",
    title="Meta-World",
    entry_point="envs.metaworld.env:MetaWorldEnv",
    simulator_module="metaworld",
    max_episode_steps=MAX_EPISODE_STEPS,
    env_kwargs={env_id(f"MetaWorld-{t}", 3): {"task": t} for t in TASKS},
)
