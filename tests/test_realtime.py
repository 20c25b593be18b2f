"""Real-time mode (issue 41): the env keeps stepping while the model thinks (agents/realtime.py).

Every test uses a fixed latency or a fake clock: outcomes, never wall-clock cadence.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from agents import make_agent
from agents.chunk_queue import ChunkQueueAgent
from agents.realtime import HOLD_RULE, Latency, RealtimeChunkAgent
from tests.test_chunk_queue import HORIZON, CountingPredictor

OBS = {"pixels": {}, "state": np.zeros(4, np.float32), "instruction": "x"}


def schedule(agent, steps: int = 20, hz: float = 10.0) -> list[tuple[int, int]]:
    """(which call's chunk, which of its actions) at each step."""
    agent.control_hz = hz
    return [tuple(int(v) for v in agent.act(OBS)[:2]) for _ in range(steps)]


def test_no_latency_is_the_synchronous_agent():
    assert schedule(RealtimeChunkAgent(CountingPredictor(), Latency(0), replan_steps=4)) == \
           schedule(ChunkQueueAgent(CountingPredictor(), replan_steps=4))


def test_the_rest_of_the_chunk_runs_while_a_call_is_in_flight_and_passed_actions_are_skipped():
    # 200 ms at 10 Hz: 2 steps. Calls every 4 steps; each new chunk takes over 2 steps late, at its action 2.
    agent = RealtimeChunkAgent(CountingPredictor(), Latency(200), replan_steps=4)
    assert schedule(agent, 12) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5),  # call 1 in flight: chunk 0 goes on
                                   (1, 2), (1, 3), (1, 4), (1, 5), (2, 2), (2, 3)]
    assert agent.num_model_calls == 3 and agent.held_steps == 0


def test_a_call_longer_than_the_chunk_holds_its_last_action_and_calls_wait_for_each_other():
    # 500 ms at 10 Hz: 5 steps > replan 4: one call in flight at a time, every 5 steps; chunk 0 runs out at step 6.
    agent = RealtimeChunkAgent(CountingPredictor(), Latency(500), replan_steps=4)
    assert schedule(agent, 11) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 5), (0, 5), (0, 5),
                                   (1, 5), (1, 5)]
    assert agent.held_steps == 4  # steps 6-8 repeat chunk 0's last action, step 10 chunk 1's
    assert agent.num_model_calls == 3  # at steps 0, 4 and 9


def test_a_measured_latency_is_the_calls_own_time(monkeypatch):
    clock = iter([0.0, 0.0, 10.0, 10.3])  # the first call is awaited (any time); the second takes 0.3 s
    monkeypatch.setattr("agents.realtime.time.perf_counter", lambda: next(clock))
    agent = RealtimeChunkAgent(CountingPredictor(), Latency(), replan_steps=4)
    assert schedule(agent, 8) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 5), (1, 3)]  # 3 steps late


def test_it_reads_pixels_only_when_it_calls_and_refuses_what_it_cannot_time():
    agent = RealtimeChunkAgent(CountingPredictor(), Latency(200), replan_steps=4)
    with pytest.raises(ValueError, match="control_hz"):
        agent.act(OBS)
    agent.control_hz = 10.0
    reads = []
    for _ in range(9):
        reads.append(agent.reads_pixels())
        agent.act(OBS)
    assert reads == [True, False, False, False, True, False, False, False, True]
    with pytest.raises(ValueError, match="one env"):
        agent.act({**OBS, "state": np.zeros((2, 4), np.float32), "instruction": ["x", "x"]})
    assert isinstance(make_agent("wam", predictor=CountingPredictor(), latency=Latency(0)), RealtimeChunkAgent)
    assert HORIZON == 6


def test_realtime_eval_records_its_timing_and_is_never_compared_with_a_synchronous_run(tmp_path, tiny_ckpt):
    pytest.importorskip("metaworld")
    from tests.test_eval import records, run, wam_config
    from wam_gym.eval.run_protocol import check_comparable, load

    sync, zero, late = tmp_path / "sync", tmp_path / "zero", tmp_path / "late"
    exact = {"batch_invariant": True}  # actions to the last bit, however requests batch
    run(wam_config(sync, tiny_ckpt, max_episode_steps=16, replan_steps=4, multirun=exact))
    run(wam_config(zero, tiny_ckpt, max_episode_steps=16, replan_steps=4, realtime=True, latency_ms=0, multirun=exact))
    run(wam_config(late, tiny_ckpt, max_episode_steps=16, replan_steps=4, realtime=True, latency_ms=100))
    varying = {"wall_time_s", "model_s", "env_s"}
    same = [{k: v for k, v in r.items() if k not in varying} for r in records(sync).values()]
    assert same == [{k: v for k, v in r.items() if k not in varying} for r in records(zero).values()]
    assert json.loads((late / "protocol.json").read_text())["protocol"]["timing"] == {
        "mode": "realtime", "latency": "fixed 100 ms", "hold": HOLD_RULE,
        "control_rate": "each suite's simulator's (env.unwrapped.control_hz)"}
    assert json.loads((sync / "protocol.json").read_text())["protocol"]["timing"] == {"mode": "synchronous"}
    with pytest.raises(Exception, match="timing"):
        check_comparable(load(sync), load(late), "sync", "late")
    # 100 ms at Meta-World's 80 Hz is 8 steps: calls at steps 0, 4 and 12 (one in flight at a time), not every 4
    assert [r["model_calls"] for r in records(late).values()] == [3, 3]
    assert [r["model_calls"] for r in records(sync).values()] == [4, 4]


# ----------------------------------------------------------------- strategies (issue 55)
class EchoPrefix(CountingPredictor):
    """CountingPredictor that records each call's RTC entries and, as an RTC model must, returns the committed
    actions first."""

    def __init__(self):
        super().__init__()
        self.requests: list = []

    def predict(self, obs, noise_seeds=None):
        from agents import rtc

        prediction = super().predict(obs, noise_seeds)
        request = rtc.Request.of(obs, 1, HORIZON, 4)
        self.requests.append(None if request is None else (int(request.delay[0]), int(request.overlap[0]),
                                                           [tuple(int(v) for v in a[:2]) for a in request.prefix[0]]))
        return type(prediction)(rtc.commit(prediction.actions, request))


def test_naive_calls_early_enough_not_to_hold_where_hold_holds():
    # 400 ms at 10 Hz: 4 steps, replan 4, horizon 6: hold's calls every 4 steps, its chunks run out at 6 and hold;
    # naive calls every min(4, 6 - 4) = 2... but never while one is in flight: every 4 too. With 300 ms (3 steps):
    hold = RealtimeChunkAgent(CountingPredictor(), Latency(300), replan_steps=5, strategy="hold")
    naive = RealtimeChunkAgent(CountingPredictor(), Latency(300), replan_steps=5, strategy="naive")
    assert schedule(hold, 10) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 5), (0, 5), (1, 3), (1, 4)]
    assert schedule(naive, 10) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 3), (1, 4), (1, 5), (2, 3)]
    assert hold.held_steps == 2 and naive.held_steps == 0  # naive calls at 0, 3, 6: each arrives before a chunk ends


def test_ensemble_averages_every_arrived_chunks_action_for_the_step_oldest_weighted_most():
    # 100 ms at 10 Hz: 1 step. Calls at 0 (awaited), 2 and 4, each arriving a step later
    agent = RealtimeChunkAgent(CountingPredictor(), Latency(100), replan_steps=2, strategy="ensemble")
    agent.control_hz = 10.0
    out = np.stack([agent.act(OBS)[:2] for _ in range(6)])
    w = np.exp(-0.01 * np.arange(3))
    two, three = w[:2] / w[:2].sum(), w / w.sum()
    # step 3: chunk 0's action 3 and chunk 1's (asked at 2) action 1; step 5: chunks 0, 1, 2: actions 5, 3, 1
    expected = [[0, 0], [0, 1], [0, 2], two @ [[0, 3], [1, 1]], two @ [[0, 4], [1, 2]], three @ [[0, 5], [1, 3], [2, 1]]]
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert agent.num_model_calls == 3 and agent.held_steps == 0


def test_rtc_calls_carry_the_committed_actions_and_the_new_chunk_continues_them():
    predictor = EchoPrefix()
    agent = RealtimeChunkAgent(predictor, Latency(200), replan_steps=3, strategy="rtc")
    # calls at 0 (plain, awaited) and 3 (d = 2: chunk 0's actions 3, 4 run meanwhile and are committed; the overlap
    # is its rest, 3..5), arriving at 5 with its first two actions overwritten by chunk 0's 3 and 4 (EchoPrefix does
    # what an RTC model does); at 5 it runs its action 2
    assert schedule(agent, 8) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
    assert predictor.requests[0] is None
    delay, overlap, prefix = predictor.requests[1]
    assert (delay, overlap, prefix[:overlap]) == (2, 3, [(0, 3), (0, 4), (0, 5)])
    assert agent._chunks[-1].actions[:3, :2].tolist() == [[0, 3], [0, 4], [1, 2]]  # chunk 1: committed, then its own
    # the call at 6 (every min(3, 6 - 2) steps): chunk 1 asked at 3 runs actions 3 and 4 meanwhile: committed
    assert predictor.requests[2][:2] == (2, 3) and predictor.requests[2][2][:2] == [(1, 3), (1, 4)]


def test_rtc_is_refused_where_no_sampler_can_continue_a_prefix():
    with pytest.raises(ValueError, match="realtime_strategy=rtc .* agent=wam, or realtime_strategy=hold"):
        make_agent("remote", predictor=CountingPredictor(), latency=Latency(0), realtime_strategy="rtc")
    with pytest.raises(ValueError, match="realtime_strategy='smooth': choose one of hold, naive, ensemble, rtc"):
        RealtimeChunkAgent(CountingPredictor(), Latency(0), strategy="smooth")


def test_the_strategy_is_a_knob_recorded_in_the_protocol_and_runs_of_different_strategies_never_pair():
    from wam_gym.eval.config import EvaluationConfig
    from wam_gym.eval.run_protocol import check_comparable, timing

    with pytest.raises(ValueError, match="realtime_strategy=rtc merges .* add EVALUATION.realtime=true"):
        EvaluationConfig(agent="random", realtime_strategy="rtc")
    with pytest.raises(ValueError, match="realtime_strategy='smooth': choose one of hold, naive, ensemble, rtc"):
        EvaluationConfig(agent="wam", realtime=True, realtime_strategy="smooth")
    with pytest.raises(ValueError, match="realtime_strategy=rtc .* agent=wam"):
        EvaluationConfig(agent="python", realtime=True, realtime_strategy="rtc")
    hold, rtc_run = (timing(EvaluationConfig(agent="wam", realtime=True, latency_ms=200, realtime_strategy=s))
                     for s in ("hold", "rtc"))
    assert "strategy" not in hold and rtc_run["strategy"] == "rtc"  # hold's record is the one written before strategies
    with pytest.raises(ValueError, match="different protocols.*strategy"):
        check_comparable({"protocol": {"timing": hold}}, {"protocol": {"timing": rtc_run}}, "a", "b")
    slower = timing(EvaluationConfig(agent="wam", realtime=True, latency_ms=300, realtime_strategy="rtc"))
    with pytest.raises(ValueError, match="different protocols.*latency"):
        check_comparable({"protocol": {"timing": rtc_run}}, {"protocol": {"timing": slower}}, "a", "b")
