"""Rollout actors with injected faults, for tests/test_fault_injection.py.

A separate, light module: the spawned actor processes import it to find ``faulty_actor_main``
(importing the test module would pull in torch and the model code, seconds per actor).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import time

from wam_gym.eval import actor as actor_module

FAULTS_ENV = "WAM_TEST_FAULTS"


class DiesMidSend:
    """A result pipe whose actor SIGKILLs itself halfway through sending one chosen record."""

    def __init__(self, conn, key: list):
        self.conn, self.key = conn, key

    def send(self, message) -> None:
        kind, _, payload = message
        if kind == "done" and [payload.task, payload.trial] == self.key and payload.attempts == 1:
            data = pickle.dumps(message)
            # multiprocess's framing (a 4-byte big-endian length, then the bytes), cut in half.
            os.write(self.conn.fileno(), struct.pack("!i", len(data)) + data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        self.conn.send(message)


def faulty_actor_main(actor_id, spec, jobs, results, client) -> None:
    """actor_main with the faults $WAM_TEST_FAULTS names (JSON), each as [task, trial], on attempt 1:
    ``fail`` raises in that episode, ``slow`` sleeps 2 s before it, ``die_mid_send`` is SIGKILLed
    halfway through sending its record."""
    faults = json.loads(os.environ.get(FAULTS_ENV, "{}"))
    real_run = actor_module._Actor.run

    def run_episode(self, job):
        if job.attempts == 1 and [job.task.name, job.trial] == faults.get("fail"):
            raise RuntimeError("injected failure")
        if job.attempts == 1 and [job.task.name, job.trial] == faults.get("slow"):
            time.sleep(2.0)
        return real_run(self, job)

    actor_module._Actor.run = run_episode
    if "die_mid_send" in faults:
        results = DiesMidSend(results, faults["die_mid_send"])
    actor_module.actor_main(actor_id, spec, jobs, results, client)
