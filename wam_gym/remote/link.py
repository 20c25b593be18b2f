"""One WebSocket connection to a policy server, for :class:`wam_gym.remote.RemotePolicy`: opened with backoff,
frames sent and received within the run's timeout (its owner's ``on_wait`` called about once a second while it
waits), and every failure one of two errors, because they call for opposite handling (see wam_gym/remote/client.py):
:class:`PolicyServerLost` (rerun the episode) or :class:`PolicyServerError` (stop the run)."""

from __future__ import annotations

import time
from typing import Any

from wam_gym.remote.wire import Message, WireError, unpack

# How often a waiting client wakes up to call its on_wait hook (the actor's heartbeat).
WAIT_SLICE_S = 1.0
MAX_BACKOFF_S = 2.0  # longest pause between connection attempts while a server restarts
# A run's first connection: a server never reached is a wrong URL or a server not started, refused in seconds
# (REMOTE.timeout_s is the budget for a server lost mid-run, while it restarts). A server reached but still
# loading its model is waited for: its greeting comes within REMOTE.timeout_s.
FIRST_CONNECT_S = 5.0


class PolicyServerLost(ConnectionError):
    """The server is unreachable, dropped the connection or went silent: rerun the episode."""


class PolicyServerError(RuntimeError):
    """The server answered with an error: a real one, rerunning would not help."""


class ServerLink:
    """The connection to the server at ``url`` (``api_key`` sent as openpi's header when given)."""

    def __init__(self, url: str, timeout_s: float, api_key: str | None = None):
        self.url, self.timeout_s, self.api_key = url, timeout_s, api_key
        self.on_wait = None  # called about once a second while waiting (the actor's heartbeat)
        self._ws = None
        self._seq = 0  # the last vla-eval message's sequence number on this connection

    @property
    def is_open(self) -> bool:
        return self._ws is not None

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()  # waits at most close_timeout for a silent server
            except Exception:  # noqa: BLE001 - the socket is gone either way
                pass

    def connect(self, first: bool = False) -> bool:
        """Open a connection unless one is open, retrying with backoff for ``timeout_s`` (``first``: the run's
        first connection, for FIRST_CONNECT_S: a server never reached is refused at once, naming the URL). Whether
        a new one was opened (then the server is greeted again)."""
        from websockets.exceptions import InvalidStatus
        from websockets.protocol import State
        from websockets.sync.client import connect

        if self._ws is not None and self._ws.state is State.OPEN:
            return False
        self.close()
        url, timeout = self.url, min(FIRST_CONNECT_S, self.timeout_s) if first else self.timeout_s
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        deadline, delay = time.monotonic() + timeout, 0.1
        while True:
            try:
                # No pings: a server busy in a long model call (holding its GIL) must not look dead.
                self._ws = connect(url, compression=None, max_size=None, ping_interval=None, additional_headers=headers,
                                   open_timeout=max(1.0, min(10.0, deadline - time.monotonic())), close_timeout=1.0)
                break
            except InvalidStatus as exc:
                if exc.response.status_code in (401, 403):
                    raise PolicyServerError(f"the policy server at {url} refused the connection "
                                            f"(HTTP {exc.response.status_code}): set REMOTE.api_key") from None
                error: Exception = exc
            except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, a handshake cut short
                error = exc
            if time.monotonic() + delay > deadline:
                if first:
                    raise PolicyServerError(f"nothing answers at REMOTE.url={url} ({_reason(error)}): start "
                                            "the policy server there (python -m wam_gym.serve ...), or set "
                                            "REMOTE.url to where it listens")
                raise PolicyServerLost(f"the policy server at {url} is unreachable for {timeout:g} s "
                                       f"(REMOTE.timeout_s): {error}")
            self._sleep(delay)
            delay = min(2 * delay, MAX_BACKOFF_S)
        self._seq = 0
        return True

    def send_message(self, kind: str, payload: dict[str, Any]) -> int:
        self._seq += 1
        self.send(Message(kind, payload, self._seq).pack())
        return self._seq

    def send(self, data: bytes) -> None:
        try:
            self._ws.send(data)
        except Exception as exc:  # ConnectionClosed, or the socket's own error
            self._lost(f"the connection to the policy server at {self.url} dropped ({exc})")

    def recv(self, hint: str = "") -> bytes | str:
        """The next frame, waiting up to ``timeout_s`` (calling on_wait meanwhile)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self._ws.recv(timeout=max(0.0, min(WAIT_SLICE_S, deadline - time.monotonic())))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    self._lost(f"the policy server at {self.url} sent no answer in {self.timeout_s:g} "
                               f"s (REMOTE.timeout_s){hint}")
                if self.on_wait is not None:
                    self.on_wait()
            except Exception as exc:  # ConnectionClosed: the server went away
                self._lost(f"the connection to the policy server at {self.url} dropped ({exc})")

    def decode(self, frame: bytes | str) -> Any:
        try:
            return unpack(frame)
        except WireError as exc:
            raise PolicyServerError(f"the policy server at {self.url} sent a bad frame: {exc}") from None

    def _lost(self, why: str):
        self.close()
        raise PolicyServerLost(why)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, WAIT_SLICE_S))
            if self.on_wait is not None:
                self.on_wait()


def _reason(error: Exception) -> str:
    """Why a connection failed, in a few words (a refused port, a name that does not resolve, an HTTP status)."""
    text = str(error) or type(error).__name__
    return text.split(": ", 1)[-1] if text.startswith("[Errno") else text
