"""The agent of a model that remembers the episode: an autoregressive WAM (LingBot-VA) keeps the episode's past
in a state of its own (a KV cache, a streaming encoder) on the model's side, and every call continues it with
what the cameras saw while the last chunk ran.

So each of its model calls carries, beside the env contract's keys:

- ``EPISODE`` (``"episode"``): an int64 id, new at every reset of the env: the model continues that episode's
  state, or starts one for an id it has not seen; at the reset the agent tells its predictor the old id is
  over (``Predictor.release_episode``), so the model lets its state go;
- ``SEEN`` (``"seen"``): camera -> (T, H, W, 3) uint8, the frame after each action executed since the
  episode's last call, oldest first (T = 0 at its first call). The current observation is the last of them.

The model predicts each chunk from the frames of the chunk before, so a chunk runs whole: :class:`MemoryChunkAgent`
replans only when its queue is dry, and reads every frame (``reads_pixels`` is always true). Numpy only: the
model answers through a predictor (the inference broker, a policy server, or a policy in this process).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from agents.chunk_queue import ChunkQueueAgent
from agents.predictor import Predictor
from envs.protocol import PIXELS, batch_size, stack_rows, take_row

EPISODE = "episode"
SEEN = "seen"


class MemoryChunkAgent(ChunkQueueAgent):
    """A :class:`~agents.chunk_queue.ChunkQueueAgent` whose calls carry each env's episode id and the frames it
    saw since its last call (see the module docstring)."""

    def __init__(self, predictor: Predictor, action_space: spaces.Box | None = None,
                 replan_steps: int | None = None):
        whole = predictor.action_horizon
        if replan_steps is not None and (whole is None or replan_steps < whole):
            raise ValueError(f"replan_steps={replan_steps}: a model that remembers the episode runs each chunk whole "
                             f"({whole} actions; its next call continues from the frames of this one); drop "
                             "EVALUATION.replan_steps")
        super().__init__(predictor, action_space=action_space)
        self._episodes: dict[int, int] = {}  # env -> its episode's id
        self._seen: dict[int, list[dict[str, np.ndarray]]] = {}  # env -> the frames after each action since its last call
        self._ids = np.random.default_rng()

    def reset(self, env_ids: list[int] | None = None) -> None:
        super().reset(env_ids)
        for i in list(self._episodes) if env_ids is None else env_ids:
            episode = self._episodes.pop(i, None)
            self._seen.pop(i, None)
            if episode is not None:  # said now, so the model frees its state (a KV cache) before the next call
                self.predictor.release_episode(episode)

    def reads_pixels(self, env_index: int = 0) -> bool:
        return True  # every frame goes back to the model with the next call

    def replan(self, obs: Mapping[str, Any]) -> None:
        raise ValueError("a model that remembers the episode cannot drop a chunk half run (its state holds it): "
                         "reset the env instead")

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        n = batch_size(obs)
        rows = [obs] if n is None else [take_row(obs, i) for i in range(n)]
        for env_id, row in enumerate(rows):
            if env_id in self._episodes:  # its episode has called: this frame follows an action of its chunk
                self._seen[env_id].append(row[PIXELS])
        dry = [i for i in range(len(rows)) if not self._queues.get(i)]
        for group in _same_history(dry, self._seen):  # rows stack only if they saw as many frames
            self._call([rows[i] for i in group], group)
        actions = [self._queues[i].popleft() for i in range(len(rows))]
        return actions[0] if n is None else np.stack(actions)

    def _call(self, rows: list[dict[str, Any]], env_ids: list[int]) -> None:
        for env_id in env_ids:
            self._episodes.setdefault(env_id, int(self._ids.integers(2**62)))
        requests = [{**row, EPISODE: np.int64(self._episodes[i]), SEEN: _frames(self._seen.get(i, []), row[PIXELS])}
                    for row, i in zip(rows, env_ids)]
        for env_id in env_ids:
            self._seen[env_id] = []
        if len(requests) == 1:
            self._plan_one(requests[0], env_ids[0])
        else:
            self._plan(stack_rows(requests), env_ids)

    def _plan_one(self, obs: Mapping[str, Any], env_id: int = 0) -> None:
        prediction = self.predictor.predict_row(obs)
        self.num_model_calls += 1
        self._check_chunk(prediction.actions.shape)
        self._queue(env_id, prediction)


def _frames(seen: list[Mapping[str, np.ndarray]], like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """camera -> (T, H, W, 3): the frames ``seen`` stacked in time (T = 0: none yet)."""
    return {camera: np.stack([frame[camera] for frame in seen]) if seen else np.zeros((0, *np.shape(image)), np.uint8)
            for camera, image in like.items()}


def _same_history(env_ids: list[int], seen: Mapping[int, list]) -> list[list[int]]:
    """``env_ids`` grouped by how many frames each saw since its last call, in order."""
    groups: dict[int, list[int]] = {}
    for env_id in env_ids:
        groups.setdefault(len(seen.get(env_id, [])), []).append(env_id)
    return list(groups.values())

