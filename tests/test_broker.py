"""The inference broker: dynamic batching, GPU selection, faults, and batch-independent results."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import multiprocess
import numpy as np
import pytest

from bench.soak import EchoPolicy
from envs.protocol import take_row
from wam_gym.broker import (
    MAX_HELD,
    STATS_WINDOW,
    BrokerConfig,
    BrokerError,
    BrokerStats,
    InferenceBroker,
    RemoteInferenceError,
    worker_devices,
)
from wam_gym.broker.batching import Batcher, Request
from wam_gym.broker.model_worker import decode, send
from wam_gym.broker.outbox import Outbox

# The stand-in models build on bench/soak.py's, which need no torch: a model worker (which imports
# this module to unpickle its factory) starts in about a second instead of ~10.


class Echo(EchoPolicy):
    """A stand-in model: the chunk repeats each row's state; 'boom' instructions raise."""

    def predict(self, obs, noise_seeds=None):
        if "boom" in obs["instruction"]:
            raise ValueError("observation refused: boom")
        return super().predict(obs, noise_seeds)


def echo_policy(device: str) -> Echo:
    return Echo(delay_s=0.0)


def failing_policy(device: str):
    raise FileNotFoundError("no checkpoint at /nowhere")


class HeldEcho(EchoPolicy):
    """A stand-in model and its factory: echoes the state (as echo_policy) and holds the first batch
    that any of its workers gets. That worker writes its pid to ``<directory>/held`` and answers only
    once ``<directory>/release`` exists (a test that kills it never creates it); every other batch,
    the held one resent to a restarted worker included, is answered at once. Tests act on these
    events, never after a fixed delay."""

    def __init__(self, directory: Path):
        super().__init__(delay_s=0.0)
        self.directory = Path(directory)

    def __call__(self, device: str) -> HeldEcho:
        return self

    def predict(self, obs, noise_seeds=None):
        mine = self.directory / f"held.{os.getpid()}"
        mine.write_text(str(os.getpid()))
        try:
            os.link(mine, self.directory / "held")  # atomic, and only the first worker's link succeeds
        except FileExistsError:
            pass
        else:
            while not (self.directory / "release").exists():
                time.sleep(0.01)
        return super().predict(obs, noise_seeds)


class HeldLoad:
    """A stand-in factory whose first ``holds`` model loads hang until the test kills them (or the
    broker exits): each writes its pid to ``<directory>/loading.<n>`` (n = 0, 1, ...) and waits; later
    loads build an Echo at once. For one worker: the loads never race for a number."""

    def __init__(self, directory: Path, holds: int):
        self.directory, self.holds = Path(directory), holds

    def __call__(self, device: str) -> Echo:
        for n in range(self.holds):
            try:
                fd = os.open(self.directory / f"loading.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue  # an earlier load held (and was killed) here
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            broker = os.getppid()
            while os.getppid() == broker:
                time.sleep(0.01)
            os._exit(1)
        return Echo(delay_s=0.0)


def kill_loads(directory: Path, count: int) -> threading.Thread:
    """A thread that SIGKILLs each of HeldLoad's first ``count`` hanging loads as soon as it hangs."""

    def run():
        for n in range(count):
            path = Path(directory) / f"loading.{n}"
            wait_for(lambda path=path: path.exists() and path.read_text() != "", f"model load {n} to hang")
            os.kill(int(path.read_text()), signal.SIGKILL)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def count_replies(broker: InferenceBroker) -> Counter:
    """(actor, request id) -> how many answers the broker sent for it, from now on."""
    counts: Counter = Counter()
    reply = broker._reply

    def counting(actor_id, message):
        counts[actor_id, message[0]] += 1
        reply(actor_id, message)

    broker._reply = counting
    return counts


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.01)


def held_pid(directory: Path) -> int:
    """The pid of the model worker holding HeldEcho's first batch, once it holds it."""
    wait_for((Path(directory) / "held").exists, "a model worker to receive its first batch")
    return int((Path(directory) / "held").read_text())


def queued(broker: InferenceBroker) -> int:
    """Requests the dispatcher has received and not yet batched (read from another thread)."""
    try:
        return len(broker.batcher)
    except RuntimeError:  # the dispatcher changed the groups while we counted: ask again
        return -1


def request(actor: int, rid: int, arrived: float, dim: int = 3) -> Request:
    return Request(actor, rid, {"state": np.zeros(dim, np.float32)}, None, arrived)


def obs(value: float, instruction: str = "x") -> dict:
    return {"state": np.full((1, 3), value, np.float32), "instruction": (instruction,)}


# ----------------------------------------------------------------- batching (pure)
def test_batch_released_when_full_or_when_the_oldest_waited():
    batcher = Batcher(batch_size=3, wait_ms=10)
    for rid in range(2):
        batcher.add(request(0, rid, arrived=0.0))
    assert batcher.pop_ready(now=0.005) is None  # 2 < 3 and waited 5 ms < 10 ms
    assert [r.request_id for r in batcher.pop_ready(now=0.011)] == [0, 1]
    for rid in range(4):
        batcher.add(request(0, rid, arrived=1.0))
    assert len(batcher.pop_ready(now=1.0)) == 3 and len(batcher) == 1


def test_requests_of_different_shapes_never_share_a_batch():
    batcher = Batcher(batch_size=4, wait_ms=0)
    batcher.add(request(0, 0, 0.0, dim=3))
    batcher.add(request(1, 1, 0.0, dim=7))
    batcher.add(request(2, 2, 0.0, dim=3))
    first, second = batcher.pop_ready(1.0), batcher.pop_ready(1.0)
    assert [r.request_id for r in first] == [0, 2] and [r.request_id for r in second] == [1]


def test_dead_actor_requests_are_dropped_and_resent_ones_go_first():
    batcher = Batcher(batch_size=2, wait_ms=0)
    batcher.add(request(5, 0, 0.0))
    batcher.add(request(6, 1, 0.0))
    batcher.drop_actor(5)
    batcher.add(request(7, 2, 0.0), front=True)
    assert [r.actor_id for r in batcher.pop_ready(1.0)] == [7, 6]


def test_bad_batching_knobs():
    with pytest.raises(ValueError, match="inference_batch_size"):
        Batcher(0, 10)
    with pytest.raises(ValueError, match="inference_batch_wait_ms"):
        Batcher(2, -1)


def test_stats_keep_exact_totals_in_bounded_memory():
    stats = BrokerStats()
    for _ in range(STATS_WINDOW + 5):
        stats.add_batch([0.001, 0.003])
    summary = stats.summary()
    assert (summary["batches"], summary["requests"], summary["mean_batch_size"]) == (STATS_WINDOW + 5, 2 * STATS_WINDOW + 10, 2.0)
    assert len(stats.batch_sizes) == len(stats.queue_wait_s) == len(stats.batch_fill_s) == STATS_WINDOW
    assert summary["queue_wait_ms_p50"] == pytest.approx(2.0)
    assert summary["batch_fill_ms_p50"] == pytest.approx(2.0)  # the first request waited 2 ms for the second
    stats.stack_s.extend([0.001, 0.002, 0.003])
    assert stats.summary()["stack_ms_p50"] == pytest.approx(2.0)


def test_batch_fill_is_the_wait_for_a_batchs_last_request():
    stats = BrokerStats()
    stats.add_batch([0.005])  # alone: nothing to wait for
    stats.add_batch([0.009, 0.004, 0.001])  # sent 8 ms apart, first to last
    assert list(stats.batch_fill_s) == pytest.approx([0.0, 0.008])
    assert stats.summary()["batch_fill_ms_p95"] == pytest.approx(7.6)


# ----------------------------------------------------------------- devices
def test_gpu_selection_follows_num_gpus_and_gpu_ids():
    assert worker_devices(BrokerConfig(num_gpus=0, workers_per_gpu=3)) == ["cpu"] * 3
    assert worker_devices(BrokerConfig(num_gpus=2, workers_per_gpu=2), available_gpus=4) == [
        "cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert worker_devices(BrokerConfig(num_gpus=3, gpu_ids=[2, 3, 5, 6]), available_gpus=8) == [
        "cuda:2", "cuda:3", "cuda:5"]
    with pytest.raises(BrokerError, match="MULTIRUN.num_gpus=0"):
        worker_devices(BrokerConfig(num_gpus=1), available_gpus=0)
    with pytest.raises(BrokerError, match="has only 1"):
        worker_devices(BrokerConfig(num_gpus=2, gpu_ids=[1]), available_gpus=2)
    with pytest.raises(BrokerError, match=r"gpu_ids \[7\]"):
        worker_devices(BrokerConfig(num_gpus=1, gpu_ids=[7]), available_gpus=2)
    with pytest.raises(ValueError, match="MULTIRUN.backend"):
        BrokerConfig(backend="slurm")


# ----------------------------------------------------------------- processes
def drive(clients, calls: int) -> dict[int, list[float]]:
    """Each client in its own thread asks ``calls`` times; returns the answers per client."""
    answers: dict[int, list[float]] = {}

    def run(i, client):
        answers[i] = [float(client.predict(obs(i * 100 + k)).actions[0, 0, 0]) for k in range(calls)]

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return answers


def ask_together(clients, rows: list[dict], seeds: list[int]) -> dict:
    """Client i asks for rows[i] with noise seed seeds[i], each in its own thread, all at once."""
    got: dict = {}

    def ask(i):
        got[i] = clients[i].predict(rows[i], [seeds[i]])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return got


@pytest.fixture
def broker():
    with InferenceBroker(echo_policy, BrokerConfig(workers_per_gpu=1, inference_batch_size=4,
                                                   inference_batch_wait_ms=50)) as b:
        yield b


def test_concurrent_actors_are_batched_and_answered_correctly(tmp_path):
    """While the only worker is busy, one full batch waits in its pipe (broker.MAX_HELD) and the other
    requests queue up; once it is free they go out as full batches."""
    actors = 8  # the first batch holds at most 4 of the 8 first requests, so at least 4 are left waiting
    config = BrokerConfig(workers_per_gpu=1, inference_batch_size=4, inference_batch_wait_ms=50)
    with InferenceBroker(HeldEcho(tmp_path), config) as broker:
        clients = [broker.client(i) for i in range(actors)]
        answers: dict[int, list[float]] = {}
        driver = threading.Thread(target=lambda: answers.update(drive(clients, calls=4)))
        driver.start()
        held_pid(tmp_path)  # the worker holds the first batch: the other first requests must queue
        first = broker.stats.batch_sizes[0]
        wait_for(lambda: queued(broker) == actors - first - 4 and broker.stats.batches == 2,
                 "every actor's first request to reach the broker, 4 of them as a batch waiting for the worker")
        (tmp_path / "release").touch()
        driver.join(timeout=120)
        stats = broker.stats
        assert answers == {i: [i * 100 + k for k in range(4)] for i in range(actors)}
        assert 1 <= first <= 4 and stats.batch_sizes[1] == 4  # the queued requests went out as one full batch
        assert stats.requests == 4 * actors == sum(stats.batch_sizes) and stats.batches < stats.requests
        assert len(stats.model_s) == stats.batches  # a model time for every batch


def test_a_worker_error_reaches_only_its_requester(broker):
    client = broker.client(0)
    with pytest.raises(RemoteInferenceError, match="ValueError: observation refused: boom"):
        client.predict(obs(1, "boom"))
    assert client.predict(obs(2)).actions[0, 0, 0] == 2  # the worker lives on


def drive_while_the_holder_gets(sig: int, tmp_path, broker, calls: int) -> None:
    """4 clients make ``calls`` requests each while the worker holding the first batch (HeldEcho)
    gets ``sig``; each client gets exactly its own answers, in order."""
    clients = [broker.client(i) for i in range(4)]
    sender = threading.Thread(target=lambda: os.kill(held_pid(tmp_path), sig))
    sender.start()
    answers = drive(clients, calls=calls)
    sender.join()
    assert answers == {i: [i * 100 + k for k in range(calls)] for i in range(4)}


def test_killed_model_worker_is_restarted_and_nothing_is_lost(tmp_path):
    """SIGKILL of a worker while it holds a batch: it is restarted and the batch is resent."""
    config = BrokerConfig(workers_per_gpu=2, inference_batch_size=2, inference_batch_wait_ms=5)
    with InferenceBroker(HeldEcho(tmp_path), config) as broker:
        drive_while_the_holder_gets(signal.SIGKILL, tmp_path, broker, calls=10)
        assert broker.stats.worker_restarts == 1 and 1 <= broker.stats.resent_batches <= MAX_HELD  # + a full batch waiting


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.slow)])  # slow: a Ray cluster
def test_stalled_model_worker_is_killed_restarted_and_its_batch_resent(tmp_path, caplog, backend):
    """SIGSTOP of a worker holding a batch stands in for a hung GPU or driver: it never answers. The
    watchdog SIGKILLs it once the batch is older than the bound (the floor here: too few model times
    for a p95 yet), restarts it and resends the batch; every request is answered exactly once."""
    import psutil

    if backend == "ray":
        cloudpickle = pytest.importorskip("ray.cloudpickle")
        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/
    config = BrokerConfig(backend=backend, workers_per_gpu=2, inference_batch_size=2, inference_batch_wait_ms=5,
                          stall_floor_s=5, stall_first_batch_s=5)  # the held batch is its worker's first
    with InferenceBroker(HeldEcho(tmp_path), config) as broker:
        replies = count_replies(broker)
        drive_while_the_holder_gets(signal.SIGSTOP, tmp_path, broker, calls=8)
        assert replies == {(i, k): 1 for i in range(4) for k in range(8)}
        stats = broker.stats.summary()
        assert (stats["stalled_workers"], stats["worker_restarts"]) == (1, 1)
        assert 1 <= stats["resent_batches"] <= MAX_HELD  # the held batch, and maybe a full one waiting behind it
        if backend == "local":  # Ray's raylet reaps its own actor processes, in its own time
            assert not psutil.pid_exists(held_pid(tmp_path))  # killed and reaped, though stopped
    stalls = [r for r in caplog.records if r.name == "wam_gym.broker" and "stalled" in r.getMessage()]
    assert len(stalls) == 1 and stalls[0].levelname == "WARNING" and "\n" not in stalls[0].getMessage()


def test_a_worker_killed_while_loading_is_restarted(tmp_path):
    killer = kill_loads(tmp_path, 1)
    with InferenceBroker(HeldLoad(tmp_path, holds=1), BrokerConfig(max_worker_restarts=1)) as broker:
        killer.join()
        assert broker.stats.worker_restarts == 1
        assert broker.client(0).predict(obs(7)).actions[0, 0, 0] == 7


def test_a_worker_killed_at_every_load_fails_the_start_naming_the_signal(tmp_path):
    killer = kill_loads(tmp_path, 2)
    with pytest.raises(BrokerError, match=r"model worker 0 died while loading its model \(killed by SIGKILL.*"
                                          r"restarted 1 time\(s\) already \(MULTIRUN.max_worker_restarts=1\)"):
        InferenceBroker(HeldLoad(tmp_path, holds=2), BrokerConfig(max_worker_restarts=1)).start()
    killer.join()


def test_a_model_that_cannot_load_fails_at_start_with_its_error():
    with pytest.raises(BrokerError, match="no checkpoint at /nowhere"):
        InferenceBroker(failing_policy, BrokerConfig()).start()


@pytest.mark.slow  # a local Ray cluster
def test_ray_backend_serves_and_survives_a_killed_actor(tmp_path):
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    import sys

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/
    config = BrokerConfig(backend="ray", workers_per_gpu=2, inference_batch_size=2, inference_batch_wait_ms=5)
    with InferenceBroker(HeldEcho(tmp_path), config) as broker:
        clients = [broker.client(i) for i in range(4)]
        pids = [broker.pool.pid(i) for i in range(2)]  # asked while idle: a Ray actor answers after its batch
        killer = threading.Thread(target=lambda: os.kill(held_pid(tmp_path), signal.SIGKILL))
        killer.start()
        answers = drive(clients, calls=8)
        killer.join()
        assert answers == {i: [i * 100 + k for k in range(8)] for i in range(4)}
        assert broker.stats.worker_restarts == 1 and 1 <= broker.stats.resent_batches <= MAX_HELD  # + a full batch waiting
        killed = pids.index(held_pid(tmp_path))
        assert broker.pool.pid(killed) not in pids  # a new actor in its place


def test_wam_answers_do_not_depend_on_batching(tmp_path):
    """Per-row noise seeds: a request gives the same chunk alone or batched with others, to float
    tolerance (bit for bit takes MULTIRUN.batch_invariant, tested below)."""
    import functools

    from agents.wam import InferenceConfig, WAMPolicy, build_model, preset, save_pretrained
    from tests.test_wam_model import observation
    from wam_gym.policies import checkpoint_policy

    save_pretrained(build_model(preset("tiny")), tmp_path / "ckpt")
    inference = InferenceConfig.from_knobs(num_inference_steps=2)
    local = WAMPolicy.from_checkpoint(tmp_path / "ckpt", inference)
    rows = [observation(batch=1, seed=s) for s in range(3)]
    expected = [local.predict(o, noise_seeds=[10 + i]).actions for i, o in enumerate(rows)]
    factory = functools.partial(checkpoint_policy, str(tmp_path / "ckpt"), inference, None, 64, {})
    # No release by wait time: the batch goes out when all three requests are in, however slow they come.
    config = BrokerConfig(inference_batch_size=3, inference_batch_wait_ms=600_000)
    with InferenceBroker(factory, config) as broker:
        got = ask_together([broker.client(i) for i in range(3)], rows, seeds=[10, 11, 12])
        assert list(broker.stats.batch_sizes) == [3]  # all three in one batch
    for i in range(3):
        np.testing.assert_allclose(got[i].actions, expected[i], atol=1e-5)


def test_batch_invariant_mode_gives_bit_identical_actions_whatever_the_batching(tiny_ckpt):
    """MULTIRUN.batch_invariant=true: the same four requests answered in batches of 1, 2 and 4 give the
    same actions and predicted video bit for bit (by default they differ in the last float bits: a
    batched matmul sums in an order that depends on the batch size)."""
    import functools

    from agents.wam import InferenceConfig
    from tests.test_wam_model import observation
    from wam_gym.policies import checkpoint_policy

    factory = functools.partial(checkpoint_policy, str(tiny_ckpt), InferenceConfig.from_knobs(num_inference_steps=2),
                                None, 64, {})
    rows = [observation(batch=1, seed=s) for s in range(4)]
    answers = {}
    for size in (1, 2, 4):
        # No release by wait time: batches go out only when full, however slowly the requests come.
        config = BrokerConfig(inference_batch_size=size, inference_batch_wait_ms=600_000, batch_invariant=True)
        with InferenceBroker(factory, config) as broker:
            answers[size] = ask_together([broker.client(i) for i in range(4)], rows, seeds=[10, 11, 12, 13])
            assert list(broker.stats.batch_sizes) == [size] * (4 // size)
    for size in (2, 4):
        for i in range(4):
            np.testing.assert_array_equal(answers[size][i].actions, answers[1][i].actions)
            if answers[1][i].video is not None:
                np.testing.assert_array_equal(answers[size][i].video, answers[1][i].video)


def test_prompt_cache_reuses_embeddings_and_evicts_least_recent():
    import torch

    from agents.wam import build_model, preset
    from agents.wam.policy import PromptCache

    model = build_model(preset("tiny"))
    cache = PromptCache(model, size=2)
    first = cache.encode(["open", "close", "open"])
    assert (cache.hits, cache.misses) == (1, 2)
    torch.testing.assert_close(first, model.encode_prompt(["open", "close", "open"]))
    cache.encode(["push"])  # "close" is the least recently used: "open" was used last
    assert set(cache._cache) == {"open", "push"}
    cache.encode(["open"])
    assert cache.hits == 2


# ----------------------------------------------------------------- processes killed at the worst moment
def _send_half_a_request_then_die(client) -> None:
    """What a SIGKILL in the middle of ``send`` leaves: a header promising 1 MiB, 100 bytes of it."""
    os.write(client.requests.fileno(), struct.pack("!i", 1 << 20) + b"x" * 100)
    os.kill(os.getpid(), signal.SIGKILL)


def test_an_actor_killed_mid_send_stalls_no_one(broker):
    victim = broker.client(99)
    process = multiprocess.get_context("spawn").Process(target=_send_half_a_request_then_die, args=(victim,))
    process.start()
    victim.close()  # the child holds the pipe now: its death is EOF, not a wait for the rest
    process.join(timeout=120)
    assert process.exitcode == -signal.SIGKILL
    answers = drive([broker.client(i) for i in range(3)], calls=3)
    assert answers == {i: [i * 100 + k for k in range(3)] for i in range(3)}
    broker.check()  # the dispatcher dropped the cut message and lives on


def test_an_actor_that_stops_reading_stalls_no_one(broker):
    """Replies go down non-blocking pipes: an actor that asks and never reads (hung, stopped) fills
    its own pipe and the rest waits in the broker, while every other actor is answered; when it reads
    again, each reply arrives whole and in order."""
    slow = broker.client(50)
    for rid in range(1500):  # ~300 kB of replies: far more than a pipe's 64 kB buffer
        send(slow.requests, ("request", Request(50, rid, take_row(obs(rid), 0), None, time.monotonic()), None))
    wait_for(lambda: broker.stats.requests >= 1500, "the unread requests to be answered")
    assert broker._replies[50].waiting  # the pipe is full: the rest waits in the broker
    answers = drive([broker.client(i) for i in range(3)], calls=3)
    assert answers == {i: [i * 100 + k for k in range(3)] for i in range(3)}
    got = []
    while len(got) < 1500:
        assert slow.replies.poll(60), f"reply {len(got)} never came"
        rid, row, error, *_ = decode(slow.replies.recv_bytes())
        assert error is None and row.actions[0, 0] == rid
        got.append(rid)
    assert got == list(range(1500))


def test_a_reply_to_an_actor_that_died_is_dropped():
    reader, writer = multiprocess.Pipe(duplex=False)
    outbox = Outbox(writer)
    reader.close()
    outbox.put(b"x" * 100_000)
    assert outbox.broken and not outbox.waiting


BROKER_IN_A_CHILD = """
from bench.soak import EchoFactory
from wam_gym.broker import BrokerConfig, InferenceBroker
broker = InferenceBroker(EchoFactory(0.0), BrokerConfig(workers_per_gpu=2)).start()
print(broker.pool.pid(0), broker.pool.pid(1), flush=True)
import time; time.sleep(600)
"""


def test_model_workers_exit_when_the_broker_process_is_killed():
    """An orphaned model copy would hold its (GPU) memory until someone finds it."""
    import psutil

    from wam_gym.broker.model_worker import ORPHAN_CHECK_S

    root = Path(__file__).resolve().parents[1]
    parent = subprocess.Popen([sys.executable, "-c", BROKER_IN_A_CHILD], cwd=root, stdout=subprocess.PIPE, text=True)
    workers = [psutil.Process(int(pid)) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(w.is_running() for w in workers)
    parent.kill()  # SIGKILL: the broker never tells its workers to stop
    parent.wait()
    gone, alive = psutil.wait_procs(workers, timeout=10 * ORPHAN_CHECK_S)
    assert alive == [], f"model workers {[p.pid for p in alive]} outlived their broker"
