"""Every pipe the broker's dispatcher reads, in one wait: the control pipe (messages from this process: stop, an
actor gone, Ray's results), the model workers' result pipes and the actors' request pipes; and the pipes it
writes that had no room for a whole message (replies, batches), until they have.

Each pipe has a single writer, so a SIGKILL can cut short only the dead process's own message and never leaves
a lock held that others need (a shared multiprocess Queue's write lock stays taken when its writer dies in
``put``). A pipe at EOF (its writer died) is let go: an actor's requests are dropped, a worker's pipe noted as
lost (``worker_lost``) for the supervisor to restart it.
"""

from __future__ import annotations

import selectors
import threading

from wam_gym.broker.actors import ActorLinks
from wam_gym.broker.model_worker import receive, send
from wam_gym.broker.outbox import Outbox


class Mailbox:
    def __init__(self, ctx, pool, actors: ActorLinks):
        self.pool, self.actors = pool, actors
        # Messages from this process (stop, actor_gone, Ray results): one pipe, writes locked.
        self._control, self._control_writer = ctx.Pipe(duplex=False)
        self._control_lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._watching: tuple[list, list] = ([], [])  # the (readers, writers) _selector watches
        self.worker_lost = False  # a worker's result pipe reached EOF since the supervisor last healed

    def post(self, message) -> None:
        """A message to the dispatcher from any thread of this process."""
        with self._control_lock:
            send(self._control_writer, message)

    def receive(self, timeout: float) -> list:
        """Every message waiting on the control pipe, the workers' and the actors' pipes; waits up to
        ``timeout`` for the first. Reply and batch pipes that had no room for a whole message take more of
        it as soon as they have."""
        actors = self.actors.readers()
        unsent = self.actors.unsent() + self.pool.unsent()
        workers = self.pool.connections()
        messages = []
        for connection in self._pending([self._control, *workers, *actors], unsent, timeout):
            if isinstance(connection, Outbox):
                connection.flush()
                continue
            try:  # one message per wake-up: epoll reports the pipe again while more are waiting
                messages.append(receive(connection))
            except (EOFError, OSError):  # a SIGKILL may have cut its last message short: dropped
                if connection in actors:
                    self.actors.drop_requests(actors[connection])
                elif connection in workers:
                    self.pool.lost(connection)
                    self.worker_lost = True
        return messages

    def _pending(self, readers: list, writers: list[Outbox], timeout: float) -> list:
        """The readers with something to read and the writers with room, waiting up to ``timeout``.
        One epoll set kept across calls (registering every pipe on every wake-up cost ~8 us a pipe:
        0.5 ms a loop with 64 actors), brought up to date when the pipes came or went (comparing
        the set's map with them cost ~20 us a wake-up with 64 actors, the pipes themselves ~0.3)."""
        if (readers, writers) != self._watching:
            self._watching = (readers, writers)
            wanted = {**dict.fromkeys(readers, selectors.EVENT_READ), **dict.fromkeys(writers, selectors.EVENT_WRITE)}
            registered = list(self._selector.get_map().values())
            for key in registered:
                if key.fileobj not in wanted:  # closed already, maybe: by its number, not its fileno()
                    self._selector.unregister(key.fd)
            for pipe in wanted.keys() - {key.fileobj for key in registered}:
                self._selector.register(pipe, wanted[pipe])
        return [key.fileobj for key, _ in self._selector.select(timeout)]

    def close(self) -> None:
        self._selector.close()
        self._control.close()
        self._control_writer.close()
