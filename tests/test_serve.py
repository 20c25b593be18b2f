"""python -m wam_gym.serve driven by the real clients: openpi-client (from its own venv, numpy<2)
and vla-eval's ``Connection``. Real server processes, real model workers, real signals.

The WAM tests serve a tiny random checkpoint and compare every answer with an in-process
``WAMPolicy.predict`` on the same observation and seed; the rest serve the numpy policies of
tests/serve_policies.py, whose answers follow from the state.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import msgpack
import numpy as np
import psutil
import pytest
from vla_eval.connection import Connection
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from agents.predictor import noise_seed
from wam_gym.remote.wire import pack_openpi, unpack
from wam_gym.serve.launch import launched, stop

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
STEPS = 2  # denoising steps of the served tiny WAM


# ----------------------------------------------------------------- helpers
@contextlib.contextmanager
def serving(tmp_path: Path, *overrides: str, env: dict | None = None, wait_ready: bool = True):
    """A ``python -m wam_gym.serve`` process on a free port: yields (port, process, log path). With
    ``wait_ready=False`` it yields as soon as the server listens, before its model workers are ready."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), **(env or {})}
    if wait_ready:
        with launched(overrides, env=environment, cwd=ROOT, log=tmp_path / "serve.log") as server:
            yield server.port, server.process, server.log
        return
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "wam_gym.serve", "SERVE.port=0", *overrides], cwd=ROOT,
                                   env=environment, stdout=out, stderr=subprocess.STDOUT)
    try:
        while "serving on ws://" not in log.read_text():
            assert process.poll() is None, log.read_text()
            anyio.run(anyio.sleep, 0.1)
        yield int(log.read_text().split("serving on ws://")[1].split()[0].rsplit(":", 1)[1]), process, log
    finally:
        stop(process)


def http(port: int, path: str, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def stats(port: int) -> dict:
    return json.loads(http(port, "/stats")[1])


def openpi_obs(state_dim: int = 4, size: int = 64, **extra) -> dict:
    rng = np.random.default_rng(0)
    return {"observation/image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            "observation/state": np.arange(state_dim, dtype=np.float32), "prompt": "reach", **extra}


def openpi_call(port: int, frame: bytes | str):
    """One request on a fresh openpi connection: (the answer frame, the close code or None)."""
    with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
        ws.recv()  # the metadata
        ws.send(frame)
        answer = ws.recv()
        try:
            ws.recv(timeout=10)
        except ConnectionClosed as exc:
            return answer, exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            return answer, None
    return answer, None


@pytest.fixture(scope="module")
def wam_server(tiny_ckpt, tmp_path_factory):
    """The tiny WAM, served with room to batch: 8 requests or 100 ms, whichever comes first."""
    with serving(tmp_path_factory.mktemp("serve"), f"ckpt={tiny_ckpt}", f"EVALUATION.num_inference_steps={STEPS}",
                 "EVALUATION.replan_steps=4", "MULTIRUN.inference_batch_size=8",
                 "MULTIRUN.inference_batch_wait_ms=100") as (port, _, log):
        yield port, log


@pytest.fixture(scope="module")
def local_policy(tiny_ckpt):
    from agents.wam.inference_config import InferenceConfig
    from agents.wam.policy import WAMPolicy

    return WAMPolicy.from_checkpoint(tiny_ckpt, InferenceConfig.from_knobs(num_inference_steps=STEPS))


def expected_chunk(policy, images: tuple, state, instruction: str, seed: int) -> np.ndarray:
    from envs.protocol import stack_rows

    row = {"pixels": {"corner": images[0], "gripperPOV": images[1]}, "state": state, "instruction": instruction}
    return policy.predict(stack_rows([row]), noise_seeds=[seed]).actions[0]


# ----------------------------------------------------------------- real clients
def test_openpi_clients_are_batched_and_answered_as_in_process(wam_server, local_policy, openpi_python, tmp_path):
    port, _ = wam_server
    before = stats(port)["broker"]
    out = tmp_path / "openpi.npz"
    clients, calls = 6, 2
    subprocess.run([openpi_python, TESTS / "clients" / "openpi_driver.py", str(port), str(clients), str(calls), out],
                   check=True, timeout=300)
    after = stats(port)["broker"]
    served = after["requests"] - before["requests"]
    assert served == clients * calls
    assert served / (after["batches"] - before["batches"]) > 1  # requests of different connections shared model calls
    with np.load(out, allow_pickle=False) as answers:
        for c in range(clients):
            for k in range(calls):
                got = answers[f"{c}_{k}_actions"]
                want = expected_chunk(local_policy, (answers[f"{c}_{k}_image"], answers[f"{c}_{k}_wrist_image"]),
                                      answers[f"{c}_{k}_state"], f"task {c % 2}", 1000 * c + k)
                assert got.shape == (16, 4) and got.dtype == np.float32
                np.testing.assert_allclose(got, want, atol=1e-5)  # batched matmuls: last-bit differences only
                assert answers[f"{c}_{k}_infer_ms"] > 0


def test_vla_eval_clients_get_one_action_per_step_from_their_own_chunks(wam_server, local_policy):
    """vla-eval's Connection asks for one action per step: the server keeps each session's chunk
    (EVALUATION.replan_steps=4 of each 16) and calls the model only when it is used up."""
    port, _ = wam_server
    before = stats(port)
    sessions, steps = 4, 6
    rng = np.random.default_rng(1)
    observations = [[{"images": {"corner": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
                                 "gripperPOV": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)},
                      "state": rng.standard_normal(4).astype(np.float32), "task_description": "reach"}
                     for _ in range(steps)] for _ in range(sessions)]
    actions = [[] for _ in range(sessions)]

    async def session(s: int) -> None:
        async with Connection(f"ws://127.0.0.1:{port}", timeout=120) as conn:
            info = conn.server_info
            assert info["model_server"] == "wam_gym" and info["action_horizon"] == 16
            # what vla-eval's runner reads, from the checkpoint: two cameras and a 4-d state in, 4-d actions out
            assert info["observation_params"] == {"send_state": True, "send_wrist_image": True}
            assert sorted(info["observation_spec"]) == ["corner", "gripperPOV", "language", "state"]
            assert (info["observation_spec"]["state"]["dims"], info["action_spec"]["actions"]["dims"]) == (4, 4)
            await conn.start_episode({"seed": 50 + s})
            for obs in observations[s]:
                actions[s].append((await conn.act(obs))["actions"])
            await conn.end_episode({"success": True})

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for s in range(sessions):
                group.start_soon(session, s)

    anyio.run(main)
    after = stats(port)
    assert after["vla_eval_requests"] - before["vla_eval_requests"] == sessions * steps
    assert after["vla_eval_episodes"] - before["vla_eval_episodes"] == sessions
    model_calls = after["broker"]["requests"] - before["broker"]["requests"]
    assert model_calls == sessions * 2  # steps 0-3 from the first chunk, 4-5 from the second
    assert model_calls / (after["broker"]["batches"] - before["broker"]["batches"]) > 1
    for s in range(sessions):
        for call, first in enumerate((0, 4)):
            obs = observations[s][first]
            chunk = expected_chunk(local_policy, (obs["images"]["corner"], obs["images"]["gripperPOV"]), obs["state"],
                                   "reach", noise_seed(50 + s, call))
            for step in range(first, min(first + 4, steps)):
                assert actions[s][step].shape == (4,)
                np.testing.assert_allclose(actions[s][step], chunk[step - first], atol=1e-5)


# ----------------------------------------------------------------- what vla-eval's runner reads
@pytest.fixture
def environ_kept():
    """vla-eval's LIBERO module sets EGL variables when imported: keep them from the tests after this one."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_the_greeting_tells_vla_evals_libero_benchmark_what_the_model_needs(environ_kept):
    """vla-eval's runner reads observation_params, observation_spec and action_spec from the HELLO reply
    and builds its benchmark with them (vla_eval.orchestrator). For a LIBERO-shaped model its LIBERO
    benchmark sends the wrist image and the state, and what its make_obs sends becomes the model's
    inputs. vla-eval's own code throughout; only the simulator is left out (a robosuite observation made
    here). tests/suites/test_libero.py runs the whole runner against a server."""
    from types import SimpleNamespace

    from vla_eval.benchmarks.libero.benchmark import LIBEROBenchmark
    from vla_eval.orchestrator import _merge_observation_params
    from vla_eval.protocol.messages import Message, MessageType, pack_message, unpack_message
    from vla_eval.specs import DimSpec, check_specs

    from wam_gym.remote.keymap import ObservationError, key_map, to_contract
    from wam_gym.remote.wire import VLA_EVAL, as_message, greeting
    from wam_gym.serve.hello import ServedModel, hello_fields, runner_hints

    cameras = ("agentview", "robot0_eye_in_hand")  # wam_gym/LIBERO-*'s, with its 8-d state and 7-d actions
    hello = unpack_message(greeting({"server_version": "test"}, hello_fields(ServedModel(cameras, 8, 7))))
    assert hello.type is MessageType.HELLO
    info = hello.payload
    config = {"suite": "libero_spatial", "seed": 7, "num_steps_wait": 10}  # vla-eval's configs/libero_spatial.yaml
    benchmark = LIBEROBenchmark(**_merge_observation_params(LIBEROBenchmark, config, info["observation_params"]))
    assert benchmark.send_wrist_image and benchmark.send_state
    overridden = _merge_observation_params(LIBEROBenchmark, {**config, "send_state": False}, info["observation_params"])
    assert overridden["send_state"] is False  # the run's own params (--param send_state=false) win

    server_obs = {key: DimSpec.from_dict(spec) for key, spec in info["observation_spec"].items()}
    server_action = {key: DimSpec.from_dict(spec) for key, spec in info["action_spec"].items()}
    assert set(server_obs) == set(benchmark.get_observation_spec())  # each input declared is one the benchmark sends
    assert (server_obs["state"].dims, server_action["actions"].dims) == (8, 7)
    warnings = check_specs(server_action, benchmark.get_action_spec(), server_obs, benchmark.get_observation_spec())
    # observations: only the state's layout, which a checkpoint does not record (nor its actions')
    assert [w for w in warnings if w.startswith("observation")] == \
        ["observation [state]: state: eef_pos3_axisangle3_gripper2 vs raw"]

    rng = np.random.default_rng(0)
    raw = {"agentview_image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
           "robot0_eye_in_hand_image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
           "robot0_eef_pos": np.array([0.1, 0.2, 0.3]), "robot0_eef_quat": np.array([0.0, 0.0, 0.0, 1.0]),
           "robot0_gripper_qpos": np.array([0.04, -0.04])}
    task = {"name": "put the bowl on the plate"}
    # make_obs also sends the controller's pose (controller_states) when it sends the state: a stand-in robot
    controller = SimpleNamespace(ee_pos=np.zeros(3), ee_ori_mat=np.eye(3))
    benchmark._env = SimpleNamespace(robots=[SimpleNamespace(controller=controller)])
    sent = benchmark.make_obs(raw, task)
    frame = pack_message(Message(MessageType.OBSERVATION, sent, seq=1))  # vla-eval's encoding: PNG images
    keys = key_map(VLA_EVAL, cameras)
    row = to_contract(as_message(unpack(frame)).payload, keys, "SERVE.vla_eval_keys")
    np.testing.assert_array_equal(row["pixels"]["agentview"], sent["images"]["agentview"])
    np.testing.assert_array_equal(row["pixels"]["robot0_eye_in_hand"], sent["images"]["wrist"])
    np.testing.assert_allclose(row["state"], sent["states"].astype(np.float32))
    assert row["instruction"] == task["name"]

    lacking = LIBEROBenchmark(**overridden).make_obs(raw, task)
    with pytest.raises(ObservationError, match=r"lacks 'state' .*: send it \(vla-eval's runner: --param "
                                               r"send_state=true\), or map .* with SERVE\.vla_eval_keys$"):
        to_contract(lacking, keys, "SERVE.vla_eval_keys", runner_hints(cameras))


# ----------------------------------------------------------------- bad input
BAD_OPENPI = {
    "not msgpack": (b"\xc1\xc1", "not a msgpack frame"),
    "a text frame": ("hello", "text frame"),
    "an object array": (msgpack.packb({"observation/state": {b"__ndarray__": True, b"data": b"", b"dtype": "|O",
                                                             b"shape": [0]}}), "is not allowed"),
    "array bytes that lie": (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"1234", b"dtype": "<f4",
                                                  b"shape": [1000]}}), "has 4 bytes"),
    "a missing camera": (pack_openpi({k: v for k, v in openpi_obs().items() if k != "observation/wrist_image"}),
                         "lacks 'observation/wrist_image'"),
    "a float image": (pack_openpi({**openpi_obs(), "observation/image": np.zeros((64, 64, 3), np.float32)}),
                      "must be a uint8 (H, W, 3) image"),
    "a 2-D state": (pack_openpi({**openpi_obs(), "observation/state": np.zeros((2, 4), np.float32)}),
                    "must be a 1-D numeric array"),
    "a wrong state size": (pack_openpi(openpi_obs(state_dim=7)), "the model needs float (B, 4)"),
    "an inf state": (pack_openpi({**openpi_obs(), "observation/state": np.array([0, np.inf, 0, 0], np.float32)}),
                     "state holds NaN/inf (dimensions [1])"),
    "an empty image": (pack_openpi({**openpi_obs(), "observation/image": np.zeros((0, 0, 3), np.uint8)}),
                       "is an empty image (0, 0, 3)"),
    "a bad noise seed": (pack_openpi(openpi_obs(noise_seed=-1)), "noise_seed=-1"),
}


def test_a_bad_request_fails_only_its_own_connection(wam_server):
    """openpi: a one-line text frame, then the connection closes; vla-eval: an error message and the
    connection stays. A vla-eval session running meanwhile is answered throughout."""
    port, log = wam_server
    good = {"images": {"corner": np.zeros((64, 64, 3), np.uint8), "gripperPOV": np.zeros((64, 64, 3), np.uint8)},
            "state": np.zeros(4, np.float32), "task_description": "reach"}

    async def main() -> None:
        async with Connection(f"ws://127.0.0.1:{port}", timeout=120) as conn:
            await conn.start_episode({"seed": 1})
            for name, (frame, message) in BAD_OPENPI.items():
                answer, code = await anyio.to_thread.run_sync(openpi_call, port, frame)
                assert isinstance(answer, str) and answer.startswith("wam_gym.serve: "), name
                assert message in answer and "\n" not in answer and "Traceback" not in answer, (name, answer)
                assert code == 1008, name
                assert (await conn.act(good))["actions"].shape == (4,)
            for bad, message in (({**good, "state": np.zeros(7, np.float32)}, "the model needs float (B, 4)"),
                                 ({**good, "images": {"corner": good["images"]["corner"]}}, "lacks 'images.gripperPOV'")):
                await conn.start_episode({"seed": 2})
                with pytest.raises(RuntimeError, match="Server error") as error:
                    await conn.act(bad)
                assert message in str(error.value)
                assert (await conn.act(good))["actions"].shape == (4,)  # the same connection goes on

    anyio.run(main)
    assert "Traceback" not in log.read_text()


def test_a_served_python_policy_is_handed_only_observations_a_wam_would_take(tmp_path):
    """The server checks every client's observation once, for whatever it serves: a NaN/inf state or an empty
    frame never reaches a python policy (a WAM refuses them too)."""
    obs = {"observation/image": np.zeros((8, 8, 3), np.uint8), "observation/state": np.ones(3, np.float32), "prompt": "x"}
    bad = {"an inf state": ({**obs, "observation/state": np.array([0, -np.inf, 0], np.float32)},
                            "'observation/state': the observation's state holds NaN/inf (dimensions [1])"),
           "a NaN state": ({**obs, "observation/state": np.array([np.nan, 0, 0])}, "holds NaN/inf (dimensions [0])"),
           "a 0x0 image": ({**obs, "observation/image": np.zeros((0, 0, 3), np.uint8)},
                           "'observation/image' (camera cam) is an empty image (0, 0, 3): send frames of H, W >= 1"),
           "a 0-wide image": ({**obs, "observation/image": np.zeros((8, 0, 3), np.uint8)}, "is an empty image (8, 0, 3)")}
    with serving(tmp_path, "EVALUATION.agent=python", "EVALUATION.policy=serve_policies:make_slow", "SERVE.cameras=[cam]",
                 env={"WAM_TEST_DELAY_S": "0"}) as (port, _, log):
        for name, (frame, message) in bad.items():
            answer, code = openpi_call(port, pack_openpi(frame))
            assert isinstance(answer, str) and message in answer and code == 1008, (name, answer)
        assert unpack(openpi_call(port, pack_openpi(obs))[0])["actions"].shape == (4, 3)
        assert stats(port)["broker"]["requests"] == 1  # the bad ones never reached the model worker
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
@pytest.mark.parametrize("delay_s", [0.3, 0.8], ids=["importing", "checking"])  # commands now check before heavy imports
def test_a_stop_signal_in_the_first_seconds_ends_in_one_line(tmp_path, sig, delay_s):
    """Ctrl-C or SIGTERM while the server imports and checks its config (before its own handlers): one line, exit 0."""
    process = subprocess.Popen([sys.executable, "-m", "wam_gym.serve", "EVALUATION.agent=python",
                                "EVALUATION.policy=serve_policies:make_slow", "SERVE.cameras=[cam]", "SERVE.port=0"],
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    anyio.run(anyio.sleep, delay_s)
    process.send_signal(sig)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines() == [f"wam_gym.serve: stopped by {signal.Signals(sig).name} before serving; no model "
                                        "worker was started"], err[-3000:]


# ----------------------------------------------------------------- the endpoint
def test_health_waits_for_the_model_and_the_api_key_gates_the_rest(tmp_path):
    gate = tmp_path / "gate"
    with serving(tmp_path, "EVALUATION.agent=python", "EVALUATION.policy=serve_policies:make_gated",
                 "SERVE.cameras=[cam]", "SERVE.api_key=s3cret", "SERVE.max_message_mb=0.01",
                 env={"WAM_TEST_GATE": str(gate)}, wait_ready=False) as (port, process, log):
        assert http(port, "/healthz") == (503, '{"status": "loading"}\n')  # the model worker waits for the gate
        gate.touch()
        while http(port, "/healthz")[0] != 200:  # the model worker loads once the gate is open
            assert process.poll() is None, log.read_text()
            anyio.run(anyio.sleep, 0.1)
        assert http(port, "/healthz")[0] == http(port, "/health")[0] == 200  # no key needed: a readiness probe
        assert http(port, "/stats")[0] == 401
        assert http(port, "/stats", {"Authorization": "Api-Key s3cret"})[0] == 200
        with pytest.raises(InvalidStatus, match="401"):
            connect(f"ws://127.0.0.1:{port}")
        with pytest.raises(InvalidStatus, match="401"):
            connect(f"ws://127.0.0.1:{port}", additional_headers={"Authorization": "Api-Key wrong"})
        obs = {"observation/image": np.zeros((8, 8, 3), np.uint8), "observation/state": np.ones(3, np.float32),
               "prompt": "x"}
        for ws in (connect(f"ws://127.0.0.1:{port}", additional_headers={"Authorization": "Api-Key s3cret"}),
                   connect(f"ws://127.0.0.1:{port}/?api_key=s3cret")):  # vla-eval's Connection sends no headers
            with ws:
                assert unpack(ws.recv())["model"]["EVALUATION.agent"] == "python"
                ws.send(pack_openpi(obs))
                np.testing.assert_array_equal(unpack(ws.recv())["actions"], 1 + np.arange(4, dtype=np.float32)[:, None]
                                              * np.ones(3, np.float32))
                ws.send(pack_openpi({**obs, "observation/image": np.zeros((64, 64, 3), np.uint8)}))  # 12 KB > 10 KB
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv()
                assert closed.value.rcvd.code == 1009  # message too big
        assert "serving beyond this machine" not in log.read_text()


def test_sigterm_answers_the_requests_in_flight_then_exits_leaving_no_process(tmp_path):
    with serving(tmp_path, "EVALUATION.agent=python", "EVALUATION.policy=serve_policies:make_slow",
                 "SERVE.cameras=[cam]", "SERVE.host=0.0.0.0", env={"WAM_TEST_DELAY_S": "2"}) as (port, process, log):
        children = psutil.Process(process.pid).children(recursive=True)
        assert children  # the model worker (and multiprocess's helpers)
        ws = connect(f"ws://127.0.0.1:{port}")
        ws.recv()
        ws.send(pack_openpi({"observation/image": np.zeros((8, 8, 3), np.uint8), "observation/state": np.ones(2),
                             "prompt": "x"}))
        while stats(port)["in_flight"] == 0:
            anyio.run(anyio.sleep, 0.05)
        process.send_signal(signal.SIGTERM)
        assert unpack(ws.recv(timeout=60))["actions"].shape == (4, 2)  # answered although the server is stopping
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd.code == 1001
        assert process.wait(timeout=60) == 0
        _, left = psutil.wait_procs(children, timeout=30)  # multiprocess's resource tracker exits on its own
        assert not left, [c.cmdline() for c in left]
        text = log.read_text()
        assert "SERVE.host=0.0.0.0: serving beyond this machine; anyone who can reach it may use the model" in text
        assert '"openpi_requests": 1' in text  # the final summary


def test_a_bad_config_is_one_error_line_before_any_worker_starts(tiny_ckpt):
    """The command line's errors (the in-process checks are cases of tests/test_bad_inputs.py)."""
    for overrides, message in ((["EVALUATION.agent=random"], "cannot be served"),
                               (["EVALUATION.num_trials=5"], "EVALUATION.num_trials is an evaluation knob"),
                               (["MULTIRUN.env_num_per_worker=4"], "MULTIRUN.env_num_per_worker is an evaluation knob"),
                               ([f"ckpt={tiny_ckpt}", "+SERVE.openpi_keys={pixels.wrist: image}"],
                                "SERVE.openpi_keys maps ['pixels.wrist'], which name no input of the model")):
        result = subprocess.run([sys.executable, "-m", "wam_gym.serve", *overrides], cwd=ROOT, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and message in last, last


def test_openpi_answers_carry_the_chunk_the_greeting_advertises(tiny_ckpt, tmp_path):
    """EVALUATION.action_horizon caps what a client is told and what it gets alike."""
    with serving(tmp_path, f"ckpt={tiny_ckpt}", f"EVALUATION.num_inference_steps={STEPS}",
                 "EVALUATION.action_horizon=5") as (port, _, _):
        with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
            assert unpack(ws.recv())["action_horizon"] == 5
            ws.send(pack_openpi(openpi_obs()))
            assert unpack(ws.recv())["actions"].shape == (5, 4)


# ----------------------------------------------------------------- our harness as a client
def evaluate(out: Path, tiny_ckpt, remote: dict | None = None, **evaluation) -> list:
    """Two short Meta-World reach episodes (seeds 3, 4) of ``evaluation``'s agent: their records."""
    from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
    from wam_gym.eval.manager import EvalManager
    from wam_gym.eval.results import ResultStore
    from wam_gym.remote.config import RemoteConfig

    cfg = EvalConfig(
        ckpt=str(tiny_ckpt) if evaluation["agent"] == "wam" else None,
        env_kwargs={"cameras": ["corner", "gripperPOV"], "image_size": [64, 64]},
        EVALUATION=EvaluationConfig(num_trials=2, seed=3, max_episode_steps=10, replan_steps=4, num_inference_steps=STEPS,
                                    output_dir=str(out), tensorboard=False, **evaluation),
        MULTIRUN=MultirunConfig(task_sets=["wam_gym/MetaWorld-reach-v3"], env_num_per_worker=2),
        REMOTE=RemoteConfig(**(remote or {})),
    )
    summary = EvalManager(cfg).run()
    assert summary["complete"] and summary["error"] is None
    return sorted(ResultStore(out).records(), key=lambda r: r.trial)


@pytest.fixture(scope="module")
def in_process_records(tiny_ckpt, tmp_path_factory) -> list:
    return evaluate(tmp_path_factory.mktemp("local"), tiny_ckpt, agent="wam")


@pytest.mark.parametrize("protocol", ["openpi", "vla-eval"])
def test_eval_of_the_served_model_equals_eval_in_process(wam_server, tiny_ckpt, in_process_records, tmp_path, protocol):
    """EVALUATION.agent=remote against wam_gym.serve runs the episodes that agent=wam runs with the
    checkpoint in-process: the same seeds reach the same sampling noise over the wire."""
    port, _ = wam_server
    remote = evaluate(tmp_path, tiny_ckpt, agent="remote", remote={"url": f"ws://127.0.0.1:{port}", "protocol": protocol})
    local = in_process_records
    assert [(r.trial, r.steps, r.success) for r in remote] == [(r.trial, r.steps, r.success) for r in local]
    np.testing.assert_allclose([r.reward for r in remote], [r.reward for r in local], rtol=1e-3)


def test_the_api_key_can_come_from_the_environment_and_stays_off_every_command_line(tmp_path):
    """SERVE.api_key=s3cret on the command line is readable by anyone on the machine (ps); OmegaConf's
    ${oc.env:...} reads it from the server's environment instead (issue 39, class 7): the key gates the
    server as before, and no process of the server's tree shows it in its argv or its log."""
    with serving(tmp_path, "EVALUATION.agent=python", "EVALUATION.policy=serve_policies:make_gated",
                 "SERVE.cameras=[cam]", "SERVE.api_key=${oc.env:WAM_GYM_API_KEY}",
                 env={"WAM_GYM_API_KEY": "s3cret", "WAM_TEST_GATE": str(tmp_path)}) as (port, process, log):
        assert http(port, "/stats")[0] == 401
        assert http(port, "/stats", {"Authorization": "Api-Key s3cret"})[0] == 200
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        assert len(tree) >= 2 and not any("s3cret" in " ".join(p.cmdline()) for p in tree)
    assert "s3cret" not in log.read_text()


def test_the_greeting_names_the_model_by_content(wam_server, tiny_ckpt):
    """Clients record what they were served (wam_gym.eval's agent=remote binds its episodes to it): the
    checkpoint's and statistics' content hashes and the settings that change actions, no paths."""
    from wam_gym.eval.run_protocol import checkpoint_fingerprint

    port, _ = wam_server
    with connect(f"ws://127.0.0.1:{port}", compression=None) as ws:
        model = unpack(ws.recv())["model"]
    assert model["ckpt"] == {"fingerprint": checkpoint_fingerprint(tiny_ckpt)}
    assert model["EVALUATION.agent"] == "wam" and model["EVALUATION.num_inference_steps"] == STEPS
    assert all("path" not in entry for entry in model.values() if isinstance(entry, dict))  # a copy is the same model


# ----------------------------------------------------------------- no client can starve the server (issue 39, class 3)
def _half_frame_client(port: int) -> socket.socket:
    """A raw TCP client that completes the WebSocket handshake, then sends half a frame and nothing more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    sock.sendall(b"\x82\x85\x01\x02")  # a masked binary frame of 5 bytes: its mask and payload never come
    return sock


def _closed(sock: socket.socket) -> bool:
    """Read until the server closes the TCP connection (its close frame first)."""
    while chunk := sock.recv(4096):
        pass
    return chunk == b""


def test_idle_and_half_frame_clients_are_closed_and_their_places_freed(tmp_path):
    with serving(tmp_path, "EVALUATION.agent=python", "EVALUATION.policy=serve_policies:make_slow",
                 "SERVE.cameras=[cam]", "SERVE.max_sessions=2", "SERVE.idle_timeout_s=1",
                 env={"WAM_TEST_DELAY_S": "0"}) as (port, _, _):
        silent = connect(f"ws://127.0.0.1:{port}", ping_interval=None)
        half = _half_frame_client(port)
        with pytest.raises(InvalidStatus, match="503"):  # both places taken
            connect(f"ws://127.0.0.1:{port}")
        unpack(silent.recv(timeout=30))  # the greeting, then nothing from this client
        with pytest.raises(ConnectionClosed) as closed:
            silent.recv(timeout=30)
        assert closed.value.rcvd.code == 1000 and "SERVE.idle_timeout_s" in closed.value.rcvd.reason
        assert _closed(half)
        with connect(f"ws://127.0.0.1:{port}") as ws:  # the places are free again
            assert unpack(ws.recv(timeout=30))["model"]["EVALUATION.agent"] == "python"
        assert stats(port)["closed_idle"] == 2


def test_the_session_cap_holds_while_the_model_loads_and_sigterm_stops_the_load(tmp_path):
    gate = tmp_path / "gate"  # never created: the model worker loads forever
    with serving(tmp_path, "EVALUATION.agent=python", "EVALUATION.policy=serve_policies:make_gated",
                 "SERVE.cameras=[cam]", "SERVE.max_sessions=2", env={"WAM_TEST_GATE": str(gate)},
                 wait_ready=False) as (port, process, log):
        children = psutil.Process(process.pid).children(recursive=True)
        waiting = [connect(f"ws://127.0.0.1:{port}") for _ in range(2)]  # admitted, greeted once the model loads
        with pytest.raises(InvalidStatus, match="503"):
            connect(f"ws://127.0.0.1:{port}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0  # the load is cancelled, not waited for
        for ws in waiting:
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
        _, left = psutil.wait_procs(children, timeout=30)
        assert not left, [c.cmdline() for c in left]
        assert "stop signal while the model workers load: cancelling their start" in log.read_text()
