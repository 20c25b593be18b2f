"""EVALUATION.agent=python and EVALUATION.agent=remote: a user's Policy served by the broker, and
policy servers (openpi, vla-eval) driven by our rollout actors.

The openpi side is checked against a tiny in-test server that speaks openpi's framing; the
vla-eval side against vla-eval's own model server (``tests/vla_eval_echo_server.py``), in a
subprocess we SIGKILL and restart to check that a lost server costs a retry, not a failure.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

from wam_gym.broker import noise_seed
from wam_gym.remote import PolicyServerError, PolicyServerLost, RemotePolicy, RemoteSettings
from wam_gym.wire import pack_openpi, unpack

STATE_DIM, ACTION_DIM = 5, 4


def observation(state0: float = 0.5, rows: int = 1) -> dict:
    """A batch in the env contract, with two cameras (the first is openpi's observation/image)."""
    image = np.zeros((rows, 8, 8, 3), np.uint8)
    state = np.full((rows, STATE_DIM), state0, np.float32)
    return {"pixels": {"corner": image, "gripperPOV": image + 1}, "state": state, "instruction": ("reach",) * rows}


# ----------------------------------------------------------------- openpi framing
class OpenpiServer:
    """openpi's framing: metadata frame first, then one answer frame per observation frame;
    an error is a text frame, then the server closes. Answers (3, ACTION_DIM) actions filled
    with the request's noise_seed; a negative state is refused."""

    def __init__(self, metadata: dict | None = None, silent: bool = False):
        from websockets.sync.server import serve

        self.metadata, self.silent = metadata or {}, silent
        self.requests: list[dict] = []
        self.headers: list[str | None] = []
        self.server = serve(self.handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, ws) -> None:
        self.headers.append(ws.request.headers.get("Authorization"))
        if self.silent:
            ws.recv()  # never speaks
            return
        ws.send(pack_openpi(self.metadata))
        for frame in ws:
            obs = unpack(frame)
            self.requests.append(obs)
            state = obs.get("observation/state", obs.get("observation/joints"))
            if state[0] < 0:
                ws.send("bad observation: negative state")
                return
            ws.send(pack_openpi({"actions": np.full((3, ACTION_DIM), obs["noise_seed"], np.float32)}))

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def openpi_server():
    servers = []

    def start(**kwargs) -> OpenpiServer:
        servers.append(OpenpiServer(**kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def client(url: str, **settings) -> RemotePolicy:
    return RemotePolicy(RemoteSettings(url, **{"timeout_s": 5.0, **settings}))


def test_openpi_framing_keys_noise_seed_and_api_key(openpi_server):
    server = openpi_server()
    policy = client(server.url, api_key="s3cret")
    policy.begin_episode(11)
    assert policy.action_horizon is None  # the metadata names none: chunks are executed whole
    first = policy.predict(observation(rows=2))
    second = policy.predict(observation())
    assert first.actions.shape == (2, 3, ACTION_DIM) and first.actions.dtype == np.float32
    assert first.actions[:, 0, 0].tolist() == [noise_seed(11, 0, 0), noise_seed(11, 0, 1)]  # a row each
    assert second.actions[0, 0, 0] == noise_seed(11, 1)
    request = server.requests[0]
    assert sorted(request) == ["noise_seed", "observation/image", "observation/state", "observation/wrist_image",
                               "prompt"]
    assert request["observation/wrist_image"][0, 0, 0] == 1 and request["prompt"] == "reach"
    assert request["observation/state"].dtype == np.float32
    assert server.headers == ["Api-Key s3cret"]
    policy.close()


def test_openpi_metadata_horizon_caps_chunks_and_keys_can_be_renamed(openpi_server):
    server = openpi_server(metadata={"action_horizon": 2})
    policy = client(server.url, keys={"state": "observation/joints", "pixels.corner": "cam"})
    policy.begin_episode(0)
    assert policy.action_horizon == 2
    assert policy.predict(observation()).actions.shape == (1, 2, ACTION_DIM)
    assert {"observation/joints", "cam", "observation/wrist_image"} <= set(server.requests[0])
    assert server.headers == [None]
    policy.close()


def test_openpi_text_frame_is_the_servers_error(openpi_server):
    policy = client(openpi_server().url)
    policy.begin_episode(0)
    with pytest.raises(PolicyServerError, match="failed: bad observation: negative state"):
        policy.predict(observation(-1.0))


def test_silent_and_absent_servers_are_lost_with_the_url(openpi_server):
    silent = openpi_server(silent=True)
    with pytest.raises(PolicyServerLost, match=rf"{silent.url} sent no answer in 0.5 s .*remote_protocol=vla-eval"):
        client(silent.url, timeout_s=0.5).begin_episode(0)
    with contextlib.closing(__import__("socket").socket()) as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"ws://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(PolicyServerLost, match=rf"{url} is unreachable for 0.3 s"):
        client(url, timeout_s=0.3).begin_episode(0)
