"""The policy server: one WebSocket port, the openpi and vla-eval protocols, one inference broker.

    clients (openpi-client, vla-eval, our EVALUATION.agent=remote) --WebSocket--> asyncio loop
        one Session per connection, its frames handled in order on a thread of their own
            --> the session's BrokerClient --> InferenceBroker (dynamic batches) --> model workers

Requests of every connection meet in the same broker, so they are batched together across
model workers and GPUs. Each connection opens with one greeting frame that is both openpi's
metadata dict and vla-eval's HELLO reply (wam_gym/remote/wire.py), so the port needs no protocol
setting; the first frame a client sends says which protocol the connection speaks.

- openpi: an observation in, ``{"actions": (H, A), "server_timing": {...}}`` out, H the greeting's
  ``action_horizon`` (EVALUATION.action_horizon, else the model's chunk) (plus
  ``video`` when EVALUATION.visualize_future_video is set). An optional ``noise_seed`` int seeds
  that call's sampling. A bad observation gets a text frame with the one-line error, then the
  connection closes (what openpi's client expects).
- vla-eval: episode_start (an optional ``seed``) resets the session's action queue; each
  observation gets one ``action`` from it, and the model runs only when the queue is used up
  (EVALUATION.replan_steps actions per chunk); a bad observation gets an ``error`` message, and
  the connection stays open.
- A model that remembers each episode (LingBot-VA: its workers declare it; wam_gym/serve/episodes.py): every session
  steps the evaluation's MemoryChunkAgent with each observation and answers one action, to both
  protocols; an openpi observation names its episode (``episode_id``).

Sampling noise comes from the session's own seed (``noise_seed``, episode_start's ``seed``, or
EVALUATION.seed + a per-episode counter), so a session's actions do not depend on what it was
batched with. GET /healthz and /health are 200 only while every model worker is ready; GET
/stats gives the broker's batching statistics. SIGTERM/SIGINT stop accepting, let the requests
in flight finish (SERVE.drain_s), close every connection and every model worker, and exit.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hmac
import itertools
import json
import logging
import signal
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import websockets
from websockets.asyncio.server import serve

from wam_gym.broker import BrokerError, InferenceBroker, RemoteInferenceError, StartCancelled
from wam_gym.remote.keymap import ORIENTATION_KEY, key_map, to_contract
from wam_gym.remote.wire import OPENPI, VLA_EVAL, Message, WireError, as_message, greeting, pack_openpi, unpack
from wam_gym.serve import episodes
from wam_gym.serve.config import LOOPBACK, ServeConfig
from wam_gym.serve.episodes import EPISODE_KEY, EpisodeMarkers
from wam_gym.serve.frames import ClientFrames, FrameSource
from wam_gym.serve.hello import ServedModel, greeting_metadata, hello_fields, runner_hints
from wam_gym.utils.publish import atomic_path

logger = logging.getLogger(__name__)
HEALTH_PATHS = ("/healthz", "/health")  # openpi's probe, vla-eval's
KNOBS = {OPENPI: "SERVE.openpi_keys", VLA_EVAL: "SERVE.vla_eval_keys"}


class ClientError(ValueError):
    """A client's frame cannot be served; only that client hears of it."""


class Session:
    """One connection: its broker client, its protocol, how its frames are turned (wam_gym/serve/frames.py)
    and its episode's agent (vla-eval, or a model that remembers episodes). ``handle`` blocks on the model, so
    the server calls it on a thread; one frame at a time."""

    def __init__(self, server: PolicyServer, session_id: int):
        self.server, self.id = server, session_id
        self.client = server.broker.client(session_id)
        self.protocol: str | None = None
        self.frames: FrameSource = server.frames.default()  # a vla-eval HELLO may name its benchmark's instead
        self._frames_counted = False
        # the episode's agent on this session's client (_agent): vla-eval's chunk queue, or a model that remembers
        # episodes' MemoryChunkAgent; and (that model, openpi) where its episodes start
        self.agent = None
        self.markers = EpisodeMarkers() if server.remembers_episodes else None
        self._broken = False  # a step of this episode failed: a model that remembers it cannot continue it
        self._begin(None)

    def _begin(self, seed: Any) -> None:
        _check_seed(seed, "seed")
        self.client.begin_episode(next(self.server.episode_seeds) if seed is None else seed)
        self._broken = False
        if self.agent is not None:
            self.agent.reset()

    def handle(self, frame: bytes | str) -> tuple[bytes | str | None, bool]:
        """(the reply, or None; whether to close the connection after it)."""
        message = None  # a vla-eval error answer echoes its seq
        try:
            decoded = unpack(frame)
            message = as_message(decoded)
            protocol = VLA_EVAL if message is not None else OPENPI
            self.protocol = self.protocol or protocol
            if protocol != self.protocol:
                raise ClientError(f"this connection speaks {self.protocol}; open another for {protocol}")
            return (self._vla_eval(message) if message is not None else self._openpi(decoded)), False
        except (WireError, ClientError, RemoteInferenceError, ValueError) as exc:
            return self._error(exc, message)
        except BrokerError as exc:  # the model workers are gone: this server is stopping
            return self._error(exc, None, close=True)

    def _error(self, exc: Exception, message: Message | None, close: bool = False) -> tuple[bytes | str, bool]:
        text = f"wam_gym.serve: {exc}".replace("\n", " ")
        self.server.stats["errors"] += 1
        logger.warning("session %d: %s", self.id, text)
        if self.protocol == VLA_EVAL:
            return Message("error", {"error": text}, message.seq if message else 0).pack(), close
        return text, True  # openpi: a text frame, then the connection closes

    def _contract(self, obs: Any, protocol: str, hints: dict[str, str] | None = None) -> dict[str, Any]:
        """A wire observation as a contract row, its frames upright; the first one's orientation is counted
        (GET /stats ``frames``) and logged."""
        row = to_contract(obs, self.server.keys[protocol], KNOBS[protocol], hints, self.frames.orientation)
        if not self._frames_counted:
            self._frames_counted = True
            said = obs.get(ORIENTATION_KEY)
            taken = f"{said} (the observation says so)" if said else f"{self.frames.orientation} ({self.frames.because})"
            self.server.stats["frames"][said or self.frames.orientation] += 1
            logger.info("session %d (%s): frames taken as %s", self.id, protocol, taken)
        return row

    # ----------------------------------------------------------------- openpi
    def _openpi(self, obs: Any) -> bytes:
        if self.markers is not None and isinstance(obs, dict):  # first: a missing marker is the fix such a client needs
            self._openpi_episode(obs)
        row = self._contract(obs, OPENPI)
        seed = obs.get("noise_seed")
        _check_seed(seed, "noise_seed")
        start, model_s = time.perf_counter(), self.client.cost.model_s or 0.0
        answer = self._openpi_answer(row, seed)
        # infer_ms: the model's time for this request (its share of a batched call), which clients count as
        # the cost of a call; total_ms: with the queue wait, as the client waited.
        answer["server_timing"] = {"infer_ms": 1000 * ((self.client.cost.model_s or 0.0) - model_s),
                                   "total_ms": 1000 * (time.perf_counter() - start)}
        self.server.stats["openpi_requests"] += 1
        return pack_openpi(answer)

    def _openpi_answer(self, row: dict[str, Any], seed: int | None) -> dict[str, Any]:
        if self.markers is not None:  # one action: the session's agent runs the model's chunks, seeing every frame
            return {"actions": self._step(row)[None]}
        prediction = self.client.predict_row(row, seed)
        # EVALUATION.action_horizon caps the chunk, as the greeting's action_horizon says (null: the model's whole chunk)
        answer = {"actions": prediction.actions[: self.server.config.EVALUATION.action_horizon]}
        if prediction.video is not None:
            answer["video"] = prediction.video
        return answer

    def _openpi_episode(self, obs: dict[str, Any]) -> None:
        """A model that remembers episodes: a new marker starts a new episode, seeded by its first observation's
        ``noise_seed`` (the model's later draws continue from it). The connection's first episode is the one begun
        as it opened, so each unseeded episode takes the next of the server's seeds, as a vla-eval one does."""
        first, seed = self.markers.current is None, obs.get("noise_seed")
        _check_seed(seed, "noise_seed")
        if self.markers.starts(obs):
            self.server.stats["openpi_episodes"] += 1
            if not (first and seed is None):
                self._begin(seed)

    # ----------------------------------------------------------------- vla-eval
    def _vla_eval(self, message: Message) -> bytes | None:
        if message.type == "hello":  # its benchmark says how its frames are turned
            self.frames = self.server.frames.for_benchmark(message.payload.get("benchmark"))
        elif message.type == "episode_start":
            self._begin(message.payload.get("seed"))
            self.server.stats["vla_eval_episodes"] += 1
        elif message.type == "observation":
            row = self._contract(message.payload, VLA_EVAL, self.server.runner_hints)
            action = self._step(row)
            self.server.stats["vla_eval_requests"] += 1
            return Message("action", {"actions": action}, message.seq).pack()
        elif message.type == "action":
            raise ClientError("clients send observations; actions come from the server")
        elif message.type == "error":
            logger.warning("session %d: the client reports an error: %s", self.id, message.payload)
        return None  # hello (the greeting answered it), episode_end, error

    def _step(self, row: dict[str, Any]):
        """One action of the episode's agent. A model that remembers the episode is not stepped past a failed step:
        its state on the worker may hold half of that step, and the agent's frames would no longer match it."""
        if self._broken:
            raise ClientError("an earlier observation of this episode failed, and the model remembers the episode: it "
                              "cannot be continued; start a new episode (vla-eval: episode_start; openpi: a new "
                              f"'{EPISODE_KEY}')")
        try:
            return self._agent().act(row)
        except Exception:
            self._broken = self.server.remembers_episodes
            raise

    def _agent(self):
        if self.agent is None:
            from agents.factory import make_agent

            ev = self.server.config.EVALUATION
            self.agent = make_agent("wam", predictor=self.client, action_horizon=ev.action_horizon,
                                    replan_steps=ev.replan_steps, remembers_episodes=self.server.remembers_episodes)
        return self.agent

    def close(self) -> None:
        self.client.close()
        self.server.broker.forget_actor(self.id)  # and a model that remembers episodes lets this session's go


class PolicyServer:
    """Serves ``broker`` (not yet started: :meth:`run` starts it) on SERVE.host:SERVE.port."""

    def __init__(self, config: ServeConfig, broker: InferenceBroker, model: ServedModel, identity: dict[str, Any],
                 server_version: str = "unknown"):
        self.config, self.broker, s = config, broker, config.SERVE
        self.keys = {OPENPI: key_map(OPENPI, model.cameras, s.openpi_keys, KNOBS[OPENPI]),
                     VLA_EVAL: key_map(VLA_EVAL, model.cameras, s.vla_eval_keys, KNOBS[VLA_EVAL])}
        self.runner_hints = runner_hints(model.cameras)  # a vla-eval observation that lacks an input names its --param
        self.remembers_episodes = False  # as the model declares once loaded: its sessions answer one action at a time
        self.frames = ClientFrames(s.client_frames, model.suite)
        self.metadata = {"server": "wam_gym.serve", "server_version": server_version,
                         **greeting_metadata(model, identity, self.frames), "keys": self.keys}
        self.hello = hello_fields(model)  # what vla-eval's runner reads: which inputs to send, the specs
        self.episode_seeds = itertools.count(config.EVALUATION.seed)
        self.session_ids = itertools.count()
        self.sessions: set[Any] = set()  # open connections
        self.in_flight = 0  # frames being handled
        self.ready = asyncio.Event()
        self.draining = False
        # what was served, and the connections reclaimed: idle past SERVE.idle_timeout_s, or silent to keep-alive pings
        # and the orientations sessions' frames were taken to have (wam_gym/serve/frames.py)
        self.stats = {"sessions": 0, "openpi_requests": 0, "vla_eval_requests": 0, "vla_eval_episodes": 0,
                      "openpi_episodes": 0, "errors": 0, "closed_idle": 0, "closed_unresponsive": 0,
                      "frames": collections.Counter()}
        self.threads = concurrent.futures.ThreadPoolExecutor(s.max_sessions, thread_name_prefix="wam-session")
        self.port: int | None = None

    async def run(self) -> None:
        s = self.config.SERVE
        if s.host not in LOOPBACK:
            logger.warning("SERVE.host=%s: serving beyond this machine%s", s.host,
                           "" if s.api_key else "; anyone who can reach it may use the model: set SERVE.api_key")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if s.port_file:  # a stale port from an earlier run must not be read as this one's (checked: a port or empty)
            Path(s.port_file).expanduser().unlink(missing_ok=True)
        try:
            listening = await serve(self._handle, s.host, s.port, process_request=self._http, compression=None,
                                    max_size=int(s.max_message_mb * 2**20), ping_interval=s.ping_interval_s,
                                    ping_timeout=s.ping_timeout_s)
        except OSError as exc:  # before any model worker starts
            reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]  # "address already in use", not the call
            raise OSError(f"cannot listen on SERVE.host={s.host} SERVE.port={s.port} ({reason}): "
                          "stop what listens there, or pick another SERVE.port (0: any free one)") from None
        async with listening as server:
            self.port = server.sockets[0].getsockname()[1]
            logger.info("serving on ws://%s:%d (openpi and vla-eval); loading the model workers", s.host, self.port)
            try:
                if not await self._load(stop):
                    return  # stopped while loading: the workers are gone, the connections are closed below
                self._describe_model()
                self.ready.set()
                if s.port_file:  # whole or not at all: a reader polling for it never reads half a port
                    with atomic_path(Path(s.port_file).expanduser()) as tmp:
                        tmp.write_text(f"{self.port}\n")
                logger.info("ready: %d model worker(s) on %s", len(self.broker.devices), self.broker.devices)
                await self._until(stop)
            finally:
                await self._drain(server)

    def _describe_model(self) -> None:
        """What only the loaded model says: whether it remembers episodes (its workers declare it), the chunk one
        answer holds and how much of it to execute. A model that remembers episodes answers one action per
        observation: its chunks run in each session's agent."""
        ev = self.config.EVALUATION
        self.remembers_episodes = self.broker.remembers_episodes
        chunk = ev.action_horizon or self.broker.action_horizon
        self.metadata["episodes"] = episodes.greeting(self.remembers_episodes, chunk)
        self.metadata["action_horizon"] = 1 if self.remembers_episodes else chunk
        self.metadata["replan_steps"] = 1 if self.remembers_episodes else ev.replan_steps or chunk

    async def _load(self, stop: asyncio.Event) -> bool:
        """Start the model workers; a stop signal meanwhile cancels the start (within a second, its workers
        closed). Returns whether they loaded."""
        load = asyncio.ensure_future(asyncio.to_thread(self.broker.start))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({load, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not load.done():
            logger.info("stop signal while the model workers load: cancelling their start")
            self.broker.cancel_start()
            with contextlib.suppress(StartCancelled):
                await load
            return False
        load.result()  # a start that failed raises here
        return True

    async def _until(self, stop: asyncio.Event) -> None:
        """Wait for a stop signal; raise if the broker gave up meanwhile."""
        while not stop.is_set():
            self.broker.check()
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass

    async def _drain(self, server) -> None:
        """Accept nothing new, let the frames in flight be answered, then close everything."""
        self.draining = True
        self.ready.set()  # connections still waiting for the model: told to go
        server.close(close_connections=False)
        deadline = time.monotonic() + self.config.SERVE.drain_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for ws in list(self.sessions):
            await ws.close(1001, "wam_gym.serve is shutting down")
        await asyncio.to_thread(self.broker.close)
        self.threads.shutdown(wait=False, cancel_futures=True)
        logger.info("stopped: %s", json.dumps(self.summary()))

    def summary(self) -> dict[str, Any]:
        return {**self.stats, "open_sessions": len(self.sessions), "in_flight": self.in_flight,
                "broker": self.broker.stats.summary()}

    # ----------------------------------------------------------------- HTTP
    def _http(self, connection, request):
        """Health, stats and the gate (API key, session cap) before a WebSocket handshake."""
        url = urlparse(request.path)
        if url.path in HEALTH_PATHS:
            ok = self.broker.ready() and not self.draining
            status = "ok" if ok else "stopping" if self.draining else "loading"
            return connection.respond(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE,
                                      json.dumps({"status": status}) + "\n")
        key = self.config.SERVE.api_key
        if key and not _authorized(request, url.query, key):
            return connection.respond(HTTPStatus.UNAUTHORIZED, "wam_gym.serve: send 'Authorization: Api-Key <key>' "
                                                               "(openpi-client: api_key=) or ?api_key=<key>\n")
        if url.path == "/stats":
            return connection.respond(HTTPStatus.OK, json.dumps(self.summary()) + "\n")
        if self.draining or len(self.sessions) >= self.config.SERVE.max_sessions:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "wam_gym.serve: busy or stopping "
                                      f"(SERVE.max_sessions={self.config.SERVE.max_sessions})\n")
        return None

    # ----------------------------------------------------------------- WebSocket
    async def _handle(self, ws) -> None:
        self.sessions.add(ws)  # counted from its first moment: SERVE.max_sessions holds while the model loads too
        try:
            await self.ready.wait()  # connections made while the model loads are greeted once it has
            if self.draining:
                await ws.close(1001, "wam_gym.serve is shutting down")
                return
            await self._serve_session(ws)
        except websockets.ConnectionClosed as closed:
            if closed.rcvd is None and closed.sent is not None and closed.sent.code == 1011:  # keep-alive ping lost
                self.stats["closed_unresponsive"] += 1
        finally:
            self.sessions.discard(ws)

    async def _serve_session(self, ws) -> None:
        loop = asyncio.get_running_loop()
        session = await loop.run_in_executor(self.threads, Session, self, next(self.session_ids))
        self.stats["sessions"] += 1
        idle = self.config.SERVE.idle_timeout_s
        try:
            await ws.send(greeting(self.metadata, self.hello))
            while True:
                try:
                    frame = await asyncio.wait_for(ws.recv(), idle)  # a whole frame, or none for `idle` seconds
                except asyncio.TimeoutError:
                    self.stats["closed_idle"] += 1
                    await ws.close(1000, f"idle for {idle:g} s (SERVE.idle_timeout_s): connect again to continue")
                    return
                self.in_flight += 1
                try:
                    reply, close = await loop.run_in_executor(self.threads, session.handle, frame)
                finally:
                    self.in_flight -= 1
                if reply is not None:
                    await ws.send(reply)
                if close:
                    await ws.close(1008, "bad request: see the previous frame")
                    return
                if self.draining:
                    await ws.close(1001, "wam_gym.serve is shutting down")
                    return
        finally:
            await loop.run_in_executor(None, session.close)


def _check_seed(seed: Any, key: str) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ClientError(f"{key}={seed!r} must be a non-negative int")


def _authorized(request, query: str, key: str) -> bool:
    header = request.headers.get("Authorization", "")
    given = header[len("Api-Key "):] if header.startswith("Api-Key ") else parse_qs(query).get("api_key", [""])[-1]
    return hmac.compare_digest(given.encode(), key.encode())
