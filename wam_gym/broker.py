"""The inference broker: rollout actors send observations, model workers answer in batches.

    actors --request pipe (one each)--> dispatcher <--result pipe (one each)-- model workers
      |                                     |                                        |
      +--- observation slot (shared memory, one each: pixels) ---------------------->+
                                            |
                      Batcher (size / wait, grouped by shape; Pacer sets the size)
                                            |
          reply pipe (one per actor) <-- replies       batches --> batch pipe of an idle worker

Requests carry handles to the pixels in the actor's slot (wam_gym/shared_obs.py): the model
worker reads them from there, and the dispatcher routes only small messages. It writes replies
without ever blocking (wam_gym/outbox.py): an actor that stops reading holds up nobody else.

The dispatcher thread waits on every pipe at once. Each pipe has a single writer, so a
SIGKILL can cut short only the dead process's own message and never leaves a lock held that
others need (a shared multiprocess Queue's write lock stays taken when its writer dies in
``put``). A worker holds one batch, and while every worker is busy, one more *full* batch
waits in its pipe (``MAX_HELD``), and the worker stacks it while the first runs
(model_worker.BatchFeed): it starts the moment the first ends, not after the result has crossed to
the dispatcher, the next batch back and its stacking (a gap of ~12 ms a call at saturation, a
fifth of a compiled tiny model's call on an H200); partial batches still wait for a free worker,
as requests pile up into fuller batches. A worker that dies is restarted and the batches it held are
sent again; so is one that holds a batch far longer than batches take (a hung GPU or driver: the
watchdog SIGKILLs it); an actor that dies has its pending requests dropped. Pipes and queues stay
inside this process tree: nothing listens on a network socket (the Ray backend binds Ray to
127.0.0.1 unless given a cluster).
"""

from __future__ import annotations

import itertools
import logging
import os
import selectors
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import multiprocess
import multiprocess.connection

from agents.policy import ModelCost, Prediction
from agents.predictor import Predictor
from envs.protocol import batch_size, take_row
from wam_gym.batching import Batcher, Pacer, Request
from wam_gym.model_worker import BatchResult, PolicyFactory, decode, encode, receive, send, serve_forever
from wam_gym.outbox import Outbox
from wam_gym.shared_obs import ObservationSlot, unlink
from wam_gym.utils.ranges import Range, check_ranges
from wam_gym.utils.stats import percentile

logger = logging.getLogger(__name__)
BACKENDS = ("local", "ray")


class BrokerError(RuntimeError):
    """The broker could not serve: workers failed to start, or kept dying."""


class StartCancelled(BrokerError):
    """The broker's start was cancelled (a server told to stop while its model workers loaded)."""


class RemoteInferenceError(RuntimeError):
    """A model worker raised while serving this request (bad input, NaN output, ...)."""


@dataclass
class BrokerConfig:
    """The MULTIRUN knobs of the broker (EasyWAM's names)."""

    num_gpus: int = 0  # 0: CPU workers
    gpu_ids: list[int] | None = None  # null: the first num_gpus devices; else the first num_gpus of this pool
    workers_per_gpu: int = 1  # model copies per GPU (per machine on CPU), each its own process
    inference_batch_size: int = 4  # most requests one model call takes
    inference_batch_wait_ms: float = 5.0  # longest the oldest queued request waits for a fuller batch
    backend: str = "local"  # local processes, or ray actors
    ray_address: str | None = None  # null: a local Ray cluster on 127.0.0.1
    torch_threads_per_worker: int | None = None  # null: 1 on CPU workers (they share cores with envs), else torch's; 0: torch's
    max_worker_restarts: int = 3  # restarts of each model worker (died, stalled, killed while loading) before the run stops
    startup_timeout_s: float = 600.0  # time for every model worker to load its model
    # The stall watchdog: a worker holding a batch longer than max(stall_floor_s, stall_factor x the
    # p95 time a batch keeps its worker) is SIGKILLed (a hung GPU or driver never answers), restarted, and its batch resent.
    stall_factor: float = 10.0  # times the p95 batch time a batch may take before its worker counts as stalled
    stall_floor_s: float = 60.0  # never sooner; also the bound while too few batches were timed for a p95
    stall_first_batch_s: float = 1800.0  # a (re)started worker's first batch: torch.compile, CUDA graphs, lazy loads
    batch_invariant: bool = False  # each request runs alone: bit-identical actions whatever the batching, no batching speed-up
    batch_pacing: bool = True  # release batches of the size that keeps actors waiting least (batching.Pacer), not always full

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"MULTIRUN.backend={self.backend!r}: choose one of {BACKENDS}")
        check_ranges(self, "MULTIRUN", BROKER_RANGES)


BROKER_RANGES = {  # every numeric knob of the broker (MULTIRUN.*)
    "num_gpus": Range(0, 1024, note="0: CPU workers"),
    "workers_per_gpu": Range(1, 256),
    "inference_batch_size": Range(1, 65_536),
    "inference_batch_wait_ms": Range(0, integer=False, note="milliseconds"),
    "torch_threads_per_worker": Range(0, note="0: torch's own count, untouched", null="1 on CPU workers, else torch's"),
    "max_worker_restarts": Range(0, 10_000, note="0: the first death stops the run"),
    "startup_timeout_s": Range(0, open_low=True, integer=False, note="seconds"),
    "stall_factor": Range(1, integer=False),
    "stall_floor_s": Range(0, open_low=True, integer=False, note="seconds"),
    "stall_first_batch_s": Range(0, open_low=True, integer=False, note="seconds"),
}


def worker_devices(config: BrokerConfig, available_gpus: int | None = None) -> list[str]:
    """One device string per model worker, GPUs chosen as MULTIRUN.gpu_ids says."""
    if config.num_gpus == 0:
        return ["cpu"] * config.workers_per_gpu
    if available_gpus is None:
        import torch

        available_gpus = torch.cuda.device_count()
    pool = list(range(available_gpus)) if config.gpu_ids is None else list(config.gpu_ids)
    if available_gpus == 0:
        raise BrokerError(
            f"MULTIRUN.num_gpus={config.num_gpus} but no CUDA device is visible; set MULTIRUN.num_gpus=0 for CPU workers"
        )
    if len(pool) < config.num_gpus:
        raise BrokerError(f"MULTIRUN.num_gpus={config.num_gpus} but the GPU pool {pool} has only {len(pool)}")
    unknown = [g for g in pool[: config.num_gpus] if not 0 <= g < available_gpus]
    if unknown:
        raise BrokerError(f"MULTIRUN.gpu_ids {unknown} do not exist (this machine has {available_gpus} GPUs)")
    return [f"cuda:{g}" for g in pool[: config.num_gpus] for _ in range(config.workers_per_gpu)]


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


# A client waiting for an answer wakes this often: to call its on_wait hook and to see if its manager died.
CLIENT_WAIT_SLICE_S = 1.0
# Percentiles come from the latest this-many samples: a week-long evaluation keeps flat memory.
STATS_WINDOW = 10_000
# The stall bound uses the p95 batch time once this many batches were timed; MULTIRUN.stall_floor_s before.
STALL_MIN_SAMPLES = 20
# How often the dispatcher looks for stalled workers and for restarted ones that never finished loading.
WATCH_INTERVAL_S = 1.0


@dataclass
class BrokerStats:
    batches: int = 0
    requests: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    queue_wait_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    # Per batch, how long its first request waited for its last to be sent: the part of the queue
    # wait spent filling the batch, not waiting for a worker. Clients that arrive staggered (envs
    # whose steps vary, or that share too few cores to wake together) make it long.
    batch_fill_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    model_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    # Per batch, how long its worker took to stack its observations out of the actors' slots (a copy of every
    # image: 1.1-1.6 ms for 16 rows of two 224x224 images on a 2-core VM), while the call before ran when the
    # worker stacked it ahead (model_worker.BatchFeed), else between calls: time the model waits.
    stack_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    worker_restarts: int = 0
    resent_batches: int = 0
    stalled_workers: int = 0  # killed by the watchdog (each also counts as a restart)

    def add_batch(self, waits_s: list[float]) -> None:
        self.batches += 1
        self.requests += len(waits_s)
        self.batch_sizes.append(len(waits_s))
        self.queue_wait_s.extend(waits_s)
        self.batch_fill_s.append(max(waits_s) - min(waits_s))

    def summary(self) -> dict[str, float]:
        def pct(values, q):
            return 1000 * percentile(values, q)

        return {
            "batches": self.batches,
            "requests": self.requests,
            "mean_batch_size": self.requests / self.batches if self.batches else 0.0,
            "queue_wait_ms_p50": pct(self.queue_wait_s, 50),
            "queue_wait_ms_p95": pct(self.queue_wait_s, 95),
            "batch_fill_ms_p50": pct(self.batch_fill_s, 50),
            "batch_fill_ms_p95": pct(self.batch_fill_s, 95),
            "model_ms_p50": pct(self.model_s, 50),
            "model_ms_p95": pct(self.model_s, 95),
            "stack_ms_p50": pct(self.stack_s, 50),
            "stack_ms_p95": pct(self.stack_s, 95),
            "worker_restarts": self.worker_restarts,
            "resent_batches": self.resent_batches,
            "stalled_workers": self.stalled_workers,
        }


# Batches a worker holds at most: the one it runs and one full batch waiting in its pipe. A batch is
# handles (~100 bytes a request) and its pipe is written without blocking: the dispatcher never waits.
MAX_HELD = 2


@dataclass
class _InFlight:
    """A batch a worker holds."""

    batch_id: int
    requests: list[Request]
    sent: float  # time.monotonic() when the worker could start it: handed over, or when the one before ended
    first: bool  # the worker's first batch since it (re)started: it may compile, so stall_first_batch_s applies


class BrokerClient(Predictor):
    """An actor's handle on the broker; a :class:`~agents.predictor.Predictor` for the chunk-queue agent.

    Holds the actor's own request pipe and reply pipe; pass it to the process that uses it
    as a ``Process`` argument, then call :meth:`close` in the parent (the broker then sees
    EOF, not a half message, if that process is killed while sending). Noise seeds derive
    from the episode seed and the call count, so an episode's noise does not depend on which
    requests its calls were batched with (its actions do only in the last float bits, unless
    ``batch_invariant`` is set).
    """

    def __init__(self, actor_id: int, requests, replies, action_horizon: int):
        self.actor_id, self.requests, self.replies, self.action_horizon = actor_id, requests, replies, action_horizon
        self._ids = itertools.count()
        self.cost = ModelCost()  # this episode's model time and denoising steps, from the workers' answers
        self.slot = ObservationSlot()  # created in the process that predicts, at its first call
        # Called about once a second while waiting for an answer: a rollout actor reports that it is
        # alive, only waiting (the eval manager's stall watchdog must not kill it for a slow model).
        self.on_wait: Callable[[], None] | None = None

    def __str__(self) -> str:
        return "the model (served by the broker's workers)"

    def close(self) -> None:
        """Drop this process's copy of the pipes (after handing the client to another, or when done)."""
        self.requests.close()
        self.replies.close()

    def predict(self, obs, noise_seeds=None) -> Prediction:
        n = batch_size(obs)
        answers = self._ask([take_row(obs, row) for row in range(n)], noise_seeds)
        return Prediction.stack(answers)

    def predict_row(self, obs, noise_seed=None) -> Prediction:
        """One env's observation as one request: no batch to wrap it in and split again."""
        return self._ask([obs], None if noise_seed is None else [noise_seed])[0]

    def _ask(self, rows: list, noise_seeds) -> list:
        """One model call's rows, each a request the broker may batch with others; their answers in order."""
        noise_seeds = self.call_seeds(len(rows), noise_seeds)
        ids = []
        for row, shared in enumerate(self.slot.share(rows)):
            rid = next(self._ids)
            ids.append(rid)
            request = Request(self.actor_id, rid, shared, noise_seeds[row], time.monotonic(), self.slot.name)
            try:
                send(self.requests, ("request", request, None))
            except (BrokenPipeError, OSError):
                raise BrokerError("the inference broker has shut down; this actor stops") from None
        answers = self._collect(set(ids))
        return [answers[r] for r in ids]

    def _collect(self, pending: set[int]) -> dict[int, Any]:
        answers = {}
        parent = os.getppid()
        while pending:
            if not self.replies.poll(CLIENT_WAIT_SLICE_S):
                if self.on_wait is not None:
                    self.on_wait()
                if os.getppid() != parent:  # the manager (and its broker) is gone
                    raise BrokerError("the evaluation manager exited; this actor stops") from None
                continue
            try:
                rid, row, error, model_s, denoise_steps = decode(self.replies.recv_bytes())
            except (EOFError, OSError):
                raise BrokerError("the inference broker has shut down; this actor stops") from None
            if rid not in pending:
                continue  # a late answer to a call abandoned after an error
            if error is not None:
                raise RemoteInferenceError(error)
            answers[rid] = row
            pending.discard(rid)
            self.cost.add(model_s, denoise_steps)
        return answers


class InferenceBroker:
    """Serves actors' requests with a pool of model workers, batching dynamically."""

    def __init__(self, factory: PolicyFactory, config: BrokerConfig, ctx=None):
        self.config = config
        self.ctx = ctx or multiprocess.get_context("spawn")
        # Messages from this process (stop, actor_gone, Ray results): one pipe, writes locked.
        self._control, self._control_writer = self.ctx.Pipe(duplex=False)
        self._control_lock = threading.Lock()
        self._selector = selectors.DefaultSelector()  # the dispatcher's: every pipe it reads
        self._watching: tuple[list, list] = ([], [])  # the (readers, writers) _selector watches
        self.batcher = Batcher(config.inference_batch_size, config.inference_batch_wait_ms)
        self.pacer = Pacer(config.inference_batch_size) if config.batch_pacing else None
        if self.pacer is not None:
            self.batcher.verdict = self.pacer.verdict
        self.stats = BrokerStats()
        if config.backend == "ray":
            from wam_gym.ray_backend import RayWorkerPool, ray_devices

            self.devices = ray_devices(config)
            self.pool = RayWorkerPool(factory, self.devices, config, self._post)
        else:
            self.devices = worker_devices(config)
            self.pool = LocalWorkerPool(factory, self.devices, config, self.ctx)
        self.action_horizon: int | None = None
        self._cancel_start = threading.Event()  # cancel_start(): a start in progress gives up
        self._requests: dict[int, Any] = {}  # actor -> our reading end of its request pipe
        self._replies: dict[int, Outbox] = {}  # actor -> the write end of its reply pipe
        self._slots: dict[int, str] = {}  # actor -> its shared-memory slot, unlinked if it dies
        self._idle: deque[int] = deque()
        self._in_flight: dict[int, deque[_InFlight]] = {}  # worker -> the batches it holds, the running one first
        self._restarts = [0] * len(self.pool)
        self._served = [0] * len(self.pool)  # batches handed to each worker since it (re)started
        self._loading: dict[int, float] = {}  # worker -> when it must have loaded its model (monotonic)
        self._last_error: dict[int, str] = {}  # worker -> the last line of the error it reported while loading
        self._next_watch = 0.0
        # How long each batch kept its worker: from hand-over (or the end of the batch before) to its result.
        self._occupied_s: deque[float] = deque(maxlen=STATS_WINDOW)
        self._overdue_s = float("inf")  # their p95, refreshed by _watch once enough are known
        self._worker_lost = False  # a worker's result pipe reached EOF since the last _heal
        self._batch_ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._lock = threading.Lock()  # _requests and _replies: actors come and go from the caller's thread

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> InferenceBroker:
        try:
            for i in range(len(self.pool)):
                self._start_worker(i)
            self._await_ready(set(range(len(self.pool))))
        except BaseException:
            self.close()  # the workers that did load must not hold their (GPU) memory until we exit
            raise
        self._thread = threading.Thread(target=self._run, name="wam-broker", daemon=True)
        self._thread.start()
        logger.info("broker: %d %s model worker(s) on %s", len(self.pool), self.config.backend, self.devices)
        return self

    def cancel_start(self) -> None:
        """From another thread: make a :meth:`start` in progress stop within a second, its workers closed."""
        self._cancel_start.set()

    def _start_worker(self, i: int) -> None:
        self.pool.start(i)
        self._served[i] = 0
        self._loading[i] = time.monotonic() + self.config.startup_timeout_s

    def _await_ready(self, waiting: set[int]) -> None:
        """Wait until every worker has loaded its model. One that dies while loading (a kill, the
        out-of-memory killer, a segfault) is restarted, up to max_worker_restarts; one whose factory
        raises stops the start at once with that error (it would raise again)."""
        while waiting:
            if self._cancel_start.is_set():
                raise StartCancelled("the model workers' start was cancelled")
            dead = [i for i in waiting if not self.pool.alive(i)]  # checked first: all they sent is in their pipes
            for kind, worker, payload in self._receive(timeout=1.0):
                if kind == "failed":
                    raise BrokerError(f"model worker {worker} failed to load its model: {_last_line(payload)}\n{payload}")
                if kind == "ready":
                    self._ready(worker, payload)
                    waiting.discard(worker)
            for worker in dead:
                self._restart(worker, f"died while loading its model ({self.pool.exit_cause(worker)})")
                waiting.add(worker)
            late = [i for i in waiting if time.monotonic() > self._loading[i]]
            if late:
                raise BrokerError(f"model worker(s) {late} did not load the model within MULTIRUN.startup_timeout_s="
                                  f"{self.config.startup_timeout_s:g}")

    def _ready(self, worker: int, action_horizon: int) -> None:
        self.action_horizon = action_horizon
        self._loading.pop(worker, None)
        self._free(worker)

    def _free(self, worker: int) -> None:
        """``worker`` can take a batch. Paced, a partial group waiting for stragglers of its last batch
        (Pacer.holds) counts its hold from now if it had to wait for a worker before."""
        if self.pacer is not None and not self._idle:
            self.batcher.free_since = time.monotonic()
        self._idle.append(worker)

    def close(self) -> None:
        if self._thread is not None:
            self._post(("stop", None, None))
            self._thread.join(timeout=10)
        self.pool.close()
        with self._lock:
            for connection in self._requests.values():
                connection.close()
            for replies in self._replies.values():
                replies.close()
            self._requests.clear()
            self._replies.clear()
        self._selector.close()
        self._control.close()
        self._control_writer.close()

    def __enter__(self) -> InferenceBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- actors
    def client(self, actor_id: int) -> BrokerClient:
        """Register an actor; its client carries its own request pipe and reply pipe."""
        requests, request_writer = self.ctx.Pipe(duplex=False)
        reply_reader, replies = self.ctx.Pipe(duplex=False)
        with self._lock:
            self._requests[actor_id], self._replies[actor_id] = requests, Outbox(replies)
        return BrokerClient(actor_id, request_writer, reply_reader, self.action_horizon)

    def forget_actor(self, actor_id: int) -> None:
        """An actor died: drop its queued requests (in-flight ones are answered into the void)."""
        self._post(("actor_gone", actor_id, None))

    def dispatcher_cpu_s(self) -> float:
        """CPU seconds the dispatcher thread has used: its cost per request bounds how many
        requests/s one broker can route (bench/broker.py --standin prints it)."""
        if self._thread is None or self._thread.ident is None:
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))
        except (AttributeError, OSError):  # not Linux, or the thread has exited
            return float("nan")

    def ready(self) -> bool:
        """Every model worker has loaded its model and the dispatcher runs (a readiness probe)."""
        return self._thread is not None and self._thread.is_alive() and not self._loading and self._failure is None

    def check(self) -> None:
        """Raise in the caller's thread if the dispatcher gave up."""
        if self._failure is not None:
            raise BrokerError(f"the inference broker stopped: {self._failure}") from self._failure

    def _post(self, message) -> None:
        with self._control_lock:
            send(self._control_writer, message)

    # ----------------------------------------------------------------- dispatcher
    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as exc:  # surfaced to the manager by check()
            logger.exception("broker dispatcher failed")
            self._failure = exc

    def _step(self) -> bool:
        # With every worker busy a due batch must wait for a result (a message) anyway: no spinning.
        deadline = self.batcher.next_deadline() if self._idle else None
        timeout = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
        for message in self._receive(timeout):
            if not self._handle(message):
                return False
        if self._worker_lost:  # its pipe ended: restart it now (_watch checks every worker each second)
            self._worker_lost = False
            self._heal()
        self._watch()
        self._dispatch()
        return True

    def _receive(self, timeout: float) -> list:
        """Every message waiting on the control pipe, the workers' and the actors' pipes;
        waits up to ``timeout`` for the first. A pipe at EOF (its writer died) is let go. Reply
        pipes that had no room for a whole reply take more of it as soon as they have."""
        with self._lock:
            actors = {c: a for a, c in self._requests.items()}
            unsent = [replies for replies in self._replies.values() if replies.waiting]
        unsent += self.pool.unsent()
        workers = self.pool.connections()
        messages = []
        for connection in self._pending([self._control, *workers, *actors], unsent, timeout):
            if isinstance(connection, Outbox):
                connection.flush()
                continue
            try:  # one message per wake-up: epoll reports the pipe again while more are waiting
                messages.append(receive(connection))
            except (EOFError, OSError):  # a SIGKILL may have cut its last message short: dropped
                if connection in actors:
                    self._drop_requests_pipe(actors[connection])
                elif connection in workers:
                    self.pool.lost(connection)
                    self._worker_lost = True
        return messages

    def _pending(self, readers: list, writers: list[Outbox], timeout: float) -> list:
        """The readers with something to read and the writers with room, waiting up to ``timeout``.
        One epoll set kept across calls (registering every pipe on every wake-up cost ~8 us a pipe:
        0.5 ms a loop with 64 actors), brought up to date when the pipes came or went (comparing
        the set's map with them cost ~20 us a wake-up with 64 actors, the pipes themselves ~0.3)."""
        if (readers, writers) != self._watching:
            self._watching = (readers, writers)
            wanted = {**dict.fromkeys(readers, selectors.EVENT_READ), **dict.fromkeys(writers, selectors.EVENT_WRITE)}
            registered = list(self._selector.get_map().values())
            for key in registered:
                if key.fileobj not in wanted:  # closed already, maybe: by its number, not its fileno()
                    self._selector.unregister(key.fd)
            for pipe in wanted.keys() - {key.fileobj for key in registered}:
                self._selector.register(pipe, wanted[pipe])
        return [key.fileobj for key, _ in self._selector.select(timeout)]

    def _drop_requests_pipe(self, actor_id: int) -> None:
        with self._lock:
            connection = self._requests.pop(actor_id, None)
        if connection is not None:
            connection.close()

    def _handle(self, message) -> bool:
        kind, a, b = message
        if kind == "request":
            self.batcher.add(a)
            if self.pacer is not None:
                self.pacer.arrived(a.actor_id, a.arrived)
            if a.segment is not None:
                self._slots[a.actor_id] = a.segment
        elif kind == "result":
            self._finish(b)
        elif kind == "ready":
            self._ready(a, b)
        elif kind == "failed":  # the worker exits now; _heal restarts it (the error is named if it gives up)
            self._last_error[a] = _last_line(b)
            logger.error("restarted model worker %d failed to load:\n%s", a, b)
        elif kind == "actor_gone":
            self.batcher.drop_actor(a)
            if self.pacer is not None:
                self.pacer.forget(a)
            if a in self._slots:
                unlink(self._slots.pop(a))
            self._drop_requests_pipe(a)
            with self._lock:
                replies = self._replies.pop(a, None)
            if replies is not None:
                replies.close()
        elif kind == "stop":
            return False
        return True

    def _dispatch(self) -> None:
        now = time.monotonic()
        while self._idle and (batch := self.batcher.pop_ready(now)):
            self._submit(self._idle.popleft(), batch, now)
        # Every worker busy: a full batch waits in the pipe of the one whose batch started first.
        while not self._idle and (worker := self._next_to_free()) is not None and (batch := self.batcher.pop_full()):
            self._submit(worker, batch, now)

    def _next_to_free(self) -> int | None:
        """The busy worker with room for one more batch whose running batch started first, unless that
        batch has run past the p95 time a batch keeps its worker (one that may be stalling gets nothing more)."""
        now = time.monotonic()
        room = [(held[0].sent, w) for w, held in self._in_flight.items()
                if len(held) < MAX_HELD and now - held[0].sent <= self._overdue_s]
        return min(room)[1] if room else None

    def _submit(self, worker: int, batch: list[Request], now: float) -> None:
        batch_id = next(self._batch_ids)
        self._in_flight.setdefault(worker, deque()).append(_InFlight(batch_id, batch, now, first=self._served[worker] == 0))
        self._served[worker] += 1
        self.stats.add_batch([now - r.arrived for r in batch])
        self.pool.submit(worker, batch_id, batch)

    def _finish(self, result: BatchResult) -> None:
        held = self._in_flight.get(result.worker_id, ())
        flight = next((f for f in held if f.batch_id == result.batch_id), None)
        if flight is None:
            return  # an answer from before a restart, already resent
        running = flight is held[0]  # a Ray result may overtake the one before it on the way here
        occupied = time.monotonic() - flight.sent if running else 0.0  # how long it kept its worker (Pacer)
        if running:
            self._occupied_s.append(occupied)
        held.remove(flight)
        if held:
            if running:
                held[0].sent = time.monotonic()  # the waiting batch runs now: the stall watchdog times it from here
        else:
            del self._in_flight[result.worker_id]
            self._free(result.worker_id)
        self.stats.model_s.append(result.model_seconds)
        self.stats.stack_s.append(result.stack_seconds)
        share = result.model_seconds / max(1, len(result.replies))  # each request's part of the call
        for actor_id, request_id, row, error in result.replies:
            self._reply(actor_id, (request_id, row, error, share, result.denoise_steps))
        if self.pacer is not None:
            now = time.monotonic()
            self.pacer.batch_done(len(flight.requests), max(occupied, result.model_seconds))
            for actor_id, *_ in result.replies:
                self.pacer.answered(actor_id, now, result.batch_id)
            self.batcher.limit = self.pacer.target(len(self.pool), now)
            self.batcher.hold_s = self.pacer.hold_s()

    def _reply(self, actor_id: int, message) -> None:
        with self._lock:
            replies = self._replies.get(actor_id)
        if replies is not None:
            replies.put(encode(message))

    def _heal(self) -> None:
        """Restart dead workers."""
        for worker in range(len(self.pool)):
            if not self.pool.alive(worker):
                self._restart(worker, f"died ({self.pool.exit_cause(worker)})")

    def _watch(self) -> None:
        """Once a second: restart dead workers; kill and restart workers that hold a batch far
        longer than batches take (a hung GPU or driver answers never, and would freeze every actor
        waiting on it), or that were restarted and never finished loading."""
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_INTERVAL_S
        if len(self._occupied_s) >= STALL_MIN_SAMPLES:  # timed as _next_to_free times a running batch
            self._overdue_s = percentile(self._occupied_s, 95)
        self._heal()
        for worker, held in list(self._in_flight.items()):
            flight = held[0]
            limit = self._stall_limit(flight.first)
            if now - flight.sent > limit:
                self.stats.stalled_workers += 1
                self.pool.kill(worker)
                self._restart(worker, f"stalled: held batch {flight.batch_id} for {now - flight.sent:.1f} s "
                                      f"(limit {limit:.1f} s, MULTIRUN.stall_*); killed it")
        for worker, deadline in list(self._loading.items()):
            if now > deadline:
                self.pool.kill(worker)
                self._restart(worker, f"did not load its model within MULTIRUN.startup_timeout_s="
                                      f"{self.config.startup_timeout_s:g}; killed it")

    def _stall_limit(self, first: bool) -> float:
        """How long a batch may take: a worker's first one may compile; later ones get stall_factor
        x the p95 time a batch keeps its worker, never less than the floor (the floor alone until a p95 means something)."""
        c = self.config
        if first:
            return max(c.stall_floor_s, c.stall_first_batch_s)
        if self._overdue_s == float("inf"):  # fewer than STALL_MIN_SAMPLES batches timed so far (see _watch)
            return c.stall_floor_s
        return max(c.stall_floor_s, c.stall_factor * self._overdue_s)

    def _restart(self, worker: int, why: str) -> None:
        """Start ``worker`` afresh after ``why``; the batches it held go back to the front of the queue."""
        if self._restarts[worker] >= self.config.max_worker_restarts:
            last = f"; its last error: {self._last_error[worker]}" if worker in self._last_error else ""
            raise BrokerError(f"model worker {worker} {why}{last}. It was restarted {self._restarts[worker]} time(s) "
                              f"already (MULTIRUN.max_worker_restarts={self.config.max_worker_restarts}): giving up")
        self._restarts[worker] += 1
        self.stats.worker_restarts += 1
        if worker in self._idle:
            self._idle.remove(worker)
        lost = self._in_flight.pop(worker, deque())
        self.stats.resent_batches += len(lost)
        for flight in reversed(lost):  # the running batch ends up first, as it was
            for request in reversed(flight.requests):
                self.batcher.add(request, front=True)
        logger.warning("model worker %d %s; restarting it (restart %d of %d)%s", worker, why, self._restarts[worker],
                       self.config.max_worker_restarts, f", its {len(lost)} batch(es) resent" if lost else "")
        self._start_worker(worker)


def _last_line(error: str) -> str:
    """The exception line of a formatted traceback (it comes last)."""
    lines = error.strip().splitlines()
    return lines[-1] if lines else "(no message)"
