"""Episodes as sessions in the broker: a model that remembers episodes (agents.policy.EpisodicPolicy) has each
episode's calls served by the one model worker that holds its state, from its first call until it is released; a
worker that dies loses its episodes, whose next calls fail with EpisodeLost, while the other worker's go on.

Two real worker processes serve a numpy stand-in that counts each episode's calls (no torch: a worker starts in
about a second), and the tiny LingBot-VA release (scripts/tiny_lingbot_va_release.py) checks that episodes in
flight on two workers each get exactly what they get alone in this process.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_broker import wait_for

from agents.episode_memory import EPISODE, SEEN, MemoryChunkAgent
from agents.policy import EpisodicPolicy
from wam_gym.broker import BrokerConfig, EpisodeLost, InferenceBroker, RemoteInferenceError

CONFIG = BrokerConfig(workers_per_gpu=2, inference_batch_size=4, inference_batch_wait_ms=50)


class Remembering(EpisodicPolicy):
    """A stand-in for a model that remembers episodes. A row whose state[0] is 0 starts its episode, any other
    continues it and is refused unless this worker holds the episode (as LingBotVAPolicy refuses one whose cache
    it does not hold); rows are checked before any is counted, so a refused call changes nothing. A row whose
    state[1] is 1 waits until ``<directory>/release`` exists, its worker's pid in ``<directory>/held``. Each
    row's chunk is (this worker's pid, the episode's calls so far, the episodes this worker holds)."""

    action_horizon = 2

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.calls: dict[int, int] = {}  # episode -> its calls so far, on this worker

    def __call__(self, device: str) -> Remembering:
        return self

    def predict(self, obs, noise_seeds=None):
        episodes, state = [int(e) for e in obs[EPISODE]], obs["state"]
        for episode, row in zip(episodes, state):
            if row[0] > 0 and episode not in self.calls:
                raise ValueError(f"episode {episode} continues but its state is not held here: restart the episode")
        if state[:, 1].any():
            (self.directory / "held").write_text(str(os.getpid()))
            while not (self.directory / "release").exists():
                time.sleep(0.01)
        rows = []
        for episode, row in zip(episodes, state):
            self.calls[episode] = 1 if row[0] == 0 else self.calls[episode] + 1
            rows.append([os.getpid(), self.calls[episode], len(self.calls)])
        return np.repeat(np.asarray(rows, np.float32)[:, None], self.action_horizon, axis=1)

    def end_episode(self, episode: int) -> None:
        self.calls.pop(episode, None)


def call(client, episode: int, k: int, hold: bool = False) -> tuple[int, int, int]:
    """Call ``k`` (0: the first) of ``episode``: (the pid of the worker that answered, the episode's calls there,
    the episodes that worker holds)."""
    row = {"state": np.array([k, hold, 0], np.float32), "instruction": "x", EPISODE: np.int64(episode)}
    return tuple(int(v) for v in client.predict_row(row).actions[0])


@pytest.fixture
def broker(tmp_path):
    with InferenceBroker(Remembering(tmp_path), CONFIG) as b:
        yield b


def test_episodes_stick_to_their_worker_across_calls_and_batches(broker):
    """Four episodes in flight at once, 6 calls each: every call of an episode is served by the worker that served
    its first (its count goes on there: 1..6), two episodes a worker, batched with each other."""
    assert broker.remembers_episodes
    clients = [broker.client(i) for i in range(4)]
    answers: dict[int, list] = {}

    def run(i):
        answers[i] = [call(clients[i], 100 + i, k) for k in range(6)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    workers = {broker.pool.pid(w): w for w in range(2)}
    for i in range(4):
        assert len({pid for pid, _, _ in answers[i]}) == 1, answers[i]  # one worker from first call to last
        assert [calls for _, calls, _ in answers[i]] == list(range(1, 7))
    placed = sorted(workers[answers[i][0][0]] for i in range(4))
    assert placed == [0, 0, 1, 1] and broker.sessions.live == [2, 2]
    assert broker.stats.requests == 24 and max(broker.stats.batch_sizes) == 2  # a worker's two episodes together


def test_new_episodes_go_to_the_least_loaded_worker_and_released_ones_free_their_state(broker):
    a, b, c, d = (broker.client(i) for i in range(4))
    worker = {broker.pool.pid(w): w for w in range(2)}

    def first(client, episode):  # (the worker an episode was placed on, the episodes that worker holds)
        pid, calls, held = call(client, episode, 0)
        assert calls == 1
        return worker[pid], held

    assert first(a, 1) == (0, 1)
    assert first(b, 2) == (1, 1)  # the other worker: it held none
    assert first(c, 3) == (0, 2)  # a tie: the first worker
    a.release_episode(1)  # a's env was reset
    assert first(a, 4) == (0, 2)  # a tie again; episode 1's state is gone there (else it would hold 3)
    broker.forget_actor(1)  # b is gone: its episode 2 is let go on worker 1
    wait_for(lambda: broker.sessions.live == [2, 0], "b's episode to be let go")
    assert first(d, 5) == (1, 1)  # worker 1 holds only the new one
    with pytest.raises(RemoteInferenceError, match="episode 1 continues but its state is not held here"):
        call(a, 1, 1)  # released: never continued
    with pytest.raises(RemoteInferenceError, match="episode 4 belongs to another client"):
        call(c, 4, 1)
    assert call(a, 4, 1)[1:] == (2, 2)  # a's episode 4 goes on, on worker 0 (which holds 3 and 4)


def test_a_killed_worker_loses_its_episodes_and_the_other_workers_go_on(broker, tmp_path):
    """SIGKILL of the worker holding a call of episode 1: that call and the episode's next fail with EpisodeLost,
    never served by the restarted worker as if the episode went on; episode 2, on the other worker, goes on;
    a new episode of the same actor starts on the restarted worker."""
    a, b = broker.client(0), broker.client(1)
    assert call(a, 1, 0)[1] == call(b, 2, 0)[1] == 1
    lost: list[BaseException] = []

    def held_call():
        try:
            call(a, 1, 1, hold=True)
        except EpisodeLost as exc:
            lost.append(exc)

    thread = threading.Thread(target=held_call)
    thread.start()
    wait_for((tmp_path / "held").exists, "the worker to hold episode 1's call")
    killed = int((tmp_path / "held").read_text())
    (tmp_path / "held").unlink()
    os.kill(killed, signal.SIGKILL)
    thread.join(timeout=60)
    assert len(lost) == 1 and "episode 1 was lost: its model worker 0 died (killed by SIGKILL" in str(lost[0])
    assert str(lost[0]).endswith("restart the episode")
    with pytest.raises(EpisodeLost, match="episode 1 was lost"):
        call(a, 1, 2)  # its next call too
    pid, calls, _ = call(b, 2, 1)
    assert calls == 2 and pid == broker.pool.pid(1) != killed
    a.release_episode(1)
    pid, calls, held = call(a, 3, 0)
    assert (pid, calls, held) == (broker.pool.pid(0), 1, 1) and pid != killed
    s = broker.stats
    assert (s.worker_restarts, s.lost_episodes, s.resent_batches) == (1, 1, 0)


# ----------------------------------------------------------------- evaluation
class StandStill(EpisodicPolicy):
    """A model that remembers Meta-World episodes and answers chunks of 4 zero actions; like LingBotVAPolicy it
    refuses a call that continues (frames were seen since its last) an episode it does not hold."""

    action_horizon = 4

    def __init__(self):
        self.held: set[int] = set()

    def predict(self, obs, noise_seeds=None):
        episodes, seen = [int(e) for e in obs[EPISODE]], next(iter(obs[SEEN].values()))
        for episode, frames in zip(episodes, seen):
            if len(frames) and episode not in self.held:
                raise ValueError(f"episode {episode} continues but its state is not held here: restart the episode")
        self.held.update(episodes)
        return np.zeros((len(episodes), self.action_horizon, 4), np.float32)

    def end_episode(self, episode: int) -> None:
        self.held.discard(episode)


def stand_still(device: str) -> StandStill:
    return StandStill()


def test_an_episode_whose_worker_died_is_run_again_from_its_start(tmp_path):
    """python -m wam_gym.eval with a model that remembers episodes (its workers say so: MemoryChunkAgent drives
    it): the only model worker is SIGKILLed as it is handed the episode's second call. The episode is not
    continued on the restarted worker: it runs again from its start (attempt 2), as an episode whose actor died
    does, and the run completes."""
    pytest.importorskip("metaworld")
    from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
    from wam_gym.eval.manager import EvalManager

    killed = []

    def kill_at_the_second_call(manager, actors, broker):
        submit = broker.pool.submit

        def submit_then_kill(worker, *batch):
            submit(worker, *batch)
            if not killed and broker.stats.batches == 2:
                killed.append(broker.pool.pid(worker))
                os.kill(killed[0], signal.SIGKILL)

        broker.pool.submit = submit_then_kill

    config = EvalConfig(
        env_kwargs={"image_size": 32, "cameras": ["corner"]},
        EVALUATION=EvaluationConfig(agent="python", policy="tests.test_broker_sessions:stand_still", num_trials=1,
                                    max_episode_steps=12, tensorboard=False, output_dir=str(tmp_path)),
        MULTIRUN=MultirunConfig(task_sets=["wam_gym/MetaWorld-reach-v3"], env_num_per_worker=1),
    )
    manager = EvalManager(config)
    manager.on_started = kill_at_the_second_call
    summary = manager.run()
    assert len(killed) == 1
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "episodes").glob("*/*.json")]
    assert (record["attempts"], record["steps"], record["model_calls"]) == (2, 12, 3)
    assert summary["reruns"]["worker_lost"] == 1 and summary["complete"]
    assert (summary["broker"]["worker_restarts"], summary["broker"]["lost_episodes"]) == (1, 1)


# ----------------------------------------------------------------- LingBot-VA
CHUNKS = 2  # 12 + 16 actions: the second continues the episode's cache


def _frames(seed: int, steps: int) -> list[dict]:
    """One episode's observations (random frames of both cameras of the lingbot_va_libero convention)."""
    rng = np.random.default_rng(seed)
    return [{"pixels": {c: rng.integers(0, 256, (128, 128, 3), np.uint8) for c in ("agentview", "robot0_eye_in_hand")},
             "state": np.zeros(8, np.float32), "instruction": f"task {seed}"} for _ in range(steps)]


def _episode(agent, seed: int) -> np.ndarray:
    """The actions an agent executes over CHUNKS chunks of an episode seeded ``seed``."""
    agent.reset()
    agent.predictor.begin_episode(seed)
    frames = _frames(seed, 12 + 16 * (CHUNKS - 1))
    return np.stack([agent.act(obs) for obs in frames])


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from tests.conftest import load_script

    return load_script("tiny_lingbot_va_release").make(tmp_path_factory.mktemp("lingbot") / "release")


def test_lingbot_va_episodes_in_flight_on_two_workers_each_act_as_alone(release):
    """Three episodes at once on two workers (two of them share one): each executes
    exactly the actions it executes alone, in this process, with the worker's one torch thread."""
    import torch

    from agents.predictor import PolicyPredictor
    from agents.wam.lingbot_va.policy import LingBotVAPolicy
    from wam_gym.policies import release_policy

    seeds = (0, 1, 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = LingBotVAPolicy.from_release(release, "lingbot_va_libero")
        agent = MemoryChunkAgent(PolicyPredictor(policy))
        alone = {seed: _episode(agent, seed) for seed in seeds}  # one after the other
    finally:
        torch.set_num_threads(threads)
    assert policy.episodes == 1  # each reset let the episode before it go
    factory = functools.partial(release_policy, str(release), "lingbot_va_libero")
    with InferenceBroker(factory, BrokerConfig(workers_per_gpu=2, inference_batch_size=4,
                                               inference_batch_wait_ms=20)) as broker:
        together: dict[int, np.ndarray] = {}
        agents = {seed: MemoryChunkAgent(broker.client(seed)) for seed in seeds}
        runs = [threading.Thread(target=lambda s=seed: together.update({s: _episode(agents[s], s)})) for seed in seeds]
        for run in runs:
            run.start()
        for run in runs:
            run.join(timeout=300)
        assert sorted(broker.sessions.live) == [1, 2]  # three live episodes over the two workers
    for seed in seeds:
        np.testing.assert_array_equal(together[seed], alone[seed])
