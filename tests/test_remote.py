"""EVALUATION.agent=python and EVALUATION.agent=remote: a user's Policy served by the broker, and
policy servers (openpi, vla-eval) driven by our rollout actors.

The openpi side is checked against a tiny in-test server that speaks openpi's framing; the
vla-eval side against vla-eval's own model server (``tests/vla_eval_echo_server.py``), in a
subprocess we SIGKILL and restart to check that a lost server costs a retry, not a failure.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from agents.predictor import noise_seed
from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
from wam_gym.eval.manager import EvalError, EvalManager
from wam_gym.remote import PolicyServerError, PolicyServerLost, RemotePolicy, RemoteSettings
from wam_gym.remote.config import RemoteConfig
from wam_gym.remote.wire import pack_openpi, unpack

STATE_DIM, ACTION_DIM = 5, 4
ROOT = Path(__file__).resolve().parents[1]
REACH = "wam_gym/MetaWorld-reach-v3"
SEED, STEPS = 3, 10  # trial k uses seed SEED + k; STEPS env steps per episode


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
            ws.send(pack_openpi({"actions": np.full((3, ACTION_DIM), obs["noise_seed"], np.float32),
                                 "server_timing": {"infer_ms": 5.0}}))  # as openpi's own servers report it

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
    assert sorted(request) == ["image_orientation", "noise_seed", "observation/image", "observation/state",
                               "observation/wrist_image", "prompt"]
    assert request["image_orientation"] == "upright"  # how a task of no suite's sends its frames (Meta-World's too)
    assert request["observation/wrist_image"][0, 0, 0] == 1 and request["prompt"] == "reach"
    assert request["observation/state"].dtype == np.float32
    assert server.headers == ["Api-Key s3cret"]
    assert policy.cost.model_s == pytest.approx(3 * 0.005)  # the server's infer_ms, summed over the episode's rows
    policy.begin_episode(12)
    assert policy.cost.model_s is None  # counted per episode
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
    with pytest.raises(PolicyServerLost, match=rf"{silent.url} sent no answer in 0.5 s .*REMOTE\.protocol=vla-eval"):
        client(silent.url, timeout_s=0.5).begin_episode(0)
    url = f"ws://127.0.0.1:{free_port()}"  # nobody listens there
    with pytest.raises(PolicyServerLost, match=rf"{url} is unreachable for 0.3 s"):
        client(url, timeout_s=0.3).begin_episode(0)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------- evaluation runs
def eval_config(output_dir, agent: str, trials: int = 1, multirun=None, remote=None, **evaluation) -> EvalConfig:
    """Meta-World reach at 32x32, STEPS steps an episode, one actor; ``remote``: the REMOTE.* knobs."""
    return EvalConfig(
        env_kwargs={"image_size": 32},
        EVALUATION=EvaluationConfig(agent=agent, num_trials=trials, seed=SEED, max_episode_steps=STEPS,
                                    output_dir=str(output_dir), tensorboard=False, **evaluation),
        MULTIRUN=MultirunConfig(task_sets=[REACH], env_num_per_worker=1, **(multirun or {})),
        REMOTE=RemoteConfig(**(remote or {})),
    )


def records(output_dir) -> dict[int, dict]:
    """trial -> its episode record."""
    out = {}
    for path in Path(output_dir, "episodes").glob("*/*.json"):
        data = json.loads(path.read_text())
        out[data["trial"]] = data
    return out


@pytest.fixture
def importable_tests(monkeypatch):
    """Spawned actors and model workers import tests.* (the example policy) as users' modules: on PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_python_policy_runs_through_the_broker(tmp_path, importable_tests):
    out = tmp_path / "out"
    summary = EvalManager(eval_config(out, "python", trials=2, policy="tests.example_policy:make_policy")).run()
    assert summary["complete"] and summary["error"] is None
    assert summary["broker"]["mean_batch_size"] >= 1  # the model calls went through the broker
    done = records(out)
    assert sorted(done) == [0, 1] and all(r["steps"] == STEPS and r["attempts"] == 1 for r in done.values())
    for r in done.values():  # the cost columns: the workers' time for each request, the policy's denoising steps
        assert r["model_calls"] == -(-STEPS // 4) == r["denoise_steps"] and r["model_s"] > 0
    saved = json.loads((out / "results.json").read_text())
    from wam_gym.eval.fingerprint import python_fingerprint

    policy = "tests.example_policy:make_policy"  # and the content of its code (tests/)
    assert saved["protocol"]["agent"]["EVALUATION.policy"] == {"spec": policy, "fingerprint": python_fingerprint(policy)}


class VlaEvalServer:
    """tests/vla_eval_echo_server.py in a subprocess on a fixed port (it can be killed and restarted there)."""

    def __init__(self, tmp_path: Path, delay_s: float = 0.0):
        self.port, self.delay_s = free_port(), delay_s
        self.log, self.stderr = tmp_path / "server.jsonl", open(tmp_path / "server.stderr", "ab")  # noqa: SIM115
        self.url = f"ws://127.0.0.1:{self.port}"
        self.start()

    def start(self, timeout_s: float = 60.0) -> None:
        script = ROOT / "tests" / "vla_eval_echo_server.py"
        self.process = subprocess.Popen([sys.executable, str(script), str(self.port), str(self.log), str(self.delay_s)],
                                        stdout=subprocess.DEVNULL, stderr=self.stderr)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # its GET /health answers once the model server is built
            assert self.process.poll() is None, (self.log.parent / "server.stderr").read_text()
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"the vla-eval server on port {self.port} did not come up")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def events(self, kind: str) -> list[dict]:
        if not self.log.exists():
            return []
        return [e for e in map(json.loads, self.log.read_text().splitlines()) if e["event"] == kind]

    def kill_at_predict(self, n: int, restart: bool) -> threading.Thread:
        """In a thread: SIGKILL the server once it has started its n-th model call, then maybe restart it."""

        def watch():
            while len(self.events("predict")) < n:
                time.sleep(0.02)
            self.kill()
            if restart:
                self.start()

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self.stderr.close()


@pytest.fixture
def vla_eval_server(tmp_path):
    pytest.importorskip("vla_eval")
    servers = []

    def start(**kwargs) -> VlaEvalServer:
        servers.append(VlaEvalServer(tmp_path, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def remote_config(out, server: VlaEvalServer, remote=None, **evaluation) -> EvalConfig:
    return eval_config(out, "remote", remote={"url": server.url, "protocol": "vla-eval", **(remote or {})}, **evaluation)


def test_vla_eval_model_server_runs_every_episode(tmp_path, vla_eval_server):
    server, out = vla_eval_server(), tmp_path / "out"
    summary = EvalManager(remote_config(out, server, trials=2)).run()
    assert summary["complete"] and summary["error"] is None
    assert sorted(records(out)) == [0, 1] and all(r["steps"] == STEPS for r in records(out).values())
    starts, ends = server.events("episode_start"), server.events("episode_end")
    assert sorted(e["seed"] for e in starts) == [SEED, SEED + 1]
    assert [e["task"]["name"] for e in starts] == [REACH] * 2 and starts[0]["task"]["instruction"]
    assert [set(e["result"]) for e in ends] == [{"success"}] * 2
    calls = server.events("predict")  # chunks of 4, one action served per step: ceil(10 / 4) calls an episode
    assert len(calls) == 2 * 3 and calls[0]["cameras"] == ["corner", "gripperPOV"]
    # each input under the first of its default keys: vla-eval's recommended ones, which its model servers all read
    # and how its frames are turned (our extension; its model servers ignore it): Meta-World's drivers send them upright
    assert calls[0]["keys"] == ["image_orientation", "images", "state", "task_description"]


def test_server_killed_mid_episode_and_restarted_costs_a_retry_not_a_failure(tmp_path, vla_eval_server):
    server, out = vla_eval_server(delay_s=0.3), tmp_path / "out"
    watcher = server.kill_at_predict(1, restart=True)
    summary = EvalManager(remote_config(out, server, remote={"timeout_s": 60.0})).run()
    watcher.join()
    assert summary["complete"] and summary["error"] is None
    assert records(out)[0]["attempts"] == 2 and records(out)[0]["steps"] == STEPS
    assert summary["reruns"] == {"actor_lost": 0, "server_lost": 1, "worker_lost": 0, "actors_stalled": 0}


def test_server_that_never_comes_back_stops_the_run_naming_it(tmp_path, vla_eval_server):
    server, out = vla_eval_server(delay_s=0.3), tmp_path / "out"
    server.kill_at_predict(4, restart=False)  # trial 1's first model call (trial 0 made 3)
    with pytest.raises(EvalError, match=rf"trial 1: lost the policy server at {server.url} 2 times"):
        EvalManager(remote_config(out, server, trials=2, max_attempts=2, remote={"timeout_s": 1.0})).run()
    assert sorted(records(out)) == [0]  # the finished episode is kept
    assert server.url in json.loads((out / "results.json").read_text())["error"]


def test_server_error_answer_stops_the_run_with_its_message(tmp_path, vla_eval_server):
    server, out = vla_eval_server(), tmp_path / "out"
    config = remote_config(out, server, remote={"keys": {"state": "proprio"}})  # the echo server reads obs["state"]
    with pytest.raises(EvalError, match=rf"trial 0 failed: PolicyServerError: the policy server at {server.url} "
                                        r"failed: observation_failed: KeyError: 'state'"):
        EvalManager(config).run()
    assert records(out) == {}


# ----------------------------------------------------------------- bad inputs, refused before anything runs
@pytest.mark.parametrize(
    "agent, knobs, match",
    [
        ("remote", {}, r"agent=remote needs REMOTE.url=ws://host:port"),
        ("remote", {"url": "http://host:8000"}, r"REMOTE\.url='http://host:8000': write it as ws://host:port"),
        ("remote", {"url": "ws://host:80x"}, r"REMOTE\.url='ws://host:80x': .*write it as ws://host:port"),
        ("remote", {"url": "ws://h:1", "protocol": "grpc"}, r"REMOTE\.protocol='grpc': choose one of"),
        ("remote", {"url": "ws://h:1", "keys": {"pixels.top": "img"}},
         r"REMOTE\.keys maps \['pixels.top'\], which .* does not observe; map any of .*pixels.corner"),
        ("remote", {"url": "ws://h:1", "keys": {"proprio": "s"}}, r"maps \['proprio'\]"),
        ("remote", {"url": "ws://h:1", "timeout_s": 0}, r"REMOTE\.timeout_s must be in \(0, 86400\] .*got 0"),
        ("remote", {"url": "ws://h:1", "timeout_s": 1e9}, r"REMOTE\.timeout_s must be in \(0, 86400\]"),
        ("remote", {"url": "ws://localhost"}, r"REMOTE\.url='ws://localhost' names no port: write it as ws://localhost:PORT"),
        ("remote", {"url": "ws://h:1", "api_key": " "}, r"REMOTE\.api_key is empty .*or to null to send none"),
        ("python", {}, r"agent=python needs EVALUATION.policy=pkg.module:factory"),
        ("python", {"policy": "tests.example_policy"}, r"write it as pkg.module:factory"),
        ("python", {"policy": "no_such_pkg.policy:make"}, r"cannot import no_such_pkg.policy .*PYTHONPATH"),
        ("python", {"policy": "tests.example_policy:nope"}, r"has no callable 'nope'"),
    ],
    ids=["remote-without-url", "remote-http-url", "remote-bad-port", "remote-bad-protocol", "remote-unknown-camera",
         "remote-unknown-key", "remote-zero-timeout", "remote-endless-timeout", "remote-url-without-port",
         "remote-empty-api-key", "python-without-policy", "python-without-factory",
         "python-unimportable", "python-no-such-factory"],
)
def test_bad_remote_and_python_inputs_are_refused_before_anything_runs(tmp_path, agent, knobs, match):
    """``knobs``: REMOTE.* for agent=remote, EVALUATION.* for agent=python."""
    with pytest.raises(ValueError, match=match):
        EvalManager(eval_config(tmp_path / "out", agent, remote=knobs) if agent == "remote"
                    else eval_config(tmp_path / "out", agent, **knobs))
    assert not (tmp_path / "out").exists()


def test_a_server_never_reached_is_refused_in_seconds_naming_the_url_and_its_knob(tmp_path):
    """The reconnect budget (REMOTE.timeout_s, 300 s here) is for a server lost mid-run, not one never reached."""
    url = f"ws://127.0.0.1:{free_port()}"  # nobody listens there
    start = time.monotonic()
    with pytest.raises(EvalError, match=rf"^nothing answers at REMOTE\.url={url} \(.*\): start the policy "
                                        r"server there .*or set REMOTE\.url to where it listens; nothing was run"):
        EvalManager(eval_config(tmp_path / "out", "remote", remote={"url": url, "timeout_s": 300.0})).run()
    assert time.monotonic() - start < 15
    assert not (tmp_path / "out").exists()  # refused before the output dir was touched


def test_results_never_keep_the_api_key(tmp_path):
    config = eval_config(tmp_path / "out", "remote", remote={"url": "ws://h:1", "api_key": "s3cret"})
    composed = {"EVALUATION": {"agent": "remote"}, "REMOTE": {"url": "ws://h:1", "api_key": "s3cret"}}
    manager = EvalManager(config, composed)
    plan = manager.plan
    assert plan.composed["REMOTE"]["api_key"] == "<redacted>" and "s3cret" not in str(plan.protocol.record)
    assert composed["REMOTE"]["api_key"] == "s3cret"  # the caller's dict is left alone


# ----------------------------------------------------------------- a run is bound to the model behind the server
def test_a_run_resumed_against_a_server_of_another_model_is_refused(tmp_path, openpi_server):
    """protocol.json records what the server said it serves (wam_gym.serve: content hashes and settings), so a
    resume against another model would mix two models' episodes: refused, nothing run, the first kept."""
    from wam_gym.eval.errors import ResumeMismatch

    out = tmp_path / "out"
    first = openpi_server(metadata={"model": {"ckpt": {"fingerprint": "aaa"}}})
    assert EvalManager(eval_config(out, "remote", remote={"url": first.url})).run()["complete"]
    recorded = json.loads((out / "protocol.json").read_text())["agent"]["server_model"]
    assert recorded == {"ckpt": {"fingerprint": "aaa"}}
    second = openpi_server(metadata={"model": {"ckpt": {"fingerprint": "bbb"}}})
    with pytest.raises(ResumeMismatch, match=r"server_model was .*aaa.*, now .*bbb"):
        EvalManager(eval_config(out, "remote", trials=2, remote={"url": second.url})).run()
    assert sorted(records(out)) == [0] and not second.requests


def test_a_server_that_now_serves_another_model_stops_the_episode(openpi_server):
    server = openpi_server(metadata={"model": {"ckpt": "B"}})
    policy = client(server.url, expected_model={"ckpt": "A"})
    with pytest.raises(PolicyServerError, match=r"now serves another model \(\{\"ckpt\": \"B\"\}\) than the one this "
                                                r"run's episodes came from \(\{\"ckpt\": \"A\"\}\): serve that model again"):
        policy.begin_episode(0)
    assert client(server.url, expected_model={"ckpt": "B"}).begin_episode(0) is None  # the same model: fine
