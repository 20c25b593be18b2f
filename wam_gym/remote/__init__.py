"""The remote side: wam_gym as a client of the field's policy servers, and the wire both speak.

- ``client``: :class:`RemotePolicy` (``EVALUATION.agent=remote``), a chunk-queue agent's predictor
  that asks an openpi or vla-eval server; ``link``: its one WebSocket connection (backoff, loss);
  ``config``: its knobs, the ``REMOTE`` group of ``python -m wam_gym.eval``;
- ``wire``: the two protocols' messages (msgpack, never pickle), also what ``wam_gym.serve`` answers;
- ``keymap``: the observation keys and frame orientation each protocol's clients use.
"""

from wam_gym.remote.client import RemotePolicy, RemoteSettings, served_model
from wam_gym.remote.link import PolicyServerError, PolicyServerLost

__all__ = ["PolicyServerError", "PolicyServerLost", "RemotePolicy", "RemoteSettings", "served_model"]
