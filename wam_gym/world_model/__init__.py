"""The world model as a benchmark: a WAM's imagination as an env, and policies ranked inside it.

- ``env``: :class:`WorldModelEnv` (``wam_gym/WorldModel-v0``), dynamics from a checkpoint's imagination;
- ``success_detector``: the small classifier that judges imagined frames solved or not;
- ``evaluate``: ``python -m wam_gym.world_model``, the same policies in the simulator and in the world
  model, and how well the two rankings agree.
"""
