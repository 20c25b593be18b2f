"""The broker's end of each actor's link: its request pipe (read here), its reply pipe (written here, never
blocking: wam_gym/broker/outbox.py) and the name of its shared-memory slot (unlinked if the actor dies).

Actors come and go from the caller's thread (``InferenceBroker.client``) while the dispatcher's thread reads and
answers them: the tables are guarded by one lock.
"""

from __future__ import annotations

import threading
from typing import Any

from wam_gym.broker.model_worker import encode
from wam_gym.broker.outbox import Outbox
from wam_gym.broker.shared_obs import unlink


class ActorLinks:
    def __init__(self, ctx):
        self.ctx = ctx
        self.requests: dict[int, Any] = {}  # actor -> our reading end of its request pipe
        self.replies: dict[int, Outbox] = {}  # actor -> the write end of its reply pipe
        self._slots: dict[int, str] = {}  # actor -> its shared-memory slot (dispatcher's thread only)
        self._lock = threading.Lock()

    def add(self, actor_id: int) -> tuple[Any, Any]:
        """Pipes for a new actor: (the write end of its requests, the read end of its replies), the ends it keeps."""
        requests, request_writer = self.ctx.Pipe(duplex=False)
        reply_reader, replies = self.ctx.Pipe(duplex=False)
        with self._lock:
            self.requests[actor_id], self.replies[actor_id] = requests, Outbox(replies)
        return request_writer, reply_reader

    def readers(self) -> dict[Any, int]:
        """request pipe -> its actor."""
        with self._lock:
            return {connection: actor for actor, connection in self.requests.items()}

    def unsent(self) -> list[Outbox]:
        """The reply pipes holding part of a reply the pipe had no room for yet."""
        with self._lock:
            return [replies for replies in self.replies.values() if replies.waiting]

    def reply(self, actor_id: int, message) -> None:
        """``message`` to ``actor_id``, unless it is gone (an answer into the void)."""
        with self._lock:
            replies = self.replies.get(actor_id)
        if replies is not None:
            replies.put(encode(message))

    def note_slot(self, actor_id: int, segment: str) -> None:
        self._slots[actor_id] = segment

    def drop_requests(self, actor_id: int) -> None:
        """Close the actor's request pipe (its writer died: EOF)."""
        with self._lock:
            connection = self.requests.pop(actor_id, None)
        if connection is not None:
            connection.close()

    def remove(self, actor_id: int) -> None:
        """The actor is gone: its pipes closed, its slot unlinked."""
        if actor_id in self._slots:
            unlink(self._slots.pop(actor_id))
        self.drop_requests(actor_id)
        with self._lock:
            replies = self.replies.pop(actor_id, None)
        if replies is not None:
            replies.close()

    def close(self) -> None:
        with self._lock:
            for connection in self.requests.values():
                connection.close()
            for replies in self.replies.values():
                replies.close()
            self.requests.clear()
            self.replies.clear()
