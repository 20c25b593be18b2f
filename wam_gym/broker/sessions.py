"""The session registry: which model worker holds each episode of a model that remembers episodes.

A model that remembers (agents.policy.EpisodicPolicy: LingBot-VA's KV cache) keeps an episode's state on the
worker that served its first call, so every later call of that episode must go there. An episode is known by the
id its calls carry (``obs["episode"]``, agents/episode_memory.py) and belongs to the actor that sent its first
call. It is

- **placed** at its first call on the worker holding the fewest live episodes (the lowest-numbered of equals)
  among those with room: a worker holds at most its model's ``episode_capacity`` (as it said when it loaded);
- **waiting**, when no worker has room: its first call is held here, in arrival order, and placed (admitted) when
  an episode ends and makes room; one whose actor goes away is dropped;
- **live** from then on: each call is routed to its worker;
- **released** when its actor says so (the env was reset: ``BrokerClient.release_episode``), when its actor is
  forgotten (died, disconnected), or when the broker closes: its worker is told to let its state go;
- **lost** when its worker dies or is restarted: the state went with the process, so its next calls are answered
  with :class:`EpisodeLost` (restart the episode), never served on a fresh worker as if it continued. A lost
  episode is forgotten once its actor releases it or is forgotten.

Pure bookkeeping for the dispatcher's thread, no processes. ``live`` counts each worker's live episodes: where new
ones go, and what a worker's memory holds; ``capacity`` the most each may hold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.episode_memory import EPISODE
from wam_gym.broker.batching import Request
from wam_gym.broker.errors import EpisodeLost, RemoteInferenceError


def episode_of(obs: Mapping[str, Any]) -> int | None:
    """The episode id one request's row carries (None: none, a stateless call)."""
    value = obs.get(EPISODE)
    if value is None:
        return None
    value = np.asarray(value)
    if value.shape != () or value.dtype.kind not in "iu":
        raise RemoteInferenceError(f"obs[{EPISODE!r}] must be one integer id per row, got {value.dtype} "
                                   f"{value.shape}: send the id agents.episode_memory.MemoryChunkAgent sends")
    return int(value)


def _not_yours(episode: int) -> RemoteInferenceError:
    return RemoteInferenceError(f"episode {episode} belongs to another client of the broker: give each episode an id "
                                "of its own (agents.episode_memory.MemoryChunkAgent draws them)")


def lost_error(episode: int, worker: int, why: str) -> EpisodeLost:
    return EpisodeLost(f"episode {episode} was lost: its model worker {worker} {why}, and the episode's state (its "
                       "cache) with it; restart the episode")


@dataclass
class Session:
    episode: int
    actor: int
    worker: int
    lost: str | None = None  # why its worker lost it (it died, was restarted); None: live


class SessionRegistry:
    def __init__(self, workers: int):
        self._sessions: dict[int, Session] = {}  # episode -> its session
        self._of_actor: dict[int, set[int]] = {}  # actor -> its episodes
        self.live = [0] * workers  # worker -> live episodes it holds
        self.capacity: list[int | None] = [None] * workers  # worker -> the most it holds (None: no limit said)
        self._waiting: OrderedDict[int, Request] = OrderedDict()  # episode -> its first call, in arrival order

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def waiting(self) -> int:
        """First calls waiting for room on a worker."""
        return len(self._waiting)

    def set_capacity(self, worker: int, capacity: int | None) -> None:
        """``worker`` (re)loaded its model, which holds at most ``capacity`` episodes: call :meth:`admit` next."""
        self.capacity[worker] = capacity

    def route(self, request: Request, episode: int) -> int | None:
        """The worker that serves ``request``, a call of ``episode``: the one holding it, or, at its first call, the
        one with room holding the fewest live episodes. None: no worker has room, and the call waits here until
        :meth:`admit` places it. Raises :class:`EpisodeLost` for an episode its worker lost, and
        RemoteInferenceError for another actor's, or for a second call of an episode still waiting."""
        actor = request.actor_id
        session = self._sessions.get(episode)
        if session is None:
            return self._first_call(request, episode)
        if session.actor != actor:
            raise _not_yours(episode)
        if session.lost is not None:
            raise lost_error(episode, session.worker, session.lost)
        return session.worker

    def _first_call(self, request: Request, episode: int) -> int | None:
        waiting = self._waiting.get(episode)
        if waiting is not None:
            if waiting.actor_id != request.actor_id:
                raise _not_yours(episode)
            raise RemoteInferenceError(f"episode {episode} is still waiting for room on a model worker: its first "
                                       "call is not answered yet, send its next call after that answer")
        worker = self._room() if not self._waiting else None  # none overtakes those waiting
        if worker is None:
            self._waiting[episode] = request
            return None
        self._place(request.actor_id, episode, worker)
        return worker

    def admit(self) -> list[tuple[Request, int]]:
        """The waiting first calls that fit now, in arrival order, each placed: (the call, its worker)."""
        admitted = []
        while self._waiting and (worker := self._room()) is not None:
            episode, request = self._waiting.popitem(last=False)
            self._place(request.actor_id, episode, worker)
            admitted.append((request, worker))
        return admitted

    def _room(self) -> int | None:
        """The worker with room holding the fewest live episodes (the lowest-numbered of equals); None: all full."""
        room = [w for w, (live, most) in enumerate(zip(self.live, self.capacity)) if most is None or live < most]
        return min(room, key=self.live.__getitem__, default=None)

    def _place(self, actor: int, episode: int, worker: int) -> None:
        self._sessions[episode] = Session(episode, actor, worker)
        self._of_actor.setdefault(actor, set()).add(episode)
        self.live[worker] += 1

    def release(self, actor: int, episode: int) -> dict[int, list[int]]:
        """``actor`` is done with ``episode``: {its worker: [episode]} to let go, if it was live (nothing for an
        episode unknown, lost, or another actor's; one still waiting is dropped)."""
        if episode in self._waiting and self._waiting[episode].actor_id == actor:
            del self._waiting[episode]
        session = self._sessions.get(episode)
        if session is None or session.actor != actor:
            return {}
        worker = self._drop(session)
        return {} if worker is None else {worker: [episode]}

    def forget_actor(self, actor: int) -> dict[int, list[int]]:
        """``actor`` is gone: worker -> its live episodes there, to let go. Its first calls still waiting are dropped."""
        for episode in [e for e, r in self._waiting.items() if r.actor_id == actor]:
            del self._waiting[episode]
        ends: dict[int, list[int]] = {}
        for episode in sorted(self._of_actor.get(actor, ())):
            worker = self._drop(self._sessions[episode])
            if worker is not None:
                ends.setdefault(worker, []).append(episode)
        return ends

    def lose_worker(self, worker: int, why: str) -> list[int]:
        """``worker`` died or was restarted after ``why``: its live episodes are lost (returned)."""
        lost = sorted(s.episode for s in self._sessions.values() if s.worker == worker and s.lost is None)
        for episode in lost:
            self._sessions[episode].lost = why
        self.live[worker] = 0
        return lost

    def held(self) -> dict[int, list[int]]:
        """worker -> the live episodes it holds."""
        held: dict[int, list[int]] = {}
        for session in self._sessions.values():
            if session.lost is None:
                held.setdefault(session.worker, []).append(session.episode)
        return held

    def _drop(self, session: Session) -> int | None:
        """Forget ``session``; its worker if it was live there."""
        del self._sessions[session.episode]
        episodes = self._of_actor[session.actor]
        episodes.discard(session.episode)
        if not episodes:
            del self._of_actor[session.actor]
        if session.lost is not None:
            return None
        self.live[session.worker] -= 1
        return session.worker
