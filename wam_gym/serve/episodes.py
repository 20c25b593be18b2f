"""Serving a model that remembers each episode (LingBot-VA): where a client's episodes start.

Such a model keeps each episode's state on its model worker between calls (a KV cache; agents/episode_memory.py),
so it must see every frame the robot sees, in order, and know where each episode starts. A session of the server
therefore runs what an evaluation runs, :class:`~agents.episode_memory.MemoryChunkAgent` on the session's broker
client, steps it with every observation, and answers one action per observation (wam_gym/serve/server.py). The
agent sends the model its key frames and its chunks whole, exactly as in an evaluation.

- vla-eval's runner sends every step's observation and says where each episode starts (``episode_start``).
- openpi's clients say neither. Its LIBERO example (``examples/libero/main.py``) sends an observation whenever its
  action plan is empty, executes ``chunk[:replan_steps]`` and asserts ``len(chunk) >= replan_steps``; one
  connection carries all its episodes, and openpi-client's ``reset()`` sends nothing. So the server answers openpi
  with one action, run with ``--args.replan-steps 1`` (a larger value fails the example's own assert: nothing is
  mis-stepped in silence), and each observation names its episode under :data:`EPISODE_KEY`, any str or int: a
  value other than the connection's last starts a new episode. A new connection starts a new one too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EPISODE_KEY = "episode_id"  # the openpi observation's key naming its episode
# The one-line change to openpi's LIBERO example (examples/libero/main.py), whose loop variables name each episode
OPENPI_LIBERO_CHANGE = (f'add "{EPISODE_KEY}": f"{{task_id}}-{{episode_idx}}" to the element dict that '
                        "examples/libero/main.py sends, and run it with --args.replan-steps 1")


class EpisodeMarkers:
    """The episodes of one openpi connection, told apart by each observation's :data:`EPISODE_KEY`."""

    def __init__(self) -> None:
        self.current: str | int | None = None  # the marker of the episode running now (None: none yet)

    def starts(self, obs: Mapping[str, Any]) -> bool:
        """Whether ``obs`` starts a new episode (its marker differs from the last one); ValueError without one."""
        marker = obs.get(EPISODE_KEY)
        if marker is None:
            raise ValueError(f"this model remembers each episode (its state stays on the server between calls), so "
                             f"every observation must name its episode: send '{EPISODE_KEY}' (any str or int, new "
                             f"for each episode); for openpi's LIBERO example, {OPENPI_LIBERO_CHANGE}")
        if isinstance(marker, bool) or not isinstance(marker, (str, int)):
            raise ValueError(f"{EPISODE_KEY}={marker!r} must be a str or an int naming the episode (a new value starts "
                             "a new one)")
        new, self.current = marker != self.current, marker
        return new


def greeting(remembers: bool, chunk: int | None) -> dict[str, Any]:
    """The greeting's ``episodes`` entry: whether the model remembers episodes (as its model workers declare it,
    agents.policy.EpisodicPolicy), and then the chunk it runs whole and what a client sends."""
    if not remembers:
        return {"remembered": False}
    return {"remembered": True, "model_chunk": chunk,
            "answers": "one action per observation (action_horizon 1): execute it, then send the next observation",
            "openpi": f"name the episode under '{EPISODE_KEY}' in every observation (a new value starts a new one)",
            "vla_eval": "episode_start starts a new one"}
