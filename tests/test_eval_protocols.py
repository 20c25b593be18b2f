"""Named evaluation protocols (the config group protocol=NAME, wam_gym/eval/protocols.py), without a simulator: the
registry, how a protocol meets the user's knobs, the checkpoint's input convention, what protocol.json
records, and compare / resume refusing runs under another protocol. The env side runs in
tests/suites/test_libero.py (settle steps, the per-suite step limit reaching the actor)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from wam_gym.eval import protocols
from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
from wam_gym.eval.errors import ResumeMismatch
from wam_gym.eval.protocols import PROTOCOLS
from wam_gym.eval.results import EpisodeRecord, ResultStore
from wam_gym.eval.run_protocol import PROTOCOL_FILE
from wam_gym.remote.config import RemoteConfig

FASTWAM = "fastwam_libero"
SPATIAL, LIBERO_10, PRO_10 = "wam_gym/LIBERO-Spatial-v0:0", "wam_gym/LIBERO-10-v0:0", "wam_gym/LIBERO-Pro-10-Swap-v0:0"
REACH = "wam_gym/MetaWorld-reach-v3"


def config(tmp_path: Path, protocol: str | None = FASTWAM, tasks=(SPATIAL, LIBERO_10), env_kwargs=None, ckpt=None,
           out: str = "out", remote: dict | None = None, **evaluation) -> EvalConfig:
    """As ``python -m wam_gym.eval protocol=PROTOCOL`` with these overrides composes it: the group's settings,
    then the overrides (protocols.overlay)."""
    preset = protocols.overlay(protocols.named(protocol))
    evaluation = {"agent": "random", "num_trials": 3, "tensorboard": False, "output_dir": str(tmp_path / out),
                  **preset.get("EVALUATION", {}), **evaluation}
    return EvalConfig(benchmark="libero", ckpt=ckpt, protocol=protocol,
                      env_kwargs={**preset.get("env_kwargs", {}), **(env_kwargs or {})},
                      EVALUATION=EvaluationConfig(**evaluation), MULTIRUN=MultirunConfig(task_sets=list(tasks)),
                      REMOTE=RemoteConfig(**(remote or {})))


def manager(*args, **kwargs):
    from wam_gym.eval.manager import EvalManager

    return EvalManager(config(*args, **kwargs))


def recorded(m) -> dict:
    """The protocol.json ``m`` writes when its output dir holds no episodes yet."""
    m.plan.protocol.resume(has_episodes=False, allow=False)
    return json.loads((m.plan.output_dir / PROTOCOL_FILE).read_text())


# ----------------------------------------------------------------- the registry
def test_fastwam_libero_carries_their_benchmark_side():
    p = PROTOCOLS[FASTWAM]
    assert protocols.named(FASTWAM) is p and protocols.named(None) is None
    assert (p.name, p.suite, p.model_inputs) == (FASTWAM, "libero", FASTWAM)
    assert p.env_kwargs == {"cameras": ["agentview", "robot0_eye_in_hand"], "image_size": [256, 256], "settle_steps": 30}
    assert p.max_steps == {"libero_spatial": 400, "libero_object": 400, "libero_goal": 400, "libero_10": 700,
                           "libero_90": 700}
    assert (p.replan_steps, p.action_horizon, p.action_ensembling) == (10, None, False)
    assert (p.num_inference_steps, p.seed, p.init_state) == (10, 42, "init state k for trial k")
    assert set(p.fixed()) == {f.name for f in dataclasses.fields(p)} - {"name"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.seed = 0  # plain data, shared by every run


@pytest.mark.parametrize(("env_id", "steps"), [
    ("wam_gym/LIBERO-Spatial-v0", 400), ("wam_gym/LIBERO-Object-v0", 400), ("wam_gym/LIBERO-Goal-v0", 400),
    ("wam_gym/LIBERO-10-v0", 700), ("wam_gym/LIBERO-90-v0", 700),
    ("wam_gym/LIBERO-Pro-Spatial-Swap-v0", 400), ("wam_gym/LIBERO-Pro-10-Task-v0", 700),  # LIBERO-Pro: the base's
])
def test_step_limits_per_suite(env_id, steps):
    assert PROTOCOLS[FASTWAM].max_steps_for(env_id) == steps
    assert protocols.episode_steps(EvaluationConfig(), PROTOCOLS[FASTWAM], env_id) == steps
    assert protocols.episode_steps(EvaluationConfig(), None, env_id) < steps  # ours (openpi's) are shorter


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"^protocol='fastwam' is not a known protocol: choose one of "
                                         r"\['fastwam_libero', 'lingbot_va_libero', 'lingbot_va_robotwin'\], or none"):
        EvalConfig(protocol="fastwam")


def test_null_changes_nothing(tmp_path):
    c = config(tmp_path, protocol=None)
    defaults = EvaluationConfig()
    assert c.env_kwargs == {} and c.EVALUATION.max_episode_steps is None
    assert [getattr(c.EVALUATION, k) for k in protocols.FIXED_KNOBS] == [getattr(defaults, k) for k in protocols.FIXED_KNOBS]
    record = recorded(manager(tmp_path, protocol=None))
    assert "protocol" not in record["protocol"] and "protocol_settings" not in record["protocol"]
    assert record["protocol"]["suites"]["libero"]["settle_steps"] == 10
    assert record["protocol"]["tasks"][SPATIAL]["max_episode_steps"] == 220


# ----------------------------------------------------------------- the user's knobs
def test_protocol_sets_its_knobs(tmp_path):
    c = config(tmp_path, env_kwargs={"render_mode": "rgb_array"})
    ev = c.EVALUATION
    assert (ev.replan_steps, ev.action_horizon, ev.num_inference_steps, ev.seed) == (10, None, 10, 42)
    assert c.env_kwargs == {"render_mode": "rgb_array", "cameras": ["agentview", "robot0_eye_in_hand"],
                            "image_size": [256, 256], "settle_steps": 30}
    c.env_kwargs["cameras"].append("x")  # a run's copy: the registry's stays as it is
    assert PROTOCOLS[FASTWAM].env_kwargs["cameras"] == ["agentview", "robot0_eye_in_hand"]


def test_overrides_that_agree_pass(tmp_path):
    c = config(tmp_path, seed=42, replan_steps=10, num_inference_steps=10,
               env_kwargs={"image_size": 256, "cameras": ("agentview", "robot0_eye_in_hand"), "settle_steps": 30})
    assert c.env_kwargs["image_size"] == [256, 256] and c.EVALUATION.seed == 42


@pytest.mark.parametrize(("change", "message"), [
    ({"seed": 3}, "EVALUATION.seed=3 conflicts with protocol=fastwam_libero, which fixes it to 42"),
    ({"seed": 0}, "EVALUATION.seed=0 conflicts .* fixes it to 42"),  # wam_gym's default, typed: the user's, refused
    ({"replan_steps": 5}, "EVALUATION.replan_steps=5 conflicts .* fixes it to 10"),
    ({"num_inference_steps": 20}, "EVALUATION.num_inference_steps=20 conflicts .* fixes it to 10"),
    ({"action_horizon": 16}, "EVALUATION.action_horizon=16 conflicts .* fixes it to null"),
    ({"max_episode_steps": 300}, r'EVALUATION.max_episode_steps=300 conflicts .* fixes it to \{"libero_spatial": 400, .*\}'),
    ({"env_kwargs": {"image_size": 128}}, r"env_kwargs.image_size=128 conflicts .* fixes it to \[256, 256\]"),
    ({"env_kwargs": {"cameras": ["agentview"]}},
     r'env_kwargs.cameras=\["agentview"\] conflicts .* fixes it to \["agentview", "robot0_eye_in_hand"\]'),
    ({"env_kwargs": {"settle_steps": 10}}, "env_kwargs.settle_steps=10 conflicts .* fixes it to 30"),
])
def test_conflicting_overrides_are_refused(tmp_path, change, message):
    with pytest.raises(ValueError, match=rf"^{message}: drop the override, or leave the protocol out \(protocol=none\)$"):
        config(tmp_path, **change)


def test_the_config_group_sets_it_and_refuses_what_the_command_line_moves():
    from wam_gym.eval.config import compose

    c = compose(["protocol=fastwam_libero", "benchmark=libero"])
    assert c.protocol == FASTWAM
    assert (c.EVALUATION.seed, c.EVALUATION.replan_steps, c.env_kwargs["settle_steps"]) == (42, 10, 30)
    assert compose(["protocol=fastwam_libero", "EVALUATION.seed=42"]).EVALUATION.seed == 42  # agrees: passes
    for typed in ("EVALUATION.seed=7", "EVALUATION.seed=0"):  # 0 is wam_gym's default, typed: never "unset"
        with pytest.raises(ValueError, match=f"^{typed} conflicts with protocol=fastwam_libero, which fixes it to 42"):
            compose(["protocol=fastwam_libero", typed])
    assert compose(["protocol=none"]).protocol is None and compose([]).EVALUATION.seed == 0


def test_a_server_serves_by_it(caplog):
    """The server has the protocol group too: it serves by the protocol's chunk rules (and a LingBot-VA release
    takes its input convention from it: tests/test_serve_lingbot_va.py). Inferred from a checkpoint's input
    convention, the protocol fills the knobs left at their defaults."""
    from wam_gym.model_call import ModelCallConfig
    from wam_gym.serve.__main__ import serve_by_protocol
    from wam_gym.serve.config import refuse_episode_knobs

    refuse_episode_knobs([f"protocol={FASTWAM}"])  # not an episode knob: no error
    ev = ModelCallConfig(**protocols.overlay(PROTOCOLS[FASTWAM], protocols.SERVED_KNOBS)["EVALUATION"])
    assert serve_by_protocol(ev, FASTWAM, None) == FASTWAM and (ev.replan_steps, ev.num_inference_steps) == (10, 10)
    inferred = ModelCallConfig()
    assert serve_by_protocol(inferred, None, FASTWAM) == FASTWAM and inferred.replan_steps == 10
    moved = ModelCallConfig(replan_steps=5)
    assert serve_by_protocol(moved, FASTWAM, None) == FASTWAM and moved.replan_steps == 5  # served as set, warned
    assert "EVALUATION.replan_steps=5 departs from fastwam_libero's 10" in caplog.text


# ----------------------------------------------------------------- what a run evaluates
def test_tasks_of_another_suite_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^protocol=fastwam_libero evaluates libero tasks, and "
                                         r"wam_gym/MetaWorld-reach-v3 is a metaworld task: evaluate libero tasks "
                                         r"\(benchmark=libero\), or leave the protocol out \(protocol=none\)$"):
        manager(tmp_path, tasks=(SPATIAL, REACH))
    assert not (tmp_path / "out").exists()


def test_trial_k_starts_from_init_state_k(tmp_path):
    m = manager(tmp_path)
    assert [job.reset_options for job in m.plan.jobs] == [{"init_state_id": job.trial} for job in m.plan.jobs]
    task = m.plan.tasks[0]
    off = SimpleNamespace(task=task, trial=1, reset_options={"init_state_id": 0})
    with pytest.raises(ValueError, match="starts trial k from init state k, and .* trial 1 would reset with"):
        protocols.check_plan(PROTOCOLS[FASTWAM], [task], [off])


def test_each_task_gets_its_suites_step_limit(tmp_path):
    m = manager(tmp_path, tasks=(SPATIAL, LIBERO_10, PRO_10))
    spec = m.plan.actor_spec()
    assert spec.episode_steps == {SPATIAL: 400, LIBERO_10: 700, PRO_10: 700}
    assert spec.env_kwargs["settle_steps"] == 30 and spec.replan_steps == 10 and spec.action_horizon is None
    # without a protocol: the suites' own limits, or EVALUATION.max_episode_steps for every task
    assert manager(tmp_path, protocol=None).plan.actor_spec().episode_steps == {SPATIAL: 220, LIBERO_10: 520}
    assert manager(tmp_path, protocol=None, max_episode_steps=9).plan.actor_spec().episode_steps == {
        SPATIAL: 9, LIBERO_10: 9}


# ----------------------------------------------------------------- the checkpoint's input convention
def fake_checkpoint(root: Path, inputs: dict | None) -> Path:
    """A wam_config.json written by hand: all the protocol's check reads (the model checks come after)."""
    root.mkdir()
    data = {"action_dim": 7, **({} if inputs is None else {"inputs": inputs})}
    (root / "wam_config.json").write_text(json.dumps(data))
    return root


@pytest.mark.parametrize(("inputs", "declares"), [(None, "none"), ({"name": "wam_gym"}, "'wam_gym'")])
def test_wam_checkpoint_of_another_input_convention_is_refused(tmp_path, inputs, declares):
    ckpt = fake_checkpoint(tmp_path / "ckpt", inputs)
    with pytest.raises(ValueError, match=rf"^protocol=fastwam_libero feeds the model by the input "
                                         rf"convention 'fastwam_libero', and ckpt=\S+/ckpt declares {declares} "
                                         rf"\(inputs\.name in its wam_config\.json\): evaluate a checkpoint made "
                                         r"with that convention .*, or leave the protocol out \(protocol=none\)$"):
        manager(tmp_path, agent="wam", ckpt=str(ckpt))


def test_wam_checkpoint_of_its_convention_passes_the_check(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "ckpt", {"name": FASTWAM, "orientation": "mirrored"})
    protocols.check_checkpoint_inputs(PROTOCOLS[FASTWAM], str(ckpt))  # no error
    protocols.check_checkpoint_inputs(None, str(fake_checkpoint(tmp_path / "other", None)))  # null: nothing checked
    with pytest.raises(Exception) as caught:  # the model's own checks follow; whatever they say, not the protocol
        manager(tmp_path, agent="wam", ckpt=str(ckpt))
    assert "input convention" not in str(caught.value)


def test_a_fastwam_checkpoint_of_its_convention_is_evaluated_under_it(tmp_path):
    """A tiny FastWAM saved with inputs=fastwam_libero passes every check: its frames are cropped by the model's
    convention (224 of 256 in the release; 32 here), so the env's 256 x 256 is no resize."""
    import torch

    from agents.wam.fastwam.checkpoint import save_fastwam
    from agents.wam.fastwam.config import preset
    from agents.wam.fastwam.inputs import convention
    from agents.wam.fastwam.model import FastWAM
    from agents.wam.normalization import Normalizer, unit_stats

    torch.manual_seed(0)
    cameras = ("agentview", "robot0_eye_in_hand")
    for name in (FASTWAM, "wam_gym"):
        config = preset("fastwam_tiny", cameras=cameras, image_size=(32, 32), inputs=convention(name))
        ckpt = save_fastwam(FastWAM(config), tmp_path / name)
        Normalizer.from_stats(unit_stats(config.state_dim, config.action_dim)).save(ckpt / "dataset_stats.json")
    m = manager(tmp_path, agent="wam", ckpt=str(tmp_path / FASTWAM))
    assert m.plan.env_kwargs["image_size"] == [256, 256] and not m.plan.image_resized
    agent = recorded(m)["agent"]
    assert (agent["EVALUATION.num_inference_steps"], agent["EVALUATION.replan_steps"]) == (10, 10)
    with pytest.raises(ValueError, match="declares 'wam_gym'"):
        manager(tmp_path, agent="wam", ckpt=str(tmp_path / "wam_gym"), out="other")


def test_remote_agents_are_not_checked_on_the_model_side(tmp_path):
    m = manager(tmp_path, agent="remote", remote={"url": "ws://127.0.0.1:9"})
    assert m.plan.env_kwargs["image_size"] == [256, 256] and m.plan.actor_spec().episode_steps[SPATIAL] == 400


# ----------------------------------------------------------------- protocol.json, compare, resume
def test_protocol_json_records_it(tmp_path):
    record = recorded(manager(tmp_path, tasks=(SPATIAL, PRO_10)))["protocol"]
    assert record["protocol"] == FASTWAM
    assert record["protocol_settings"] == json.loads(json.dumps(PROTOCOLS[FASTWAM].fixed()))
    assert record["EVALUATION.seed"] == 42 and record["env_kwargs"]["settle_steps"] == 30
    assert record["suites"]["libero"]["settle_steps"] == 30  # the env's, not LIBERO's default 10
    assert {t: record["tasks"][t]["max_episode_steps"] for t in (SPATIAL, PRO_10)} == {SPATIAL: 400, PRO_10: 700}
    assert record["tasks"][SPATIAL]["kwargs"] == {"suite": "Spatial", "task_id": 0, **PROTOCOLS[FASTWAM].env_kwargs}
    assert record["tasks"][SPATIAL]["init_state"] == "init state k for trial k"


def run_dir(tmp_path: Path, name: str, protocol: str | None) -> Path:
    """An output dir with protocol.json and one episode, as a finished run leaves it."""
    m = manager(tmp_path, protocol=protocol, tasks=(SPATIAL,), out=name)
    recorded(m)
    ResultStore(m.plan.output_dir).write(EpisodeRecord(SPATIAL, 0, 42, True, steps=10, reward=1.0))
    return m.plan.output_dir


def test_compare_refuses_a_run_under_another_protocol(tmp_path, capsys):
    from wam_gym.compare import compare, main

    ours, theirs = run_dir(tmp_path, "ours", None), run_dir(tmp_path, "theirs", FASTWAM)
    with pytest.raises(ValueError, match=r"ran under different protocols, so their episodes are not the same episodes: "
                                         r"EVALUATION\.seed is in A \(\S+\) 0, in B \(\S+\) 42 "
                                         r"\(and 6 more: env_kwargs, protocol, "):
        compare(ours, theirs)
    assert main([str(theirs), str(ours)]) == 2
    assert "ran under different protocols" in capsys.readouterr().err
    assert compare(theirs, run_dir(tmp_path, "again", FASTWAM))["overall"]["pairs"] == 1  # the same protocol pairs


@pytest.mark.parametrize(("before", "now", "first"), [
    (None, FASTWAM, "EVALUATION.seed was 0, now 42 (and 6 more: env_kwargs, protocol, "),
    (FASTWAM, None, "EVALUATION.seed was 42, now 0"),  # fields are named in this run's order: its own first
])
def test_resuming_under_another_protocol_is_refused(tmp_path, before, now, first):
    run_dir(tmp_path, "out", before)
    again = manager(tmp_path, protocol=now, tasks=(SPATIAL,))
    with pytest.raises(ResumeMismatch, match=f"holds episodes run with other settings: {re.escape(first)}"):
        again.plan.protocol.resume(has_episodes=True, allow=False)
    same = manager(tmp_path, protocol=before, tasks=(SPATIAL,))
    assert same.plan.protocol.resume(has_episodes=True, allow=False) == []  # the same protocol resumes
