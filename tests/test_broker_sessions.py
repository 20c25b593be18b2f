"""Episodes as sessions in the broker: a model that remembers episodes (agents.policy.EpisodicPolicy) has each
episode's calls served by the one model worker that holds its state, from its first call until it is released; a
worker that dies loses its episodes, whose next calls fail with EpisodeLost, while the other worker's go on. A
worker holds no more episodes than its model's episode_capacity: a new episode past that waits until one ends.

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_broker import wait_for

from agents.episode_memory import EPISODE, SEEN, MemoryChunkAgent
from agents.policy import EpisodicPolicy
from wam_gym.broker import BrokerConfig, BrokerError, EpisodeLost, InferenceBroker, RemoteInferenceError
from wam_gym.broker.batching import Request
from wam_gym.broker.sessions import SessionRegistry

CONFIG = BrokerConfig(workers_per_gpu=2, inference_batch_size=4, inference_batch_wait_ms=50)


class Remembering(EpisodicPolicy):
    """A stand-in for a model that remembers episodes. A row whose state[0] is 0 starts its episode, any other
    continues it and is refused unless this worker holds the episode (as LingBotVAPolicy refuses one whose cache
    it does not hold), and refuses one that would make it hold more than ``episode_capacity`` episodes; rows are
    checked before any is counted, so a refused call changes nothing. A row whose state[1] is 1 waits until
    ``<directory>/release`` exists, its worker's pid in ``<directory>/held``. Each row's chunk is (this worker's
    pid, the episode's calls so far, the episodes this worker holds)."""

    action_horizon = 2

    def __init__(self, directory: Path, episode_capacity: int = 16):
        self.directory = Path(directory)
        self.episode_capacity = episode_capacity
        self.calls: dict[int, int] = {}  # episode -> its calls so far, on this worker

    def __call__(self, device: str) -> Remembering:
        return self

    def predict(self, obs, noise_seeds=None):
        episodes, state = [int(e) for e in obs[EPISODE]], obs["state"]
        for episode, row in zip(episodes, state):
            if row[0] > 0 and episode not in self.calls:
                raise ValueError(f"episode {episode} continues but its state is not held here: restart the episode")
        holding = len(self.calls.keys() | set(episodes))
        if holding > self.episode_capacity:
            raise ValueError(f"this call would make the worker hold {holding} episodes, more than its capacity "
                             f"{self.episode_capacity}")
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


# ----------------------------------------------------------------- episode capacity
def holding(directory: Path, capacities: list[int]) -> InferenceBroker:
    """A broker of ``len(capacities)`` workers, worker i's model holding ``capacities[i]`` episodes at most (each
    worker is started with a factory of its own)."""
    broker = InferenceBroker(Remembering(directory), BrokerConfig(workers_per_gpu=len(capacities),
                                                                  inference_batch_size=4, inference_batch_wait_ms=20))
    start = broker.pool.start

    def start_worker(i: int) -> None:
        broker.pool.factory = Remembering(directory, capacities[i])
        start(i)

    broker.pool.start = start_worker
    return broker


def waiting(broker: InferenceBroker, n: int) -> None:
    wait_for(lambda: broker.sessions.waiting == n, f"{n} first call(s) to wait for room", timeout=30)


def test_a_worker_holds_no_more_episodes_than_its_capacity_and_new_ones_wait_for_room(tmp_path):
    """One worker of capacity 2, three actors: the third actor's first episode waits (the live episodes go on
    meanwhile) and is answered once an episode is released; the model itself refuses a third episode, so every
    call succeeding shows the broker never placed one."""
    with holding(tmp_path, [2]) as broker, ThreadPoolExecutor(2) as pool:
        assert broker.episode_capacity == [2] and broker.stats.summary()["episode_capacity"] == [2]
        a, b, c = (broker.client(i) for i in range(3))
        assert call(a, 1, 0)[1:] == (1, 1) and call(b, 2, 0)[1:] == (1, 2)
        third = pool.submit(call, c, 3, 0)
        waiting(broker, 1)
        assert call(a, 1, 1)[1:] == (2, 2) and call(b, 2, 1)[1:] == (2, 2)  # the live ones go on meanwhile
        assert not third.done()
        a.release_episode(1)
        assert third.result(timeout=60)[1:] == (1, 2)  # placed once episode 1 was let go: the worker holds 2 and 3
        fourth = pool.submit(call, a, 4, 0)  # a's next episode: the worker is full again
        waiting(broker, 1)
        assert call(c, 3, 1)[1:] == (2, 2) and not fourth.done()
        b.release_episode(2)
        assert fourth.result(timeout=60)[1:] == (1, 2)
        assert broker.sessions.live == [2] and broker.sessions.waiting == 0
        summary = broker.stats.summary()
        assert summary["waited_episodes"] == 2 and summary["admission_wait_ms_max"] > 0


def test_new_episodes_fill_the_workers_by_their_capacities_then_wait(tmp_path):
    """Workers of capacities 1 and 3: four episodes started at once are all placed, one on worker 0 and three on
    worker 1; a fifth waits, and takes worker 0's room when its episode is released."""
    with holding(tmp_path, [1, 3]) as broker, ThreadPoolExecutor(4) as pool:
        assert broker.episode_capacity == [1, 3]
        worker = {broker.pool.pid(w): w for w in range(2)}
        clients = [broker.client(i) for i in range(5)]
        firsts = [pool.submit(call, clients[i], 10 + i, 0) for i in range(4)]
        placed = {10 + i: worker[f.result(timeout=60)[0]] for i, f in enumerate(firsts)}
        assert sorted(placed.values()) == [0, 1, 1, 1] and broker.sessions.live == [1, 3]
        fifth = pool.submit(call, clients[4], 14, 0)
        waiting(broker, 1)
        assert not fifth.done() and broker.stats.waited_episodes == 1
        (on_0,) = [episode for episode, w in placed.items() if w == 0]
        clients[on_0 - 10].release_episode(on_0)
        pid, calls, held = fifth.result(timeout=60)
        assert (worker[pid], calls, held) == (0, 1, 1) and broker.sessions.live == [1, 3]


def test_an_actor_gone_while_its_first_call_waits_is_dropped_and_the_next_one_takes_the_room(tmp_path):
    """One worker of capacity 1 holds a's episode; b's first call waits, then c's behind it. b goes away: its call
    leaves the queue (b's client sees the broker gone for it), and when a's episode is released, c's is placed."""
    with holding(tmp_path, [1]) as broker, ThreadPoolExecutor(2) as pool:
        a, b, c = (broker.client(i) for i in range(3))
        assert call(a, 1, 0)[1:] == (1, 1)
        b_first = pool.submit(call, b, 2, 0)
        waiting(broker, 1)
        c_first = pool.submit(call, c, 3, 0)
        waiting(broker, 2)
        broker.forget_actor(1)
        waiting(broker, 1)
        with pytest.raises(BrokerError):
            b_first.result(timeout=60)
        a.release_episode(1)
        assert c_first.result(timeout=60)[1:] == (1, 1)  # b's episode never took the room
        assert broker.sessions.live == [1] and broker.sessions.waiting == 0


def test_the_registry_admits_waiting_first_calls_in_arrival_order_and_refuses_a_second_call_of_one():
    """The session registry alone: capacities 1 and 1; a second call of an episode still waiting (MemoryChunkAgent
    never sends one: it waits for each answer) is refused in one line, as is another actor's use of its id."""
    sessions = SessionRegistry(2)
    sessions.set_capacity(0, 1)
    sessions.set_capacity(1, 1)

    def request(actor: int) -> Request:
        return Request(actor, 0, {}, None, time.monotonic())

    first = {episode: request(actor) for actor, episode in ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5))}
    assert [sessions.route(first[e], e) for e in first] == [0, 1, None, None, None]
    with pytest.raises(RemoteInferenceError, match="^episode 3 is still waiting for room on a model worker: its"):
        sessions.route(request(2), 3)
    with pytest.raises(RemoteInferenceError, match="^episode 3 belongs to another client"):
        sessions.route(request(0), 3)
    assert sessions.admit() == [] and sessions.waiting == 3
    assert sessions.forget_actor(3) == {} and sessions.waiting == 2  # episode 4 waited: dropped, nothing to let go
    assert sessions.release(1, 2) == {1: [2]}
    assert sessions.admit() == [(first[3], 1)]  # the first to arrive, on the worker with room
    assert sessions.route(request(2), 3) == 1  # placed: its next calls go there
    assert sessions.lose_worker(0, "died") == [1]
    assert sessions.admit() == [(first[5], 0)] and sessions.waiting == 0
    assert sessions.live == [1, 1]


# ----------------------------------------------------------------- evaluation
class StandStill(EpisodicPolicy):
    """A model that remembers Meta-World episodes and answers chunks of 4 zero actions; like LingBotVAPolicy it
    refuses a call that continues (frames were seen since its last) an episode it does not hold."""

    action_horizon = 4
    episode_capacity = 16

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
