"""Observations in shared memory: the pixels skip the pipes, and no slot outlives its actor."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from bench.soak import EchoFactory
from envs.protocol import stack_rows
from tests.test_broker import wait_for
from wam_gym.broker import BrokerConfig, InferenceBroker
from wam_gym.broker.batching import Request, shape_key
from wam_gym.broker.shared_obs import MIN_SHARED_BYTES, AttachedSegments, ObservationSlot, SharedArray

SHM = Path("/dev/shm")


def row(value: int, size: int = 96) -> dict:
    return {
        "pixels": {"front": np.full((size, size, 3), value, np.uint8)},
        "state": np.full(3, value, np.float32),
        "instruction": "x",
    }


def test_large_arrays_become_handles_and_read_back_exactly():
    slot, reader = ObservationSlot(), AttachedSegments()
    rows = slot.share([row(1), row(2)])
    image = rows[1]["pixels"]["front"]
    assert isinstance(image, SharedArray) and image.segment == slot.name and image.offset == 96 * 96 * 3
    assert isinstance(rows[1]["state"], np.ndarray)  # small arrays stay in the message
    back = [reader.resolve(r) for r in rows]
    np.testing.assert_array_equal(back[1]["pixels"]["front"], row(2)["pixels"]["front"])
    np.testing.assert_array_equal(back[0]["state"], row(1)["state"])
    del back
    reader.close()
    slot.close()
    assert not (SHM / image.segment).exists()


def test_a_larger_observation_gets_a_new_slot_and_the_old_one_is_unlinked():
    slot = ObservationSlot()
    first = slot.share([row(1, size=96)])[0]["pixels"]["front"].segment
    second = slot.share([row(1, size=160)])[0]["pixels"]["front"].segment
    assert first != second and not (SHM / first).exists() and (SHM / second).exists()
    slot.close()


def test_a_reader_lets_go_of_segments_their_actors_unlinked():
    reader, gone, kept = AttachedSegments(), ObservationSlot(), ObservationSlot()
    reader.resolve(gone.share([row(1)])[0])
    gone.close()
    reader.resolve(kept.share([row(2)])[0])  # attaching a new segment prunes the unlinked one
    assert len(reader) == 1
    reader.close()
    kept.close()


def test_requests_with_images_of_other_sizes_never_share_a_batch():
    slot = ObservationSlot()
    small, large = slot.share([row(1, 96)])[0], ObservationSlot().share([row(1, 160)])[0]
    assert shape_key(small) != shape_key(large)
    assert Request(0, 0, small, None, 0.0).key == shape_key(small)
    assert 32 * 32 * 3 >= MIN_SHARED_BYTES  # even small images go to the slot
    slot.close()


def _predict_then_hang(client, path: str) -> None:
    client.predict(stack_rows([row(5)]))
    Path(path).write_text(client.slot.name)
    if "exit" in path:
        return  # a normal exit: the actor's finalizer unlinks its slot
    time.sleep(600)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_no_slot_outlives_its_actor(tmp_path, how):
    """An actor that exits unlinks its slot; one that is killed has it unlinked by the broker when
    the broker is told the actor is gone (eval's manager tells it)."""
    import multiprocess

    with InferenceBroker(EchoFactory(0.0), BrokerConfig(workers_per_gpu=1)) as broker:
        client = broker.client(7)
        path = tmp_path / how
        process = multiprocess.get_context("spawn").Process(target=_predict_then_hang, args=(client, str(path)))
        process.start()
        client.close()
        wait_for(lambda: path.exists() and path.read_text(), "the actor's answer")
        segment = SHM / path.read_text()
        if how == "sigkill":
            assert segment.exists()
            os.kill(process.pid, signal.SIGKILL)
            broker.forget_actor(7)
        process.join(timeout=60)
        wait_for(lambda: not segment.exists(), f"{segment} to be unlinked")
