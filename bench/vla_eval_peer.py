"""The stand-in workload (bench/standin.py) served by vla-eval's own batching model server.

``standin_vla_eval`` mirrors ``broker.standin_broker``: the same N actor processes running
``standin.run_actor``, the same model cost L(b) = a + c*b (a sleep), the same window; only the
serving path differs. Here it is vla-eval 0.8's, unmodified:

- the model: ``SleepServer``, a ``vla_eval.model_servers.predict.PredictModelServer`` whose
  ``predict_batch`` sleeps L(b) for a batch of b observations and answers zero chunks of R actions,
  with ``chunk_size=R`` (vla-eval keeps each session's chunk and answers the next R-1 observations
  from it without a model call), ``max_batch_size=B`` and ``max_wait_time=wait_ms / 1000``
  (vla-eval's unit is seconds). Its dispatch loop is vla-eval's: the first request of an idle
  server is dispatched at once; after each call it waits up to ``max_wait_time`` for a full batch.
- the server: ``vla_eval.model_servers.serve.serve_async`` on 127.0.0.1 (a free port, port 0,
  reported by serve_async itself), one spawned process per model worker. vla-eval has no way to
  put several model replicas behind one port: a model server is one process on one GPU, its
  config has one ``server.url``, and its parallelism is episode *sharding* (many client processes
  against that one URL) times batching in the server. So W = workload.workers servers on W ports,
  actor i talks to server i % W (round robin), as one would launch W vla-eval servers by hand.
  Each server is polled on vla-eval's ``GET /health`` before any actor starts, and stopped by
  cancelling serve_async's task group (its connections close, the process exits).
- the client: vla-eval's own ``vla_eval.connection.Connection`` (HELLO handshake in ``connect``,
  ``start_episode`` = EPISODE_START, ``act`` = OBSERVATION -> ACTION, ``end_episode``), as
  ``SyncEpisodeRunner`` uses it: one ``act`` per env step. Connection is async (anyio), so each
  actor process runs it on an anyio blocking portal (an event loop in a thread) and ``run_actor``'s
  sync ``act`` calls ``portal.call(conn.act, ...)``. The observation row goes out under vla-eval's
  keys (wam_gym.remote.keymap's defaults: ``images.<camera>``, ``state``, ``task_description``).

Images travel raw by default (``image_format="raw"``): the stand-in measures scheduling, and the
broker ships raw arrays too. vla-eval's own default is PNG (``numpy_codec._image_format``), which
costs ~9 ms of client CPU per 224x224 noise image: pass ``image_format="png"`` to see that.

Fairness: vla-eval's protocol sends an observation, and gets an action back over the WebSocket,
on *every* env step (R round trips per model call, each one msgpack-encoding the images), while
our actors send one request per R steps. That is how vla-eval works, so it is part of what is
measured, but it is transport cost, not batching quality.
"""

from __future__ import annotations

import json
import time
import urllib.request

import numpy as np

SERVER_START_S = 60.0  # a spawned server: import vla_eval, bind, answer /health


def _to_wire(obs: dict) -> dict:
    """One row of the workload's batch-of-one observation -> vla-eval's keys (wam_gym.remote.keymap)."""
    from envs.protocol import INSTRUCTION, PIXELS, STATE
    from wam_gym.remote.keymap import default_keys, to_wire
    from wam_gym.remote.wire import VLA_EVAL

    row = {PIXELS: {cam: image[0] for cam, image in obs[PIXELS].items()}, STATE: obs[STATE][0],
           INSTRUCTION: obs[INSTRUCTION][0]}
    return to_wire(row, default_keys(VLA_EVAL, list(obs[PIXELS])))


def _sleep_server_class():
    """Defined lazily so importing this module does not import vla_eval (the parent never needs it)."""
    from standin import ACTION_DIM, STATE_DIM
    from vla_eval.model_servers.predict import PredictModelServer

    class SleepServer(PredictModelServer):
        """predict_batch on b observations sleeps L(b) and answers b zero chunks of R actions."""

        def __init__(self, workload, wait_ms: float):
            super().__init__(chunk_size=workload.replan_steps, max_batch_size=workload.batch_size,
                             max_wait_time=wait_ms / 1000.0)
            self.workload = workload
            self.cameras = {f"cam{k}" for k in range(workload.cameras)}
            self.observations = 0
            self.batch_sizes: list[int] = []
            self.queue_wait_s: list[float] = []
            self.model_s: list[float] = []

        async def on_observation(self, obs, ctx):
            self.observations += 1
            obs["_arrived"] = time.monotonic()  # decoded; buffered or queued for a batch from here on
            await super().on_observation(obs, ctx)

        def predict_batch(self, obs_batch, ctx_batch):
            start = time.monotonic()
            for obs in obs_batch:
                self.queue_wait_s.append(start - obs.pop("_arrived"))
                assert set(obs["images"]) == self.cameras and np.shape(obs["state"]) == (STATE_DIM,), obs.keys()
                assert isinstance(obs["task_description"], str)
            b = len(obs_batch)
            time.sleep(self.workload.model_s(b))
            self.batch_sizes.append(b)
            self.model_s.append(time.monotonic() - start)
            chunk = np.zeros((self.workload.replan_steps, ACTION_DIM), np.float32)
            return [{"actions": chunk} for _ in obs_batch]

        def stats(self) -> dict:
            return {"observations": self.observations, "batch_sizes": self.batch_sizes,
                    "queue_wait_s": self.queue_wait_s, "model_s": self.model_s}

    return SleepServer


def _serve(workload, wait_ms: float, control) -> None:
    """A process entry point: one vla-eval model server on 127.0.0.1. Sends its port on ``control``,
    serves until anything arrives on ``control`` (or it closes), then sends back its stats."""
    import anyio
    from vla_eval.model_servers.serve import serve_async

    server = _sleep_server_class()(workload, wait_ms)

    def wait_for_stop() -> None:
        try:
            control.recv()
        except (EOFError, OSError):
            pass

    async def main() -> None:
        async with anyio.create_task_group() as group:
            port = await group.start(serve_async, server, "127.0.0.1", 0)
            control.send(port)
            await anyio.to_thread.run_sync(wait_for_stop)
            group.cancel_scope.cancel()

    anyio.run(main)
    try:
        control.send(server.stats())
    except (EOFError, OSError):
        pass


def _actor(url: str, workload, seed: int, control, image_format: str) -> None:
    """A process entry point: ``run_actor`` whose every step is one ``Connection.act`` (vla-eval's client)."""
    from anyio.from_thread import start_blocking_portal
    from standin import ACTION_DIM, run_actor
    from vla_eval.connection import Connection
    from vla_eval.protocol.numpy_codec import set_image_format

    set_image_format(image_format)  # how vla-eval's client encodes HWC uint8 arrays (module-wide)
    with start_blocking_portal() as portal:
        conn = Connection(url, timeout=60.0)
        portal.call(conn.connect)
        portal.call(conn.start_episode, {"task": {"name": "standin"}, "seed": seed})

        def act(obs, step):
            action = portal.call(conn.act, _to_wire(obs))
            assert np.shape(action["actions"]) == (ACTION_DIM,), action

        try:
            run_actor(act, workload, seed, control)
            portal.call(conn.end_episode, {"metrics": {}})
        finally:
            portal.call(conn.close)


def _wait_healthy(port: int, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if json.loads(response.read()).get("status") == "ok":
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _summary(stats: list[dict]) -> dict:
    from wam_gym.utils.stats import percentile

    sizes = [b for s in stats for b in s["batch_sizes"]]
    waits = [w for s in stats for w in s["queue_wait_s"]]
    model = [m for s in stats for m in s["model_s"]]

    def pct(values, q):
        return 1000 * percentile(values, q)

    return {
        "batches": len(sizes),
        "requests": sum(sizes),  # observations that reached the model (one per R steps per actor)
        "observations": sum(s["observations"] for s in stats),  # WebSocket round trips (one per step)
        "mean_batch_size": sum(sizes) / len(sizes) if sizes else 0.0,
        "queue_wait_ms_p50": pct(waits, 50),
        "queue_wait_ms_p95": pct(waits, 95),
        "model_ms_p50": pct(model, 50),
        "model_ms_p95": pct(model, 95),
    }


def standin_vla_eval(workload, window, wait_ms: float, image_format: str = "raw") -> tuple[float, dict]:
    """Env-steps/s of ``workload`` through vla-eval's batching model server: W server processes
    (one per model worker, actors round robin over them), N actor processes with vla-eval's
    ``Connection``. Returns (env-steps/s in the window, stats summed over the servers' whole run)."""
    import multiprocess

    ctx = multiprocess.get_context("spawn")
    servers, server_controls, actors = [], [], []
    stats: list[dict] = []
    try:
        for _ in range(workload.workers):
            ours, theirs = ctx.Pipe()
            servers.append(ctx.Process(target=_serve, args=(workload, wait_ms, theirs), daemon=True))
            servers[-1].start()
            theirs.close()
            server_controls.append(ours)
        deadline = time.monotonic() + SERVER_START_S
        ports = []
        for control in server_controls:
            if not control.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"a vla-eval server did not bind within {SERVER_START_S:g} s")
            ports.append(control.recv())
        for port in ports:
            _wait_healthy(port, deadline)

        controls = []
        for i in range(workload.actors):
            url = f"ws://127.0.0.1:{ports[i % len(ports)]}"
            ours, theirs = ctx.Pipe()
            actors.append(ctx.Process(target=_actor, args=(url, workload, i, theirs, image_format), daemon=True))
            actors[-1].start()
            theirs.close()
            controls.append(ours)
        for control in controls:
            control.recv()  # "ready": spawned, imported, connected, episode started
        start, stop = window.times()
        for control in controls:
            control.send((start, stop))
        runs = [control.recv() for control in controls]
        for actor in actors:
            actor.join(timeout=10)
        rate = window.rate(start, runs)
    finally:
        for actor in actors:
            if actor.is_alive():
                actor.terminate()
                actor.join(timeout=5)
        for control in server_controls:
            try:
                control.send("stop")
            except (EOFError, OSError):
                pass
        for control in server_controls:
            try:
                if control.poll(10):
                    stats.append(control.recv())
            except (EOFError, OSError):
                pass
        for server in servers:
            server.join(timeout=10)
            if server.is_alive():
                server.terminate()
                server.join(timeout=5)
    return rate, _summary(stats)
