"""SleepBench: the stand-in simulator of the cluster tests and bench (tests/test_cluster.py, bench/cluster.py).

Ids: ``sleepbench/Dot-v0``: move a dot to the middle of the arena.
Cameras: ``top``, the arena from above.
State (2,): the dot's x and y, each in [-1, 1].
Action: Box(-1, 1, (2,)), the dot's velocity (at 1, a tenth of the arena's half-width per step).
Each step sleeps ``step_ms`` (default 20): a simulator's time on a core of its own, using no CPU here, so a 2-core
host can stand in for many nodes' simulators. ``reset(seed=s)`` draws the dot's start from ``s``.
"""

from envs import Suite, env_id

CAMERAS = ("top",)

SUITE = Suite(
    name="sleepbench",
    title="SleepBench",
    entry_point="sleepbench.env:SleepBenchEnv",
    simulator_module="sleepbench",
    max_episode_steps=40,
    env_kwargs={env_id("Dot", 0, namespace="sleepbench"): {}},
    install_command="put bench/ on PYTHONPATH with its entry point (bench/cluster.py install_standin)",
)
