"""Serving and remote evaluation (issue 50): no protection turned off by an empty or endless value, every
argument, path and port checked before a model loads, and every served policy handed only observations a WAM
would take."""

from __future__ import annotations

import socket

import numpy as np

from tests.bad_inputs import Case, Ctx

URL = "ws://localhost:8000"


# ----------------------------------------------------------------------------- triggers
def _serve_settings(**settings):
    from wam_gym.serve.config import ServeSettings

    return ServeSettings(**settings)


def api_key_from_empty_env(ctx: Ctx):
    """``SERVE.api_key=${oc.env:WAM_KEY}`` with ``WAM_KEY`` set to '' (unset is refused by OmegaConf)."""
    from omegaconf import OmegaConf

    from wam_gym.serve.config import ServeConfig

    ctx.monkeypatch.setenv("WAM_KEY", "")
    OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ServeConfig), {"SERVE": {"api_key": "${oc.env:WAM_KEY}"}}))


def api_key_with_newline(ctx: Ctx):
    """``SERVE.api_key`` read from a key file with its trailing newline."""
    _serve_settings(api_key="s3cret\n")


def host_empty(ctx: Ctx):
    """``SERVE.host=''``: the OS binds every interface."""
    _serve_settings(host="")


def _eval_remote(ctx: Ctx, run: bool = False, **remote):
    """EVALUATION.agent=remote with these REMOTE.* knobs."""
    from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
    from wam_gym.eval.manager import EvalManager
    from wam_gym.remote.config import RemoteConfig

    manager = EvalManager(EvalConfig(
        EVALUATION=EvaluationConfig(agent="remote", output_dir=str(ctx.tmp / "out"), tensorboard=False),
        MULTIRUN=MultirunConfig(task_sets=["wam_gym/MetaWorld-reach-v3"]), REMOTE=RemoteConfig(**{"url": URL, **remote})))
    if run:
        manager.run()


def remote_api_key_empty(ctx: Ctx):
    """``REMOTE.api_key=''`` (an environment variable set to '')."""
    _eval_remote(ctx, api_key="")


def nothing_listens(ctx: Ctx):
    """``EVALUATION.agent=remote`` against a port where nothing listens (the reconnect budget is 300 s)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nobody listens there
    _eval_remote(ctx, run=True, url=f"ws://127.0.0.1:{port}")
    assert not (ctx.tmp / "out").exists()  # refused before the output dir was made


def url_without_port(ctx: Ctx):
    """``REMOTE.url=ws://localhost``: websockets would try port 80."""
    _eval_remote(ctx, url="ws://localhost")


def url_port_zero(ctx: Ctx):
    """``REMOTE.url=ws://localhost:0``."""
    _eval_remote(ctx, url="ws://localhost:0")


def _python_server(**settings):
    """``python -m wam_gym.serve EVALUATION.agent=python``'s server, built (no model worker started)."""
    from wam_gym.model_call import ModelCallConfig
    from wam_gym.serve.__main__ import build_server
    from wam_gym.serve.config import ServeConfig, ServeSettings

    evaluation = ModelCallConfig(agent="python", policy="tests.example_policy:make_policy")
    return build_server(ServeConfig(EVALUATION=evaluation, SERVE=ServeSettings(**{"cameras": ["cam"], **settings})))


def port_taken(ctx: Ctx):
    """``SERVE.port`` where another process already listens."""
    import asyncio

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = _python_server(port=taken.getsockname()[1])
        asyncio.run(server.run())  # refused while binding, before the model workers start


def port_file_is_a_dir(ctx: Ctx):
    """``SERVE.port_file`` naming a directory (checked before the model loads, not when it is written)."""
    _serve_settings(port_file=str(ctx.tmp))


def port_file_folder_missing(ctx: Ctx):
    """``SERVE.port_file=run/port`` where ``run/`` does not exist."""
    _serve_settings(port_file=str(ctx.tmp / "run" / "port"))


def port_file_holds_data(ctx: Ctx):
    """``SERVE.port_file=notes.txt``, a file of the user's (it would be written over with a port)."""
    (ctx.tmp / "notes.txt").write_text("my notes\n")
    _serve_settings(port_file=str(ctx.tmp / "notes.txt"))


def duplicate_cameras(ctx: Ctx):
    """``EVALUATION.agent=python 'SERVE.cameras=[cam, cam]'``."""
    _python_server(cameras=["cam", "cam"])


def empty_wire_key(ctx: Ctx):
    """``'SERVE.openpi_keys={state: ""}'``: no client key can be ''."""
    _python_server(openpi_keys={"state": ""}).keys  # noqa: B018 - the key map is built with the server


def _wam_server(ctx: Ctx, evaluation: dict | None = None, **settings):
    """``python -m wam_gym.serve ckpt=...`` of a copy of the tiny checkpoint with statistics."""
    from tests.test_bad_inputs import checkpoint_copy, identity_stats
    from wam_gym.model_call import ModelCallConfig
    from wam_gym.serve.__main__ import build_server
    from wam_gym.serve.config import ServeConfig, ServeSettings

    ckpt = checkpoint_copy(ctx)
    identity_stats(ckpt / "dataset_stats.json")
    return build_server(ServeConfig(ckpt=str(ckpt), EVALUATION=ModelCallConfig(**(evaluation or {})),
                                    SERVE=ServeSettings(**settings)))


def ckpt_is_a_file(ctx: Ctx):
    """``ckpt=`` the checkpoint's wam_config.json rather than its folder."""
    from wam_gym.model_call import ModelCallConfig
    from wam_gym.serve.__main__ import build_server
    from wam_gym.serve.config import ServeConfig

    config_file = ctx.tmp / "ckpt" / "wam_config.json"
    config_file.parent.mkdir()
    config_file.write_text("{}")
    build_server(ServeConfig(ckpt=str(config_file), EVALUATION=ModelCallConfig()))


def stats_path_is_a_dir(ctx: Ctx):
    """``EVALUATION.dataset_stats_path=`` a dataset's root folder."""
    _wam_server(ctx, {"dataset_stats_path": str(ctx.tmp)})


def cameras_not_the_checkpoints(ctx: Ctx):
    """``'SERVE.cameras=[front]'`` for a checkpoint trained on corner and gripperPOV."""
    _wam_server(ctx, cameras=["front"])


def _served(frame: dict, protocol: str = "openpi"):
    """The server's one check of a client's observation, for every served agent (python and wam)."""
    from wam_gym.remote.keymap import key_map, to_contract
    from wam_gym.serve.server import KNOBS

    to_contract(frame, key_map(protocol, ("cam",), None, KNOBS[protocol]), KNOBS[protocol])


def _openpi_obs(**changes) -> dict:
    return {"observation/image": np.zeros((8, 8, 3), np.uint8), "observation/state": np.ones(3, np.float32),
            "prompt": "reach", **changes}


def state_inf(ctx: Ctx):
    """An openpi observation whose state holds inf, to a served python policy."""
    _served(_openpi_obs(**{"observation/state": np.array([0, np.inf, 0], np.float32)}))


def state_nan_vla_eval(ctx: Ctx):
    """A vla-eval observation whose ``states`` hold NaN."""
    _served({"images": {"cam": np.zeros((8, 8, 3), np.uint8)}, "states": np.array([np.nan, 0.0]),
             "task_description": "reach"}, "vla-eval")


def image_empty(ctx: Ctx):
    """An openpi observation whose image is 0x0."""
    _served(_openpi_obs(**{"observation/image": np.zeros((0, 0, 3), np.uint8)}))


def image_zero_wide(ctx: Ctx):
    """An openpi observation whose image is 8 rows of no pixels."""
    _served(_openpi_obs(**{"observation/image": np.zeros((8, 0, 3), np.uint8)}))


def _range(group: str, **knob):
    """A config built with one knob set (checked by its ranges)."""
    from wam_gym.eval.config import EvaluationConfig
    from wam_gym.remote.config import RemoteConfig

    {"EVALUATION": EvaluationConfig, "REMOTE": RemoteConfig}.get(group, _serve_settings)(**knob)


# ----------------------------------------------------------------------------- the cases
def cases() -> list[Case]:
    from agents.wam.checkpoint import MissingCheckpointError
    from wam_gym.eval.errors import EvalError
    from wam_gym.remote.keymap import ObservationError

    to_null = r"set it to a key, or to null to serve without one on purpose"
    return [
        # --- no protection turned off by an empty, zero or endless value
        Case("serve-api-key-empty-env", api_key_from_empty_env, ValueError,
             r"^SERVE\.api_key is empty \(an environment variable set to ''\?\), which would serve without "
             r"authentication: " + to_null),
        Case("serve-api-key-blank", lambda ctx: _serve_settings(api_key="  "), ValueError,
             r"^SERVE\.api_key is empty .*" + to_null),
        Case("serve-api-key-newline", api_key_with_newline, ValueError,
             r"^SERVE\.api_key has surrounding whitespace or a control character .*: strip it"),
        Case("serve-host-empty", host_empty, ValueError,
             r"^SERVE\.host is empty, which listens on every interface: set SERVE\.host=127\.0\.0\.1 .* or "
             r"SERVE\.host=0\.0\.0\.0 to serve beyond it on purpose"),
        Case("serve-max-message-unbounded", lambda ctx: _serve_settings(max_message_mb=1e9), ValueError,
             r"^SERVE\.max_message_mb must be in \(0, 1024\] \(megabytes\), got 1000000000\.0"),
        Case("serve-idle-timeout-endless", lambda ctx: _serve_settings(idle_timeout_s=1e12), ValueError,
             r"^SERVE\.idle_timeout_s must be in \(0, 86400\] \(seconds\) or null \(off\)"),
        Case("serve-ping-timeout-endless", lambda ctx: _serve_settings(ping_timeout_s=1e9), ValueError,
             r"^SERVE\.ping_timeout_s must be in \(0, 86400\] \(seconds\)"),
        Case("eval-remote-api-key-empty", remote_api_key_empty, ValueError,
             r"^REMOTE\.api_key is empty .*: set it to the server's key, or to null to send none"),
        Case("eval-remote-timeout-endless", lambda ctx: _range("REMOTE", timeout_s=1e9), ValueError,
             r"^REMOTE\.timeout_s must be in \(0, 86400\] \(seconds\)"),
        Case("eval-stall-endless", lambda ctx: _range("EVALUATION", actor_stall_s=1e9), ValueError,
             r"^EVALUATION\.actor_stall_s must be in \(0, 86400\] \(seconds\) or null \(off\)"),
        # --- remote evaluation: refused in seconds, before the output dir
        Case("eval-remote-nothing-listens", nothing_listens, EvalError,
             r"^nothing answers at REMOTE\.url=ws://127\.0\.0\.1:\d+ \(.*\): start the policy server there "
             r"\(python -m wam_gym\.serve \.\.\.\), or set REMOTE\.url to where it listens; nothing was run"),
        Case("eval-remote-url-without-port", url_without_port, ValueError,
             r"^REMOTE\.url='ws://localhost' names no port: write it as ws://localhost:PORT"),
        Case("eval-remote-url-port-zero", url_port_zero, ValueError,
             r"^REMOTE\.url='ws://localhost:0' names port 0, which no server listens on: write it as "
             r"ws://localhost:PORT"),
        # --- the server's arguments, paths and port, before a model worker starts
        Case("serve-port-taken", port_taken, OSError,
             r"^cannot listen on SERVE\.host=127\.0\.0\.1 SERVE\.port=\d+ \(address already in use\): stop what "
             r"listens there, or pick another SERVE\.port \(0: any free one\)"),
        Case("serve-port-file-is-a-dir", port_file_is_a_dir, ValueError,
             r"^SERVE\.port_file=\S+ is a directory: name a file in it \(SERVE\.port_file=\S+/port\)"),
        Case("serve-port-file-folder-missing", port_file_folder_missing, ValueError,
             r"^SERVE\.port_file=\S+/run/port: its folder \S+/run does not exist; create it"),
        Case("serve-port-file-not-a-port", port_file_holds_data, ValueError,
             r"^SERVE\.port_file=\S+/notes\.txt exists and holds something other than a port: name a new file"),
        Case("serve-python-cameras-duplicate", duplicate_cameras, ValueError,
             r"^SERVE\.cameras=\['cam', 'cam'\]: name each camera your policy takes once, none empty"),
        Case("serve-key-map-empty-key", empty_wire_key, ValueError,
             r"^SERVE\.openpi_keys\.state='': give the wire key clients use for it, a non-empty string"),
        Case("serve-ckpt-is-a-file", ckpt_is_a_file, MissingCheckpointError,
             r"^ckpt=\S+/wam_config\.json is a file; pass the checkpoint directory python -m training saved "
             r"\(ckpt=\S+/ckpt\)"),
        Case("serve-stats-path-is-a-dir", stats_path_is_a_dir, ValueError,
             r"^EVALUATION\.dataset_stats_path=\S+ is a directory: point it at the statistics file, the training "
             r"dataset's meta/stats\.json"),
        Case("serve-cameras-not-the-checkpoints", cameras_not_the_checkpoints, ValueError,
             r"^SERVE\.cameras=\['front'\] are not the checkpoint's cameras \['corner', 'gripperPOV'\]: drop "
             r"SERVE\.cameras \(the checkpoint's are served\), or list exactly those"),
        # --- every served policy's observations, checked once by the server
        Case("serve-python-obs-state-inf", state_inf, ObservationError,
             r"^'observation/state': the observation's state holds NaN/inf \(dimensions \[1\]\), as the env or client "
             r"sent it: the model was not called\. Check .* what the client sends"),
        Case("serve-python-obs-state-nan-vla-eval", state_nan_vla_eval, ObservationError,
             r"^'states': the observation's state holds NaN/inf \(dimensions \[0\]\)"),
        Case("serve-python-obs-image-empty", image_empty, ObservationError,
             r"^'observation/image' \(camera cam\) is an empty image \(0, 0, 3\): send frames of H, W >= 1"),
        Case("serve-python-obs-image-zero-wide", image_zero_wide, ObservationError,
             r"^'observation/image' \(camera cam\) is an empty image \(8, 0, 3\): send frames of H, W >= 1"),
    ]

