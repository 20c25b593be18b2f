"""LingBot-VA's input convention (agents/wam/lingbot_va/inputs.py) against their code, transcribed here, and its
evaluation protocols (wam_gym/eval/protocols.py: lingbot_va_libero, lingbot_va_robotwin) as data, in protocol.json,
and refused where they must be. A real LIBERO frame runs in tests/suites/test_libero.py
(test_lingbot_va_libero_inputs_are_their_evaluations_for_the_same_states)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.spatial.transform import Rotation

from agents.wam.lingbot_va.inputs import CONVENTIONS, convention, settings
from tests.test_eval_protocols import SPATIAL, config, manager, recorded
from wam_gym.eval import protocols
from wam_gym.eval.protocols import PROTOCOLS
from wam_gym.eval.results import EpisodeRecord, ResultStore

LIBERO, ROBOTWIN = "lingbot_va_libero", "lingbot_va_robotwin"
ROBOTWIN_TASK = "wam_gym/RoboTwin-beat_block_hammer-v0"

# ----------------------------------------------------------------- their code, transcribed
# wan_va/configs/va_libero_cfg.py (the latest: action_snr_shift 0.05, channels 0..6) and va_robotwin_cfg.py
THEIR_LIBERO = {
    "used_action_channel_ids": list(range(0, 7)),
    "q01": [-0.6589285731315613, -0.84375, -0.9375, -0.12107142806053162, -0.15964286029338837,
            -0.26571428775787354, -1.0] + [0.] * 23,
    "q99": [0.8999999761581421, 0.8544642925262451, 0.9375, 0.17142857611179352, 0.1842857152223587,
            0.34392857551574707, 1.0] + [0.] * 23,
}
THEIR_ROBOTWIN = {
    "used_action_channel_ids": list(range(0, 7)) + list(range(28, 29)) + list(range(7, 14)) + list(range(29, 30)),
    "q01": [-0.06172713458538055, -3.6716461181640625e-05, -0.08783501386642456, -1, -1, -1, -1, -0.3547105032205582,
            -1.3113021850585938e-06, -0.11975435614585876, -1, -1, -1, -1] + [0.] * 16,
    "q99": [0.3462600058317184, 0.39966784834861746, 0.14745532035827624, 1, 1, 1, 1, 0.034201726913452024,
            0.39142737388610793, 0.1792279863357542, 1, 1, 1, 1] + [0.] * 14 + [1.0, 1.0],
}


def their_stats(cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:  # VA_Server._reset
    return (torch.tensor(cfg["q01"], dtype=torch.float32).reshape(-1, 1, 1),
            torch.tensor(cfg["q99"], dtype=torch.float32).reshape(-1, 1, 1))


def their_postprocess(cfg: dict, action: torch.Tensor) -> np.ndarray:  # VA_Server.postprocess_action
    q01, q99 = their_stats(cfg)
    action = action[0, ..., 0]
    action = (action + 1) / 2 * (q99 - q01 + 1e-6) + q01
    return action.squeeze(0).numpy()[cfg["used_action_channel_ids"]]


def their_preprocess(cfg: dict, action: np.ndarray) -> torch.Tensor:  # preprocess_action (a62fe9c), then the mask
    inverse = [len(cfg["used_action_channel_ids"])] * 30
    for i, j in enumerate(cfg["used_action_channel_ids"]):
        inverse[j] = i
    q01, q99 = their_stats(cfg)
    x = F.pad(torch.from_numpy(action), [0, 0, 0, 0, 0, 1], mode="constant", value=0)[inverse]
    x = (x - q01) / (q99 - q01 + 1e-6) * 2. - 1.
    x = x.clamp(-1.5, 1.5)
    mask = torch.zeros(30).bool()
    mask[cfg["used_action_channel_ids"]] = True
    x[~mask] *= 0
    return x


def their_client_steps(action: np.ndarray, first: bool) -> list[np.ndarray]:  # evaluation/libero/client.py run_one
    steps = []
    start_idx = 1 if first else 0
    for i in range(start_idx, action.shape[1]):
        for j in range(action.shape[2]):
            steps.append(action[:, i, j])
    return steps


def their_add_init_pose(new_pose: np.ndarray, init_pose: np.ndarray) -> np.ndarray:  # eval_polict_client_openpi.py
    def add_eef_pose(new, init):
        rot = (Rotation.from_quat(init[3:7][None]) * Rotation.from_quat(new[3:7][None])).as_quat().reshape(-1)
        return np.concatenate([new[:3] + init[:3], rot, new[7:8]])

    pose = np.concatenate([add_eef_pose(new_pose[:8], init_pose[:8]), add_eef_pose(new_pose[8:], init_pose[8:])])
    return np.concatenate([pose[:3], pose[3:7] / np.linalg.norm(pose[3:7]), pose[7:11],
                           pose[11:15] / np.linalg.norm(pose[11:15]), pose[15:16]])


def model_chunk(name: str, seed: int = 0) -> torch.Tensor:
    """A (1, 30, F, H, 1) chunk in the model's [-1, 1] units, a little beyond them as samples can be."""
    c = CONVENTIONS[name]
    return torch.empty(1, 30, c.frame_chunk_size, c.action_per_frame, 1).uniform_(
        -1.2, 1.2, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------- the action side
@pytest.mark.parametrize("first", [True, False])
def test_libero_actions_are_their_clients(first):
    inputs, chunk = convention(LIBERO), model_chunk(LIBERO)
    ours = inputs.env_actions(chunk[0, ..., 0].numpy(), first=first)
    theirs = np.stack(their_client_steps(their_postprocess(THEIR_LIBERO, chunk), first))
    np.testing.assert_array_equal(ours, theirs)  # the same float32 arithmetic
    assert ours.shape == (12 if first else 16, 7) == (inputs.chunk_steps(first), 7)
    assert ours.dtype == np.float32


def test_the_executed_chunk_goes_back_as_their_server_normalises_it():
    inputs, chunk = convention(LIBERO), model_chunk(LIBERO, seed=1)
    executed = their_postprocess(THEIR_LIBERO, chunk)  # the client's state=action
    np.testing.assert_array_equal(inputs.unnormalized(chunk[0, ..., 0].numpy()), executed)
    model = inputs.normalized(executed)
    np.testing.assert_array_equal(model, their_preprocess(THEIR_LIBERO, executed).numpy())
    np.testing.assert_allclose(model[:7], chunk[0, :7, ..., 0].numpy(), atol=1e-5)  # the round trip
    assert not model[7:].any()  # unused channels: masked
    far = executed * 3  # beyond the quantiles: clamped to +-1.5 as their server clamps them
    np.testing.assert_array_equal(inputs.normalized(far), their_preprocess(THEIR_LIBERO, far).numpy())
    assert np.abs(inputs.normalized(far)).max() == 1.5


@pytest.mark.parametrize("first", [True, False])
def test_robotwin_targets_are_their_clients(first):
    inputs, chunk = convention(ROBOTWIN), model_chunk(ROBOTWIN, seed=2)
    start = np.random.default_rng(0).normal(size=16)
    start[3:7], start[11:15] = start[3:7] / np.linalg.norm(start[3:7]), start[11:15] / np.linalg.norm(start[11:15])
    ours = inputs.env_actions(chunk[0, ..., 0].numpy(), first=first, start_pose=start)
    theirs = [their_add_init_pose(step.astype(np.float64), start)
              for step in their_client_steps(their_postprocess(THEIR_ROBOTWIN, chunk), first)]
    np.testing.assert_allclose(ours, np.stack(theirs), rtol=0, atol=1e-12)
    assert ours.shape == (16 if first else 32, 16)
    assert inputs.steps_per_key_frame == 4 and convention(LIBERO).steps_per_key_frame == 1  # client: shape[2] // 4


# ----------------------------------------------------------------- the observation side
def test_robotwin_frames_are_their_servers_t_shape_inputs():
    """RoboTwin's 240 x 320 frames: the head resized to 256 x 320, the wrists to 128 x 160 (_encode_obs, robotwin_tshape)."""
    rng = np.random.default_rng(1)
    frames = {c: rng.integers(0, 256, (3, 240, 320, 3), dtype=np.uint8) for c in CONVENTIONS[ROBOTWIN].cameras}
    video = convention(ROBOTWIN).video(frames)
    for camera, size in zip(CONVENTIONS[ROBOTWIN].cameras, ((256, 320), (128, 160), (128, 160))):
        x = torch.from_numpy(frames[camera]).float().permute(3, 0, 1, 2)
        expected = F.interpolate(x, size=size, mode="bilinear", align_corners=False) / 255.0 * 2.0 - 1.0
        assert torch.equal(video[camera], expected), camera
    assert list(video) == ["head_camera", "left_camera", "right_camera"]


def test_prompt_is_cleaned_as_their_text_encoder_cleans_it():
    assert convention(LIBERO).prompt("  put the  bowl &amp; plate\n") == "put the bowl & plate"


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.video({"agentview": np.zeros((1, 8, 8, 3), np.uint8)}),
     r"^no frames of camera 'robot0_eye_in_hand' \(got \['agentview'\]\): evaluate with its cameras"),
    (lambda c: c.video({cam: np.zeros((8, 8, 3), np.uint8) for cam in c.cameras}),
     r"^frames/agentview is uint8 \(8, 8, 3\); pass uint8 \(T, H, W, 3\), T >= 1"),
    (lambda c: c.env_actions(np.zeros((1, 30, 4, 4, 1)), first=True),
     r"^a LingBot-VA chunk is \(30, 4, 4\) .*got \(1, 30, 4, 4, 1\): drop the batch and trailing axes"),
    (lambda c: c.normalized(np.zeros((30, 4, 4))), r"^an executed chunk is \(7, frames, actions per frame\), got"),
    (lambda c: convention(ROBOTWIN).env_actions(np.zeros((30, 2, 16)), first=True),
     r"^lingbot_va_robotwin actions are relative to the episode's first end-effector pose: pass start_pose, 16 values"),
    (lambda c: convention("lingbot_va"), r"^unknown LingBot-VA input convention 'lingbot_va'; choose one of"),
])
def test_bad_inputs_name_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call(convention(LIBERO))


# ----------------------------------------------------------------- the protocols as data
def run_dir(tmp_path, name: str, protocol: str | None):
    """An output dir with protocol.json and one episode of trial 0 (its seed the protocol's), as a finished run leaves it."""
    m = manager(tmp_path, protocol=protocol, tasks=(SPATIAL,), out=name)
    recorded(m)
    ResultStore(m.plan.output_dir).write(EpisodeRecord(SPATIAL, 0, m.plan.config.EVALUATION.seed, True, steps=10, reward=1.0))
    return m.plan.output_dir


def test_lingbot_va_libero_carries_their_settings():
    p = PROTOCOLS[LIBERO]
    assert (p.suite, p.model_inputs, p.cannot_run) == ("libero", LIBERO, None)
    assert p.env_kwargs == {"cameras": ["agentview", "robot0_eye_in_hand"], "image_size": [128, 128], "settle_steps": 5,
                            "settle_action": [0.0] * 7}  # their init_single_env: env.step([0.] * 7), gripper command 0
    assert (p.replan_steps, p.action_horizon, p.action_ensembling, p.num_inference_steps) == (16, None, False, 50)
    assert p.init_state == protocols.INIT_STATE_K
    model = p.fixed()["model_inputs_settings"]
    assert model == settings(CONVENTIONS[LIBERO])  # the convention is the one source of the model side
    assert model["sampling"] == {"video_steps": 20, "action_steps": 50, "video_guidance": 5.0, "action_guidance": 1.0,
                                 "video_shift": 5.0, "action_shift": 0.05, "attn_window": 30}
    assert (model["frame_chunk_size"], model["action_per_frame"], model["channels"]) == (4, 4, list(range(7)))
    assert (model["q01"], model["q99"]) == (THEIR_LIBERO["q01"][:7], THEIR_LIBERO["q99"][:7])
    assert p.num_inference_steps == model["sampling"]["action_steps"]


def test_the_step_limit_is_their_loops():
    """Their client loops ``while env.timestep < 800`` before each chunk, robosuite counting the settle steps: the
    episode's last chunk ends at policy step 796 (the limit our episodes get), in every suite."""
    settle, inputs = PROTOCOLS[LIBERO].env_kwargs["settle_steps"], CONVENTIONS[LIBERO]
    policy_steps, first = 0, True
    while settle + policy_steps < 800:
        policy_steps += inputs.chunk_steps(first)
        first = False
    assert set(PROTOCOLS[LIBERO].max_steps.values()) == {policy_steps} == {796}
    assert (policy_steps - 12) % PROTOCOLS[LIBERO].replan_steps == 0  # a whole chunk: no chunk is cut short


def test_lingbot_va_robotwin_is_recorded_and_refused(tmp_path):
    p = PROTOCOLS[ROBOTWIN]
    assert (p.suite, p.replan_steps, p.num_inference_steps, p.max_steps) == ("robotwin", 32, 50, {})
    assert p.env_kwargs["image_size"] == [240, 320] and p.env_kwargs["instruction_type"] == "seen"
    assert p.fixed()["model_inputs_settings"]["sampling"]["attn_window"] == 72
    c = config(tmp_path, protocol=ROBOTWIN, tasks=(ROBOTWIN_TASK,))  # naming it builds a config
    assert c.env_kwargs["task_config"] == "demo_clean" and c.EVALUATION.replan_steps == 32
    with pytest.raises(ValueError, match=r"^protocol=lingbot_va_robotwin records their evaluation and "
                                         r"runs no episode yet: .*take_action\(action_type='ee'\).*\(qpos\) only; "
                                         r"leave the protocol out \(protocol=none\)$"):
        manager(tmp_path, protocol=ROBOTWIN, tasks=(ROBOTWIN_TASK,))


def test_knobs_and_tasks_against_lingbot_va_libero_are_refused(tmp_path):
    c = config(tmp_path, protocol=LIBERO)
    assert (c.EVALUATION.replan_steps, c.EVALUATION.num_inference_steps, c.env_kwargs["image_size"]) == (16, 50, [128, 128])
    with pytest.raises(ValueError, match=r"^env_kwargs\.settle_steps=10 conflicts with protocol="
                                         r"lingbot_va_libero, which fixes it to 5"):
        config(tmp_path, protocol=LIBERO, env_kwargs={"settle_steps": 10})
    with pytest.raises(ValueError, match=r"^protocol=lingbot_va_libero evaluates libero tasks"):
        manager(tmp_path, protocol=LIBERO, tasks=(ROBOTWIN_TASK,))
    assert protocols.of_convention(LIBERO) is PROTOCOLS[LIBERO]  # a served checkpoint of it replans by it


def test_protocol_json_records_the_model_side_and_compare_refuses_other_protocols(tmp_path):
    record = recorded(manager(tmp_path, protocol=LIBERO, tasks=(SPATIAL,)))["protocol"]
    assert record["protocol"] == LIBERO
    assert record["protocol_settings"] == json.loads(json.dumps(PROTOCOLS[LIBERO].fixed()))
    assert record["protocol_settings"]["model_inputs_settings"]["sampling"]["action_shift"] == 0.05
    assert record["tasks"][SPATIAL]["max_episode_steps"] == 796 and record["suites"]["libero"]["settle_steps"] == 5

    from wam_gym.compare import compare

    ours = run_dir(tmp_path, "lingbot", LIBERO)
    with pytest.raises(ValueError, match=r"ran under different protocols.*: EVALUATION\.seed is in A \(\S+\) 0, in B "
                                         r"\(\S+\) 42 \(and 6 more: env_kwargs, protocol, "):
        compare(ours, run_dir(tmp_path, "fastwam", "fastwam_libero"))
    with pytest.raises(ValueError, match=r"ran under different protocols, so their episodes are not the same episodes"):
        compare(ours, run_dir(tmp_path, "none", None))  # wam_gym's own: differs from the env kwargs on
    assert compare(ours, run_dir(tmp_path, "again", LIBERO))["overall"]["pairs"] == 1
