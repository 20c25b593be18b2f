"""A pipe its one writer never blocks on: how the broker's dispatcher answers actors.

The dispatcher thread answers every actor. A blocking write would stall all of them behind one
actor that stopped reading (stopped, hung, slow to be scheduled), and a multiprocess ``Queue``
hands each message to a feeder thread of its own, which must then win the GIL from the
dispatcher: at 64 actors that hand-over took 3-7 ms per reply, every cycle. So the write end is
non-blocking, framed the way ``Connection.send_bytes`` frames (the reader's ``recv_bytes`` reads
it), and whatever the pipe cannot take now waits here until the dispatcher's selector reports
the pipe writable again.
"""

from __future__ import annotations

import os
import struct

# multiprocess's frame header: a signed 4-byte length, or -1 and an 8-byte length past 2 GiB.
_SHORT, _LONG = struct.Struct("!i"), struct.Struct("!Q")


def frame(payload: bytes) -> bytes:
    """``payload`` with the header ``Connection.recv_bytes`` expects."""
    if len(payload) > 0x7FFFFFFF:
        return _SHORT.pack(-1) + _LONG.pack(len(payload)) + payload
    return _SHORT.pack(len(payload)) + payload


class Outbox:
    """The write end of a one-way pipe (``connection``), written without blocking."""

    def __init__(self, connection):
        self.connection = connection
        os.set_blocking(connection.fileno(), False)
        self._unsent = bytearray()  # the tail of the frames the pipe has not taken yet
        self.broken = False  # the reader is gone: what is put is dropped

    def fileno(self) -> int:
        return self.connection.fileno()

    @property
    def waiting(self) -> bool:
        """Bytes wait for the pipe to take them: watch it for writing and call :meth:`flush`."""
        return bool(self._unsent)

    def put(self, payload: bytes) -> None:
        """Send one message: now, or as soon as the pipe has room (frames stay in order)."""
        if not self.broken:
            self._unsent += frame(payload)
            self.flush()

    def flush(self) -> None:
        """Write as much of what waits as the pipe takes now."""
        try:
            while self._unsent:
                del self._unsent[: os.write(self.fileno(), self._unsent)]
        except BlockingIOError:  # the pipe is full: the rest goes when the selector says so
            pass
        except OSError:  # EPIPE: the reader closed (its process died)
            self.broken = True
            self._unsent.clear()

    def close(self) -> None:
        self.connection.close()
