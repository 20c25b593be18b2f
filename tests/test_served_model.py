"""What a served model sees and what the server says of it: frames reach the model upright whichever way
its client turned them (wam_gym/serve/frames.py), the greeting says what the model expects and nothing
private, and a checkpoint made for a protocol is served by it.

Random images cannot catch a mirrored frame: these send one bright marker in a known corner, and the
served MarkerPolicy (tests/serve_policies.py) answers where it arrived. The LIBERO venv's tests do the
same with LIBERO's real frames through openpi's and vla-eval's own preprocessing
(tests/suites/test_libero.py).
"""

from __future__ import annotations

import json

import anyio
import numpy as np
import pytest
from vla_eval.connection import Connection
from vla_eval.protocol.messages import MessageType
from websockets.sync.client import connect

from envs.orientation import ORIENTATIONS, UPRIGHT, reorient, to_upright
from tests.test_serve import serving, stats
from wam_gym.remote.wire import pack_openpi, unpack
from wam_gym.serve.frames import ClientFrames, vla_eval_suite

SIZE = 16
TOP_LEFT = [0.0, 0.0, 0.0, 0.0]  # MarkerPolicy: (row / H, col / W) of each camera's marker
LIBERO_BENCHMARK = "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark"
ROBOCASA_BENCHMARK = "vla_eval.benchmarks.robocasa.benchmark:RoboCasaBenchmark"


def marked(orientation: str = UPRIGHT) -> np.ndarray:
    """A black frame whose only bright pixel is at the upright frame's top left, turned ``orientation``."""
    upright = np.zeros((SIZE, SIZE, 3), np.uint8)
    upright[0, 0] = 255
    return np.ascontiguousarray(reorient(upright, UPRIGHT, orientation))


def test_each_orientation_moves_the_marker_and_turns_back():
    corner = {"upright": (0, 0), "mirrored": (0, SIZE - 1), "upside_down": (SIZE - 1, 0),
              "rotated_180": (SIZE - 1, SIZE - 1)}
    for source in ORIENTATIONS:
        frame = marked(source)
        assert np.unravel_index(frame.sum(-1).argmax(), frame.shape[:2]) == corner[source]
        assert np.array_equal(to_upright(frame, source), marked())
        for target in ORIENTATIONS:  # any to any, with the batch axis in front
            batch = reorient(frame[None], source, target)
            assert np.array_equal(batch[0], marked(target))


def test_what_each_client_is_taken_to_send():
    assert vla_eval_suite(LIBERO_BENCHMARK) == vla_eval_suite("vla_eval.benchmarks.libero_pro.benchmark:X") == "libero"
    assert vla_eval_suite(ROBOCASA_BENCHMARK) == "robocasa"
    assert vla_eval_suite("vla_eval.benchmarks.calvin.benchmark:CALVINBenchmark") is None
    assert vla_eval_suite(None) is None and vla_eval_suite("my.benchmark:Mine") is None
    libero_model = ClientFrames("auto", "libero")
    assert libero_model.default().orientation == "mirrored"  # openpi's LIBERO example
    assert libero_model.for_benchmark(LIBERO_BENCHMARK).orientation == "mirrored"
    assert libero_model.for_benchmark(ROBOCASA_BENCHMARK).orientation == "upright"  # it flips RoboCasa's upright
    assert libero_model.for_benchmark("my.benchmark:Mine").orientation == "mirrored"  # unknown: the model's suite
    unknown = ClientFrames("auto", None)
    assert unknown.default().orientation == "upright" and "SERVE.suite" in unknown.default().because
    assert unknown.for_benchmark(LIBERO_BENCHMARK).orientation == "mirrored"
    assert ClientFrames("upside_down", "libero").for_benchmark(LIBERO_BENCHMARK).orientation == "upside_down"


# ----------------------------------------------------------------- through a real server
def openpi_marker(port: int, orientation: str, declare: bool = False) -> list[float]:
    """One openpi observation whose frames are turned ``orientation`` (said so when ``declare``): where the
    model found the marker."""
    obs = {"observation/image": marked(orientation), "observation/wrist_image": marked(orientation),
           "observation/state": np.zeros(8, np.float32), "prompt": "pick"}
    if declare:
        obs["image_orientation"] = orientation
    with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
        ws.recv()
        ws.send(pack_openpi(obs))
        answer = unpack(ws.recv())
    return np.asarray(answer["actions"])[0].tolist()


def vla_eval_marker(port: int, benchmark: str | None, orientation: str, observations: int = 1) -> list[float]:
    """vla-eval's own Connection, its HELLO naming ``benchmark``, one episode of ``observations`` observations
    turned ``orientation``: the last action."""
    async def ask() -> list[float]:
        conn = Connection(f"ws://127.0.0.1:{port}", timeout=120)
        await conn.connect(benchmark=benchmark)  # as its runner connects (vla_eval.orchestrator)
        try:
            await conn.start_episode({"name": "pick"})
            obs = {"images": {"agentview": marked(orientation), "wrist": marked(orientation)},
                   "states": np.zeros(8, np.float32), "task_description": "pick"}
            for _ in range(observations):
                action = await conn.act(obs)
            await conn.end_episode({"success": False})
            return np.asarray(action["actions"]).tolist()
        finally:
            await conn.close()

    return anyio.run(ask)


@pytest.fixture(scope="module")
def libero_marker_server(tmp_path_factory):
    """MarkerPolicy served as a LIBERO model (SERVE.suite=libero): clients that say nothing are taken to send
    what the field's LIBERO drivers send."""
    with serving(tmp_path_factory.mktemp("frames"), "EVALUATION.agent=python",
                 "EVALUATION.policy=serve_policies:make_marker", "SERVE.cameras=[agentview,robot0_eye_in_hand]",
                 "SERVE.suite=libero") as (port, _, log):
        yield port, log


def test_a_libero_driver_frame_reaches_the_model_upright(libero_marker_server):
    port, log = libero_marker_server
    before = stats(port)["frames"]
    assert openpi_marker(port, "mirrored") == TOP_LEFT  # openpi's LIBERO example: mirrored, says nothing
    assert vla_eval_marker(port, LIBERO_BENCHMARK, "mirrored") == TOP_LEFT  # vla-eval's runner names LIBERO
    assert vla_eval_marker(port, ROBOCASA_BENCHMARK, "upright") == TOP_LEFT  # its RoboCasa frames are upright
    assert openpi_marker(port, "upside_down", declare=True) == TOP_LEFT  # a client that says how wins
    after = stats(port)["frames"]
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert grew == {"mirrored": 2, "upright": 1, "upside_down": 1}
    assert "frames taken as mirrored (the served model's suite is libero" in log.read_text()


def test_the_greeting_says_what_the_model_expects_and_no_path(libero_marker_server):
    port, _ = libero_marker_server
    with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
        raw = ws.recv()
    greeting = unpack(raw)
    assert greeting["frames"]["expected"] == "mirrored" and greeting["frames"]["declare_with"] == "image_orientation"
    assert greeting["suite"] == "libero" and greeting["cameras"] == ["agentview", "robot0_eye_in_hand"]
    assert "axis-angle" in greeting["state"]["layout"]
    assert greeting["model"]["name"] == "serve_policies:make_marker" and len(greeting["model"]["fingerprint"]) == 64
    assert (greeting["action_horizon"], greeting["replan_steps"]) == (4, 4)
    assert greeting["payload"]["frames"] == greeting["frames"]  # vla-eval reads the same in its HELLO
    assert b"/tmp/" not in raw and b"/work/" not in raw and "checkpoint" not in greeting


def test_a_server_told_its_clients_frames_takes_them_so(tmp_path):
    with serving(tmp_path, "EVALUATION.agent=python", "EVALUATION.policy=serve_policies:make_marker",
                 "SERVE.cameras=[agentview,robot0_eye_in_hand]", "SERVE.suite=libero",
                 "SERVE.client_frames=upright") as (port, _, _):
        assert openpi_marker(port, "upright") == TOP_LEFT
        assert vla_eval_marker(port, LIBERO_BENCHMARK, "upright") == TOP_LEFT


def test_our_remote_client_sends_as_the_drivers_do_and_says_so(libero_marker_server):
    """EVALUATION.agent=remote's client on a LIBERO task: mirrored on the wire, like openpi's and vla-eval's
    LIBERO clients (any server trained on the field's frames reads them right), and said so."""
    from wam_gym.remote import RemotePolicy, RemoteSettings

    port, _ = libero_marker_server
    row = {"pixels": {"agentview": marked(), "robot0_eye_in_hand": marked()}, "state": np.zeros(8, np.float32),
           "instruction": "pick"}
    for protocol in ("openpi", "vla-eval"):
        policy = RemotePolicy(RemoteSettings(f"ws://127.0.0.1:{port}", protocol, frames={"t": "mirrored"}))
        try:
            policy.begin_episode(0, "t")
            assert policy.predict_row(row).actions[0].tolist() == TOP_LEFT
        finally:
            policy.close()


def test_a_bad_orientation_is_refused_in_one_line(libero_marker_server):
    port, _ = libero_marker_server
    obs = {"observation/image": marked(), "observation/wrist_image": marked(),
           "observation/state": np.zeros(8, np.float32), "prompt": "pick", "image_orientation": "sideways"}
    with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
        ws.recv()
        ws.send(pack_openpi(obs))
        error = ws.recv()
    assert isinstance(error, str) and "image_orientation='sideways' is not a frame orientation" in error
    assert "\n" not in error.strip()


def test_the_greeting_reads_as_json(libero_marker_server):
    """Every client gets plain data: msgpack maps, strings and numbers, no numpy types."""
    port, _ = libero_marker_server
    with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
        greeting = unpack(ws.recv())
    json.dumps(greeting)
    assert greeting["type"] == MessageType.HELLO.value


def test_an_evaluation_sends_each_task_as_its_suites_drivers_do():
    from wam_gym.eval.tasks import Task
    from wam_gym.remote import RemoteSettings
    from wam_gym.remote.config import RemoteConfig

    tasks = [Task("spatial", "wam_gym/LIBERO-Spatial-v0"), Task("reach", "wam_gym/MetaWorld-reach-v3")]
    remote = RemoteConfig(url="ws://127.0.0.1:1")
    assert RemoteSettings.from_config(remote, tasks).frames == {"spatial": "mirrored", "reach": "upright"}
    remote = RemoteConfig(url="ws://127.0.0.1:1", frames="upright")
    assert RemoteSettings.from_config(remote, tasks).frames == {"spatial": "upright", "reach": "upright"}
    with pytest.raises(ValueError, match="REMOTE.frames='sideways' is not a frame orientation"):
        RemoteConfig(url="ws://127.0.0.1:1", frames="sideways")


# ----------------------------------------------------------------- a checkpoint made for a protocol
def test_a_fastwam_libero_checkpoint_is_served_by_its_protocol(tmp_path):
    """FastWAM's LIBERO release replans every 10 of its 32 actions and denoises 10 steps (wam_gym/eval/protocols.py):
    the server does so without being told; the greeting says so; a knob the user sets still wins."""
    from tests.conftest import load_script

    ckpt = load_script("tiny_fastwam_checkpoint").make(tmp_path / "fastwam")
    with serving(tmp_path, f"ckpt={ckpt}") as (port, _, log):
        with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
            greeting = unpack(ws.recv())
        assert greeting["protocol"] == "fastwam_libero" and greeting["suite"] == "libero"
        assert (greeting["action_horizon"], greeting["replan_steps"]) == (32, 10)
        assert greeting["frames"]["expected"] == "mirrored" and greeting["frames"]["model_convention"] == "fastwam_libero"
        assert greeting["model"]["name"] == "fastwam" and greeting["model"]["EVALUATION.num_inference_steps"] == 10
        before = stats(port)["broker"]["requests"]
        vla_eval_marker(port, LIBERO_BENCHMARK, "mirrored", observations=11)  # chunks at the 1st and the 11th
        assert stats(port)["broker"]["requests"] - before == 2
        assert "serving by the fastwam_libero protocol: replan_steps=10" in log.read_text()
    with serving(tmp_path, f"ckpt={ckpt}", "EVALUATION.replan_steps=5") as (port, _, log):
        with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
            assert unpack(ws.recv())["replan_steps"] == 5
        assert "EVALUATION.replan_steps=5 departs from fastwam_libero's 10" in log.read_text()
