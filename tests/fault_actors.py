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


def hold(path: str) -> None:
    """Write this process's pid to ``path`` (atomically) and wait there to be SIGKILLed; exit if the
    manager dies first (a failed test must not leave a held actor behind)."""
    manager = os.getppid()
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(temp, path)
    while os.getppid() == manager:
        time.sleep(0.05)
    os._exit(1)


class HoldAtStep:
    """An env that holds its actor (see :func:`hold`) just before env step ``step`` of the episode."""

    def __init__(self, env, step: int, path: str):
        self._env, self._hold_step, self._path, self._steps = env, step, path, 0

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, action):
        if self._steps == self._hold_step:
            hold(self._path)
        self._steps += 1
        return self._env.step(action)


def faulty_actor_main(actor_id, spec, jobs, results, client) -> None:
    """actor_main with the faults $WAM_TEST_FAULTS names (JSON), each as [task, trial], on attempt 1:
    ``fail`` raises in that episode, ``slow`` sleeps 2 s before it, ``die_mid_send`` is SIGKILLed
    halfway through sending its record; ``hold``, a list of [task, trial, step, path], holds the actor
    (its pid in ``path``) until the test kills it: before the episode's env is built or reset when
    ``step`` is -1, else just before env step ``step``."""
    faults = json.loads(os.environ.get(FAULTS_ENV, "{}"))
    holds = {(task, trial): (step, path) for task, trial, step, path in faults.get("hold", [])}
    real_run, real_env = actor_module._Actor.run, actor_module._Actor.env

    def run_episode(self, job):
        if job.attempts == 1 and [job.task.name, job.trial] == faults.get("fail"):
            raise RuntimeError("injected failure")
        if job.attempts == 1 and [job.task.name, job.trial] == faults.get("slow"):
            time.sleep(2.0)
        if job.attempts == 1 and holds.get((job.task.name, job.trial), (0,))[0] < 0:
            hold(holds[job.task.name, job.trial][1])
        return real_run(self, job)

    def env_holding(self, job):
        env = real_env(self, job)
        step, path = holds.get((job.task.name, job.trial), (-1, None)) if job.attempts == 1 else (-1, None)
        return HoldAtStep(env, step, path) if step >= 0 else env

    actor_module._Actor.run = run_episode
    actor_module._Actor.env = env_holding
    if "die_mid_send" in faults:
        results = DiesMidSend(results, faults["die_mid_send"])
    actor_module.actor_main(actor_id, spec, jobs, results, client)
