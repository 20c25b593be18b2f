"""A model worker's batches: stacked out of the actors' slots, the next one while the model runs."""

from __future__ import annotations

import os
import threading
import time

import multiprocess
import numpy as np
import pytest

from bench.soak import EchoFactory, EchoPolicy
from envs.protocol import INSTRUCTION, PIXELS, STATE
from wam_gym.broker.batching import Request
from wam_gym.broker.model_worker import BatchFeed, ModelServer, send
from wam_gym.broker.shared_obs import ObservationSlot

MODEL_S = 0.05  # EchoPolicy's call


def requests(values: list[float], slots: list[ObservationSlot]) -> list[Request]:
    """One request per value: its state and every pixel of its 128x128 image hold the value (two such
    rows are large enough for a batch to reuse memory, envs.protocol.REUSE_MIN_BYTES)."""
    out = []
    for i, (value, slot) in enumerate(zip(values, slots)):
        row = {STATE: np.full(4, value, np.float32), PIXELS: {"cam": np.full((128, 128, 3), value, np.uint8)},
               INSTRUCTION: "echo"}
        out.append(Request(i, int(value), slot.share([row])[0], None, time.monotonic(), slot.name))
    return out


@pytest.fixture
def slots():
    slots = [ObservationSlot() for _ in range(6)]
    yield slots
    for slot in slots:
        slot.close()


@pytest.fixture
def server():
    return ModelServer(EchoFactory(MODEL_S), "cpu", 0)


class GatedEcho(EchoPolicy):
    """With ``gated``, its first call lasts until ``gate`` is set (10 s at most), and notes whether it was."""

    def __init__(self, gated: bool):
        super().__init__(MODEL_S)
        self.gate, self.gate_was_set = threading.Event(), None if gated else False

    def predict(self, obs, noise_seeds=None):
        if self.gate_was_set is None:
            self.gate_was_set = self.gate.wait(10)
        return super().predict(obs, noise_seeds)


class Taking(ModelServer):
    """A ModelServer that notes which thread stacked each batch (with ``gated``, its model's first
    call lasts until the second batch is stacked)."""

    def __init__(self, gated: bool = True):
        super().__init__(lambda device: GatedEcho(gated), "cpu", 0)
        self.taken: list[tuple[int, str]] = []

    def take(self, batch_id, requests):
        self.taken.append((batch_id, threading.current_thread().name))
        taken = super().take(batch_id, requests)
        if batch_id == 2:
            self.policy.gate.set()
        return taken


def test_two_stacked_batches_never_share_memory_and_the_one_after_next_reuses_it(server, slots):
    first = server.take(1, requests([1, 2], slots[:2]))
    second = server.take(2, requests([3, 4], slots[2:4]))
    assert not np.shares_memory(first.obs[PIXELS]["cam"], second.obs[PIXELS]["cam"])
    assert (first.obs[PIXELS]["cam"][:, 0, 0, 0] == [1, 2]).all()  # intact after the second was stacked
    third = server.take(3, requests([5, 6], slots[4:]))
    assert np.shares_memory(first.obs[PIXELS]["cam"], third.obs[PIXELS]["cam"])
    result = server.run_batch(second)
    assert [(actor, request) for actor, request, _, _ in result.replies] == [(0, 3), (1, 4)]
    assert [float(row.actions[0, 0]) for _, _, row, error in result.replies] == [3.0, 4.0]


def test_a_result_says_how_long_its_batch_took_to_stack(slots):
    """The broker's stack_ms_p50/p95: the copy out of the slots, apart from the model's call."""
    stacked = ModelServer(EchoFactory(MODEL_S), "cpu", 0).run(1, requests([1, 2], slots[:2]))
    assert 0 < stacked.stack_seconds < MODEL_S <= stacked.model_seconds
    alone = ModelServer(EchoFactory(MODEL_S), "cpu", 0, batch_invariant=True).run(2, requests([3, 4], slots[2:4]))
    assert alone.stack_seconds == 0.0  # each request runs alone: nothing stacked ahead of the calls


def test_the_next_batch_is_stacked_while_the_model_runs_the_one_before(slots):
    server, (inbox, writer) = Taking(), multiprocess.Pipe(duplex=False)
    feed = BatchFeed(server, inbox, os.getppid())
    send(writer, (1, requests([1, 2], slots[:2])))  # sent before the worker asked: the broker sends ahead
    first = feed.next()
    assert server.taken == [(1, "MainThread")]
    send(writer, (2, requests([3, 4], slots[2:4])))
    result = server.run_batch(first)
    assert server.policy.gate_was_set  # the second batch was stacked while the model ran the first
    assert server.taken[1] == (2, "wam-read-ahead")
    assert [float(row.actions[0, 0]) for _, _, row, _ in result.replies] == [1.0, 2.0]
    second = feed.next()
    assert second.batch_id == 2 and len(server.taken) == 2  # taken ahead: nothing left to read
    assert [float(row.actions[0, 0]) for _, _, row, _ in server.run_batch(second).replies] == [3.0, 4.0]


def test_a_worker_that_waits_for_its_batches_reads_each_itself(slots):
    server, (inbox, writer) = Taking(gated=False), multiprocess.Pipe(duplex=False)
    feed = BatchFeed(server, inbox, os.getppid())
    threading.Timer(1.0, send, (writer, (1, requests([1, 2], slots[:2])))).start()
    first = feed.next()  # waits for it: the broker does not send ahead, so the thread stays asleep
    send(writer, (2, requests([3, 4], slots[2:4])))
    server.run_batch(first)
    assert feed.next().batch_id == 2
    assert server.taken == [(1, "MainThread"), (2, "MainThread")]


@pytest.mark.parametrize("reader", ["thread", "worker"])
@pytest.mark.parametrize("end", ["stop", "close"])
def test_the_feed_ends_when_told_to_stop_or_when_the_broker_is_gone(server, slots, end, reader):
    inbox, writer = multiprocess.Pipe(duplex=False)
    feed = BatchFeed(server, inbox, os.getppid())
    first = None
    if reader == "thread":  # the first batch was sent ahead, so the thread reads what follows while it runs
        send(writer, (1, requests([1], slots[:1])))
        first = feed.next()
    send(writer, None) if end == "stop" else writer.close()
    if first is not None:
        server.run_batch(first)
    assert feed.next() is None
    assert feed.next() is None  # and stays ended


def test_a_request_whose_observation_is_gone_fails_alone(server, slots):
    batch = requests([1, 2], slots[:2])
    slots[1].close()  # its actor exited: the slot is unlinked
    taken = server.take(7, batch)
    assert taken.obs is None  # run alone: each request gets its own answer or error
    replies = server.run_batch(taken).replies
    assert float(replies[0][2].actions[0, 0]) == 1.0 and replies[0][3] is None
    assert replies[1][2] is None and "shared memory" in replies[1][3]
