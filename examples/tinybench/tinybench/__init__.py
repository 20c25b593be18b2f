"""TinyBench: move a blue dot onto a red target, seen from above.

Ids: ``tinybench/Reach-v0`` (the target anywhere) and ``tinybench/ReachCenter-v0`` (the target in the middle).
Cameras: ``top``, the whole arena from above.
State (2,): the dot's x and y, each in [-1, 1].
Action: Box(-1, 1, (2,)), the dot's velocity (at 1, a tenth of the arena's half-width per step).
Each ``reset(seed=s)`` draws the dot's start (and the Reach target) from ``s``; reaching the target ends the episode.
"""

from envs import Suite, env_id

INSTRUCTIONS = {
    "Reach": "move the blue dot onto the red target",
    "ReachCenter": "move the blue dot to the middle",
}
CAMERAS = ("top",)

SUITE = Suite(
    name="tinybench",
    title="TinyBench",
    entry_point="tinybench.env:TinyBenchEnv",  # imported only when an env is made
    simulator_module="tinybench",  # importable means installed: it needs no simulator of its own
    max_episode_steps=50,
    env_kwargs={env_id(task, 0, namespace="tinybench"): {"task": task} for task in INSTRUCTIONS},
    install_command="pip install examples/tinybench (in a wam_gym checkout)",
)
