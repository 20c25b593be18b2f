"""A WAM as the simulator: imagined rollouts from a real episode's first frame.

Id: ``wam_gym/WorldModel-v0``. ``gymnasium.make("wam_gym/WorldModel-v0", checkpoint=CKPT,
dataset=ROOT)``: the dynamics are the checkpoint's action-conditioned video prediction
(:class:`agents.wam.mot.world_model.WorldModel`); ``reset`` starts from an episode of the LeRobot
dataset at ``ROOT`` (its first frame, state and instruction). Observations follow the wam_gym
contract with the checkpoint's cameras and image size; actions are the dataset's.
Cameras: the checkpoint's, at its image size.
State: the dataset's state, of the checkpoint's ``state_dim``.
Action: Box of the checkpoint's ``action_dim``, in the dataset's units.
"""

from envs.suite import Suite, env_id

ENV_ID = env_id("WorldModel", 0)
MAX_EPISODE_STEPS = 400

SUITE = Suite(
    name="world_model",
    title="WAM world model (imagination)",
    entry_point="wam_gym.world_model.env:WorldModelEnv",
    simulator_module="diffusers",  # no simulator: the model is the dynamics
    max_episode_steps=MAX_EPISODE_STEPS,
    env_kwargs={ENV_ID: {}},
    assets="a WAM checkpoint (python -m training) and a LeRobot dataset (python -m training.collect)",
    lazy_pixels=False,  # its frames are the model's state: every step predicts them
)
