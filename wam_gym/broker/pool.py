"""Model workers as processes of this machine (``MULTIRUN.backend=local``); wam_gym/broker/ray_pool.py has the same
interface over Ray actors."""

from __future__ import annotations

import signal
from typing import Any

from wam_gym.broker.batching import Request
from wam_gym.broker.config import BrokerConfig
from wam_gym.broker.model_worker import EndEpisodes, PolicyFactory, encode, serve_forever
from wam_gym.broker.outbox import Outbox


class LocalWorkerPool:
    """Model workers as processes of this machine: batches in on a pipe each (written without
    blocking: a batch may be larger than the pipe takes at once while its worker is busy), results
    out on a pipe each (the broker waits on ``connections()``, and on ``unsent()`` for room)."""

    def __init__(self, factory: PolicyFactory, devices: list[str], config: BrokerConfig, ctx):
        self.factory, self.devices, self.config, self.ctx = factory, devices, config, ctx
        self.processes: list[Any] = [None] * len(devices)
        self.inboxes: list[Outbox | None] = [None] * len(devices)
        self.outboxes: list[Any] = [None] * len(devices)  # our reading ends of the result pipes

    def __len__(self) -> int:
        return len(self.devices)

    def start(self, i: int) -> None:
        self._discard(i)
        reader, writer = self.ctx.Pipe(duplex=False)
        inbox, writer_in = self.ctx.Pipe(duplex=False)
        self.inboxes[i] = Outbox(writer_in)
        self.outboxes[i] = reader
        self.processes[i] = self.ctx.Process(
            target=serve_forever, name=f"wam-model-worker-{i}", daemon=True,
            args=(self.factory, self.devices[i], i, self.config.torch_threads_per_worker, inbox, writer,
                  self.config.batch_invariant),
        )
        self.processes[i].start()
        writer.close()  # the worker holds it now: its death is EOF on our end
        inbox.close()

    def _discard(self, i: int) -> None:
        """Let go of a dead worker's pipes."""
        for pipes in (self.inboxes, self.outboxes):
            if pipes[i] is not None:
                pipes[i].close()
                pipes[i] = None

    def connections(self) -> list[Any]:
        return [c for c in self.outboxes if c is not None]

    def unsent(self) -> list[Outbox]:
        """The batch pipes holding part of a batch the pipe had no room for yet."""
        return [inbox for inbox in self.inboxes if inbox is not None and inbox.waiting]

    def lost(self, connection) -> None:
        """``connection`` reached EOF: its worker has exited."""
        i = self.outboxes.index(connection)
        self.outboxes[i] = None
        connection.close()

    def submit(self, i: int, batch_id: int, requests: list[Request]) -> None:
        """Sent from the dispatcher's own thread, never blocking it (a worker that died takes its
        batches with it: the broker restarts it and resends them)."""
        self.inboxes[i].put(encode((batch_id, requests)))

    def end_episodes(self, i: int, episodes: list[int]) -> None:
        """Worker ``i`` lets these episodes go (after the batches sent before: one pipe, in order). A worker that
        died meanwhile took them with it."""
        if self.inboxes[i] is not None:
            self.inboxes[i].put(encode(EndEpisodes(episodes)))

    def alive(self, i: int) -> bool:
        return self.processes[i] is not None and self.processes[i].is_alive()

    def pid(self, i: int) -> int | None:
        return self.processes[i].pid if self.processes[i] is not None else None

    def kill(self, i: int) -> None:
        """SIGKILL worker ``i`` and reap it: a stopped or hung process dies of it too (unless stuck
        in the kernel, which no signal reaches; then it is left behind and replaced all the same)."""
        process = self.processes[i]
        if process is not None and process.is_alive():
            process.kill()
            process.join(timeout=10)

    def exit_cause(self, i: int) -> str:
        """How worker ``i`` ended, in words: its exit signal or code."""
        code = self.processes[i].exitcode if self.processes[i] is not None else None
        if code is None:
            return "still running"
        if code < 0:
            name = signal.Signals(-code).name
            return f"killed by {name}" + (" (the kernel's out-of-memory killer sends it too)" if name == "SIGKILL" else "")
        return f"exited with code {code}; its error output above says why"

    def close(self) -> None:
        for i, process in enumerate(self.processes):
            if process is not None and process.is_alive():
                self.inboxes[i].put(encode(None))  # one that cannot take it now is killed after the join below
        for i, process in enumerate(self.processes):
            if process is not None and process.pid is not None:  # None: its start failed (a start-up error)
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
                    process.join(timeout=10)
            self._discard(i)
