"""Real-time chunking inside each flow-matching WAM's sampler (issue 55; agents/rtc.py, agents/wam/rtc.py).

For the MoT, FastWAM and LingBot-VA (tiny random-weight models): the committed prefix comes back bit for bit,
a call with nothing committed is the plain sampler's bit for bit (same noise seeds), rows with different delays
share a call (through the broker too) and answer as alone, and the guidance pulls the new chunk toward the
current one (the jump at the boundary shrinks).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from agents import rtc
from agents.wam.inference_config import InferenceConfig, SamplerConfig
from agents.wam.mot.checkpoint import build_model
from agents.wam.mot.config import preset
from agents.wam.mot.policy import MoTPolicy
from agents.wam.rtc import guidance_weight
from envs.protocol import select_rows
from tests.test_chunk_queue import observation

SEEDS = [11, 12, 13]


def with_rtc(obs: dict, rests: list, delays: list[int], horizon: int, action_dim: int) -> dict:
    """``obs`` with each row's RTC entries (``rests[i]``: the current chunk's actions from this step on, or None)."""
    rows = [rtc.entries(rest, d, horizon, action_dim) for rest, d in zip(rests, delays)]
    return {**obs, **{key: np.stack([row[key] for row in rows]) for key in rtc.KEYS}}


def three(obs: dict) -> dict:
    return select_rows(obs, [0, 1, 1])


def mot_policy() -> MoTPolicy:
    torch.manual_seed(0)
    return MoTPolicy(build_model(preset("tiny")), InferenceConfig(sampler=SamplerConfig(num_inference_steps=4)))


@pytest.fixture(scope="module")
def mot() -> MoTPolicy:
    return mot_policy()


def previous(horizon: int, action_dim: int, rows: int = 3) -> np.ndarray:
    """Each row's current chunk: a smooth ramp (a jump at the boundary is then the new chunk's doing)."""
    rng = np.random.default_rng(5)
    ramp = np.linspace(0, 1, horizon)[None, :, None] * rng.uniform(-1, 1, (rows, 1, action_dim))
    return (ramp + rng.uniform(-0.3, 0.3, (rows, 1, action_dim))).astype(np.float32)


# ----------------------------------------------------------------- the soft mask
def test_the_soft_mask_is_the_papers():
    # d = 2, 6 actions overlap, horizon 8: 1, 1, then c (e^c - 1) / (e - 1) with c = (6 - i) / 5, then 0, 0
    c = np.array([4, 3, 2, 1]) / 5
    expected = [1, 1, *(c * np.expm1(c) / (math.e - 1)), 0, 0]
    np.testing.assert_allclose(rtc.soft_mask(2, 6, 8), expected, rtol=1e-6)
    assert rtc.soft_mask(2, 6, 8, rtc.RTCConfig(schedule="zeros")).tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert rtc.soft_mask(0, 6, 8, rtc.RTCConfig(schedule="ones", execution_horizon=4)).tolist() == [1] * 4 + [0] * 4
    assert rtc.soft_mask(0, 0, 4).tolist() == [0] * 4
    # the weight is the paper's (1 - tau) / (tau r^2) at tau = 1 - sigma, clipped at beta: 2 at sigma 1/2
    assert guidance_weight(torch.tensor([0.5, 1.0, 0.0, 0.9]), 5.0).tolist() == pytest.approx([2.0, 5.0, 5.0, 5.0])


def test_bad_knobs_and_entries_are_refused_naming_them():
    with pytest.raises(ValueError, match="max_guidance_weight=0"):
        rtc.RTCConfig(max_guidance_weight=0)
    with pytest.raises(ValueError, match="schedule='cosine'"):
        rtc.RTCConfig(schedule="cosine")
    with pytest.raises(ValueError, match="rtc_delay=3 commits more"):
        rtc.entries(np.zeros((2, 4)), 3, 8, 4)
    obs = with_rtc(observation(), [None, None], [0, 0], 8, 4)
    with pytest.raises(ValueError, match=r"padded to the model's action_horizon"):
        rtc.Request.of(obs, 2, 16, 4)
    with pytest.raises(ValueError, match="has only"):
        rtc.Request.of({rtc.DELAY: np.zeros(2)}, 2, 16, 4)


# ----------------------------------------------------------------- MoT
def test_mot_nothing_committed_is_the_plain_sampler_bit_for_bit(mot):
    obs, (h, a) = three(observation()), (mot.action_horizon, mot.model.config.action_dim)
    plain = mot.predict(obs, SEEDS).actions
    assert np.array_equal(mot.predict(with_rtc(obs, [None] * 3, [0] * 3, h, a), SEEDS).actions, plain)


def test_mot_committed_prefix_is_exact_with_its_own_delay_per_row(mot):
    obs, (h, a) = three(observation()), (mot.action_horizon, mot.model.config.action_dim)
    prev = previous(h, a)
    delays = [3, 0, 5]
    batch = mot.predict(with_rtc(obs, [p[4:] for p in prev], delays, h, a), SEEDS).actions
    for row, d in enumerate(delays):
        assert np.array_equal(batch[row, :d], prev[row, 4 : 4 + d])
        alone = mot.predict(with_rtc(select_rows(obs, [row]), [prev[row, 4:]], [d], h, a), SEEDS[row : row + 1]).actions
        np.testing.assert_allclose(batch[row], alone[0], atol=1e-5)  # batched equals alone, as any call


def boundary_jump(policy, obs: dict, delay: int, start: int = 4) -> tuple[float, float]:
    """Mean |new[d] - committed[d - 1]| over rows: (naive switch to the plain chunk, RTC's chunk)."""
    h, a = policy.action_horizon, policy_action_dim(policy)
    prev = previous(h, a, rows=len(SEEDS))
    plain = policy.predict(obs, SEEDS).actions
    guided = policy.predict(with_rtc(obs, [p[start:] for p in prev], [delay] * len(SEEDS), h, a), SEEDS).actions
    before = prev[:, start + delay - 1]
    return float(np.abs(plain[:, delay] - before).mean()), float(np.abs(guided[:, delay] - before).mean())


def policy_action_dim(policy) -> int:
    return policy.model.config.action_dim if hasattr(policy.model, "config") else len(policy.inputs.channels)


def test_mot_guidance_shrinks_the_jump_at_the_chunk_boundary(mot):
    naive, guided = boundary_jump(mot, three(observation()), delay=3)
    print(f"MoT tiny: boundary jump naive {naive:.3f}, RTC {guided:.3f}")
    assert guided < 0.5 * naive


# ----------------------------------------------------------------- FastWAM
@pytest.fixture(scope="module")
def fastwam(tmp_path_factory):
    """The tiny FastWAM of tests/test_fastwam_policy.py (their LIBERO convention and statistics)."""
    from agents.wam.fastwam.checkpoint import save_fastwam
    from agents.wam.fastwam.config import preset as fastwam_preset
    from agents.wam.fastwam.inputs import convention
    from agents.wam.fastwam.model import FastWAM
    from agents.wam.fastwam.policy import FastWAMPolicy
    from tests.test_fastwam_policy import CAMERAS, their_stats

    torch.manual_seed(0)
    config = fastwam_preset("fastwam_tiny", cameras=CAMERAS, image_size=(32, 32), inputs=convention("fastwam_libero"))
    root = save_fastwam(FastWAM(config), tmp_path_factory.mktemp("fastwam") / "ckpt", encoders=True)
    (root / "dataset_stats.json").write_text(json.dumps(their_stats(np.random.default_rng(0))))
    return FastWAMPolicy.from_checkpoint(root, InferenceConfig(sampler=SamplerConfig(num_inference_steps=3)))


def fastwam_obs() -> dict:
    from tests.test_fastwam_policy import libero_obs

    return libero_obs(np.random.default_rng(1), 3, size=32)


def test_fastwam_plain_at_nothing_committed_exact_prefix_and_smaller_jump(fastwam):
    obs, (h, a) = fastwam_obs(), (fastwam.action_horizon, fastwam.model.config.action_dim)
    plain = fastwam.predict(obs, SEEDS).actions
    assert np.array_equal(fastwam.predict(with_rtc(obs, [None] * 3, [0] * 3, h, a), SEEDS).actions, plain)
    prev = previous(h, a)
    delays = [2, 0, 4]
    batch = fastwam.predict(with_rtc(obs, [p[3:] for p in prev], delays, h, a), SEEDS).actions
    for row, d in enumerate(delays):
        assert np.array_equal(batch[row, :d], prev[row, 3 : 3 + d])
        alone = fastwam.predict(with_rtc(select_rows(obs, [row]), [prev[row, 3:]], [d], h, a), SEEDS[row : row + 1])
        np.testing.assert_allclose(batch[row], alone.actions[0], atol=1e-5)
    naive, guided = boundary_jump(fastwam, obs, delay=2, start=3)
    print(f"FastWAM tiny: boundary jump naive {naive:.3f}, RTC {guided:.3f}")
    assert guided < 0.7 * naive


# ----------------------------------------------------------------- LingBot-VA
def lingbot_calls(policy, io, rtc_rows: list | None) -> np.ndarray:
    """Episode ``a`` of the parity fixture: its first chunk, then its second, whose call carries ``rtc_rows``
    ((rest, delay) per call, or None: a plain call). The second chunk's actions."""
    from agents.episode_memory import EPISODE, SEEN
    from tests.test_lingbot_va_policy import CAMERAS, EPISODES

    frames = io["a.frames"].numpy()

    def call(step: int, seen: np.ndarray) -> dict:
        return {"pixels": {c: frames[step, i][None] for i, c in enumerate(CAMERAS)}, "state": np.zeros((1, 8), np.float32),
                "instruction": ("put the bowl on the plate",), EPISODE: np.array([7]),
                SEEN: {c: seen[:, i][None] for i, c in enumerate(CAMERAS)}}

    first = policy.predict(call(0, frames[:0]), [EPISODES["a"]["seed"]]).actions[0]
    obs = call(len(first), frames[1 : 1 + len(first)])
    if rtc_rows is not None:
        (rest, delay), = rtc_rows
        obs = with_rtc(obs, [rest], [delay], policy.action_horizon, len(policy.inputs.channels))
    return policy.predict(obs).actions[0]


def test_lingbot_va_plain_at_nothing_committed_exact_prefix_and_smaller_jump():
    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file

    from tests.test_lingbot_va_policy import FIXTURE, _policy, load_transformer

    io = load_file(str(FIXTURE / "io.safetensors"))
    parts = load_transformer(FIXTURE / "transformer"), AutoencoderKLWan.from_pretrained(FIXTURE / "vae").eval()
    plain = lingbot_calls(_policy(io, parts, "a"), io, None)
    assert np.array_equal(lingbot_calls(_policy(io, parts, "a"), io, [(None, 0)]), plain)
    policy = _policy(io, parts, "a")
    prev = previous(policy.action_horizon, len(policy.inputs.channels), rows=1)[0]
    q01, q99 = np.array(policy.inputs.q01), np.array(policy.inputs.q99)
    prev = (q01 + (prev + 1) / 2 * (q99 - q01)).astype(np.float32)  # in the robot's range
    guided = lingbot_calls(policy, io, [(prev[2:], 2)])
    assert np.array_equal(guided[:2], prev[2:4])
    scale = q99 - q01
    naive_jump, rtc_jump = (float(np.abs((chunk[2] - prev[3]) / scale).mean()) for chunk in (plain, guided))
    print(f"LingBot-VA tiny: boundary jump naive {naive_jump:.3f}, RTC {rtc_jump:.3f} (in units of q99 - q01)")
    assert rtc_jump < naive_jump


# ----------------------------------------------------------------- through the broker
def mot_worker(device: str) -> MoTPolicy:
    """The broker's model worker: the same tiny MoT as :func:`mot_policy` (spawned: this module is imported there)."""
    return mot_policy()


def test_rows_with_different_delays_batch_through_the_broker_and_answer_as_alone(mot):
    """RTC's entries are observation keys: the broker batches and routes them unchanged (no protocol change)."""
    import threading

    from wam_gym.broker import BrokerConfig, InferenceBroker

    obs, (h, a) = three(observation()), (mot.action_horizon, mot.model.config.action_dim)
    prev = previous(h, a)
    delays = [3, 0, 5]
    rows = [select_rows(with_rtc(obs, [p[4:] for p in prev], delays, h, a), [i]) for i in range(3)]
    got: dict = {}
    config = BrokerConfig(workers_per_gpu=1, inference_batch_size=3, inference_batch_wait_ms=5000)
    with InferenceBroker(mot_worker, config) as broker:
        clients = [broker.client(i) for i in range(3)]

        def ask(i: int) -> None:
            got[i] = clients[i].predict(rows[i], [SEEDS[i]]).actions[0]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert broker.stats.batch_sizes[-1] == 3  # one call held the three delays
    for i, d in enumerate(delays):
        assert np.array_equal(got[i][:d], prev[i, 4 : 4 + d])
        np.testing.assert_allclose(got[i], mot.predict(rows[i], [SEEDS[i]]).actions[0], atol=1e-5)
