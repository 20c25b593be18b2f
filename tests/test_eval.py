"""python -m wam_gym.eval end to end: real actor and model-worker processes, real files.

Expert and random agents run Meta-World at 64 px; the WAM agent runs a tiny random
checkpoint saved once per module, with short episodes. Faults are real SIGKILLs sent from a
thread started by ``EvalManager.on_started``.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metaworld")

from omegaconf import OmegaConf  # noqa: E402

from agents.wam.checkpoint import MissingCheckpointError  # noqa: E402
from envs.errors import UnknownEnvError  # noqa: E402
from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig  # noqa: E402
from wam_gym.eval.manager import EvalError, EvalManager  # noqa: E402
from wam_gym.eval.results import EpisodeRecord, ResultStore  # noqa: E402
from wam_gym.eval.tasks import TASK_SETS, plan, resolve_tasks  # noqa: E402
from wam_gym.utils.video import read_mp4  # noqa: E402

REACH, PUSH = "wam_gym/MetaWorld-reach-v3", "wam_gym/MetaWorld-push-v3"
LIBERO_TASK = "wam_gym/LIBERO-Spatial-v0:3"
SEED = 7  # trial k uses SEED + k


# ----------------------------------------------------------------- helpers
def config(output_dir, agent="expert", tasks=(REACH, PUSH), trials=2, ckpt=None, env_kwargs=None,
           multirun=None, **evaluation) -> EvalConfig:
    if env_kwargs is None:
        env_kwargs = {} if agent == "wam" else {"image_size": 64}  # wam: the checkpoint's cameras and size
    return EvalConfig(
        ckpt=None if ckpt is None else str(ckpt), env_kwargs=env_kwargs,
        EVALUATION=EvaluationConfig(agent=agent, num_trials=trials, seed=SEED, output_dir=str(output_dir), **evaluation),
        MULTIRUN=MultirunConfig(task_sets=list(tasks), **(multirun or {})),
    )


def wam_config(output_dir, ckpt, tasks=(REACH,), trials=2, multirun=None, **evaluation) -> EvalConfig:
    evaluation = {"max_episode_steps": 12, "replan_steps": 4, "num_inference_steps": 2, **evaluation}
    return config(output_dir, agent="wam", tasks=tasks, trials=trials, ckpt=ckpt, multirun=multirun, **evaluation)


def run(cfg: EvalConfig, hook=None) -> dict:
    manager = EvalManager(cfg)
    manager.on_started = hook
    return manager.run()


def episode_files(output_dir) -> list[Path]:
    return sorted(Path(output_dir, "episodes").glob("*/*.json"))


def records(output_dir) -> dict[tuple[str, int], dict]:
    """(task, trial) -> record; fails if an episode has two files."""
    out = {}
    for path in episode_files(output_dir):
        data = json.loads(path.read_text())
        key = (data["task"], data["trial"])
        assert key not in out, f"{key} recorded twice"
        out[key] = data
    return out


def snapshot(output_dir) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in episode_files(output_dir)}


def results_json(output_dir) -> dict:
    return json.loads(Path(output_dir, "results.json").read_text())


def planned(tasks, trials) -> set[tuple[str, int]]:
    return {(t, k) for t in tasks for k in range(trials)}


class Started:
    """An on_started hook that records how many actors each run launched."""

    def __init__(self):
        self.actor_counts: list[int] = []

    def __call__(self, manager, actors, broker):
        self.actor_counts.append(len(actors.pids()))


def kill_later(pick_pid, timeout=180.0):
    """An on_started hook: a thread polls ``pick_pid(manager, actors, broker)`` every 50 ms and
    SIGKILLs the pid it returns (once). ``hook.killed`` holds what pick_pid returned."""

    def hook(manager, actors, broker):
        def watch():
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                picked = pick_pid(manager, actors, broker)
                if picked is not None:
                    os.kill(picked[0], signal.SIGKILL)
                    hook.killed = picked
                    return
                time.sleep(0.05)

        threading.Thread(target=watch, daemon=True).start()

    hook.killed = None
    return hook


def cli(*overrides, cwd, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wam_gym.eval", *overrides], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


# ----------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def expert_run(tmp_path_factory):
    """One complete expert run, 2 tasks x 2 trials: (output dir, summary, printed stdout)."""
    out = tmp_path_factory.mktemp("expert") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        summary = run(config(out))
    return out, summary, printed.getvalue()


@pytest.fixture
def expert_copy(expert_run, tmp_path):
    """A copy (mtimes kept) of the complete expert run, to rerun and modify."""
    out = tmp_path / "out"
    shutil.copytree(expert_run[0], out)
    return out


# ----------------------------------------------------------------- a complete run
def test_expert_run_writes_results_seeds_table_and_tensorboard(expert_run):
    out, summary, printed = expert_run
    assert (out / "results.json").is_file() and (out / "results.csv").is_file()
    recs = records(out)
    assert set(recs) == planned((REACH, PUSH), 2)
    assert all(r["seed"] == SEED + r["trial"] and r["attempts"] == 1 and r["init_state_id"] is None
               for r in recs.values())
    assert all(r["success"] for r in recs.values())  # Meta-World's scripted expert solves reach and push

    assert summary["complete"] and summary["planned"] == 4 and summary["error"] is None
    assert summary["overall"]["episodes"] == 4 and summary["overall"]["success_rate"] == 1.0
    on_disk = results_json(out)
    assert on_disk["overall"] == summary["overall"] and on_disk["benchmark"] == "metaworld"
    assert on_disk["init_state_pinned_to_trial"] is False
    assert {t: s["episodes"] for t, s in on_disk["tasks"].items()} == {REACH: 2, PUSH: 2}
    assert on_disk["tasks"][PUSH]["mean_steps"] == sum(recs[PUSH, k]["steps"] for k in range(2)) / 2

    csv_rows = [line.split(",") for line in (out / "results.csv").read_text().splitlines()]
    assert [row[:4] for row in csv_rows[1:]] == [[REACH, "2", "2", "1.0"], [PUSH, "2", "2", "1.0"],
                                                  ["overall", "4", "4", "1.0"]]

    table = {line.split()[0]: line.split()[1:] for line in printed.splitlines() if line.startswith(("wam_gym/", "overall"))}
    assert table == {REACH: ["2", "2", "100.0", "34.2-100.0"], PUSH: ["2", "2", "100.0", "34.2-100.0"],
                     "overall": ["4", "4", "100.0", "53.5-100.0"]}  # Wilson for 2/2; MOVER over both tasks
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


# ----------------------------------------------------------------- resuming
def test_rerun_runs_exactly_the_deleted_episode(expert_copy):
    out = expert_copy
    before = snapshot(out)
    deleted = ResultStore(out).episode_path(PUSH, 1)
    old = json.loads(deleted.read_text())
    deleted.unlink()

    started = Started()
    summary = run(config(out), started)

    assert started.actor_counts == [1]  # one episode to run: one actor
    after = snapshot(out)
    assert set(after) == set(before)
    assert {p: v for p, v in after.items() if p != deleted} == {p: v for p, v in before.items() if p != deleted}
    new = json.loads(deleted.read_text())
    assert new["seed"] == old["seed"] == SEED + 1 and new["attempts"] == 1 and new["success"]
    assert summary["complete"] and summary["overall"]["episodes"] == 4
    assert {t: s["episodes"] for t, s in summary["tasks"].items()} == {REACH: 2, PUSH: 2}
    assert results_json(out)["overall"]["episodes"] == 4


def test_rerun_with_nothing_missing_launches_nothing_and_writes_the_summary(expert_copy):
    out = expert_copy
    before = snapshot(out)
    (out / "results.json").unlink()
    (out / "results.csv").unlink()

    started = Started()
    summary = run(config(out), started)

    assert started.actor_counts == []  # no actors (and no broker) were started
    assert snapshot(out) == before
    overall = summary["overall"]
    assert summary["complete"] and (overall["episodes"], overall["successes"], overall["tasks"]) == (4, 4, 2)
    assert overall["success_rate"] == overall["pooled_success_rate"] == 1.0
    assert results_json(out)["overall"] == summary["overall"]
    assert (out / "results.csv").is_file()


def test_more_trials_on_rerun_runs_only_the_new_trials(expert_copy):
    out = expert_copy
    before = snapshot(out)

    started = Started()
    summary = run(config(out, trials=3), started)

    assert started.actor_counts == [2]
    after = snapshot(out)
    assert {p: after[p] for p in before} == before  # old trials untouched
    recs = records(out)
    assert set(recs) == planned((REACH, PUSH), 3)
    assert {k: r["seed"] for k, r in recs.items() if k[1] == 2} == {(REACH, 2): SEED + 2, (PUSH, 2): SEED + 2}
    assert summary["complete"] and summary["planned"] == 6 and summary["overall"]["episodes"] == 6


def test_record_under_another_trials_name_is_set_aside_and_the_trial_rerun(expert_copy):
    out = expert_copy
    store = ResultStore(out)
    misplaced = store.episode_path(PUSH, 1)
    shutil.copyfile(store.episode_path(PUSH, 0), misplaced)  # before: every rerun exited 1 with error null

    started = Started()
    summary = run(config(out), started)

    assert started.actor_counts == [1] and summary["complete"] and summary["error"] is None
    recs = records(out)
    assert set(recs) == planned((REACH, PUSH), 2) and recs[PUSH, 1]["seed"] == SEED + 1
    assert results_json(out)["records_set_aside"] == [f"{misplaced}.mismatched"]


def test_cli_refuses_to_resume_another_runs_output_dir(tmp_path):
    store = ResultStore(tmp_path / "out")  # every episode on disk: no process starts
    for k in range(2):
        store.write(EpisodeRecord(REACH, k, 3 + k, success=False, steps=5, reward=0.0))
    common = ["EVALUATION.agent=random", f"MULTIRUN.task_sets=[{REACH}]", "EVALUATION.num_trials=2",
              "EVALUATION.output_dir=out", "EVALUATION.tensorboard=false"]
    # episodes without a protocol.json: the first run takes them as its own only when told to
    assert cli(*common, "EVALUATION.seed=3", "EVALUATION.allow_resume_mismatch=true", cwd=tmp_path).returncode == 0

    result = cli(*common, "EVALUATION.seed=4", cwd=tmp_path)

    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: EVALUATION.output_dir=out holds episodes run with other settings: "
                           "EVALUATION.seed was 3, now 4.")
    assert last.endswith("set EVALUATION.allow_resume_mismatch=true to resume anyway (recorded in results.json)")


# ----------------------------------------------------------------- faults
def test_killed_actor_has_its_episode_retried_once(tmp_path):
    out = tmp_path / "out"

    def busy_actor(manager, actors, broker):
        """Once an episode is on disk (actors are past start-up), an actor in the middle of another."""
        if not episode_files(out):
            return None
        done = manager.plan.store.done()
        for handle in list(actors.actors.values()):
            job = handle.job
            if job is not None and job.key not in done and handle.process.is_alive():
                return handle.process.pid, job
        return None

    hook = kill_later(busy_actor)
    cfg = config(out, agent="random", max_episode_steps=60)
    summary = run(cfg, hook)

    assert hook.killed is not None, "no actor was killed"
    killed_job = hook.killed[1]
    recs = records(out)
    assert set(recs) == planned((REACH, PUSH), 2)  # each planned episode exactly once
    assert summary["complete"] and summary["overall"]["episodes"] == 4
    retried = recs[killed_job.key]
    assert retried["attempts"] == 2 and retried["seed"] == killed_job.seed == SEED + killed_job.trial
    assert all(r["attempts"] == 1 for k, r in recs.items() if k != killed_job.key)
    assert all(r["steps"] == 60 for r in recs.values())
    assert results_json(out)["reruns"] == {"actor_lost": 1, "server_lost": 0, "worker_lost": 0, "actors_stalled": 0}


def test_killed_model_worker_is_restarted_and_nothing_is_lost(tmp_path, tiny_ckpt):
    out = tmp_path / "out"

    def serving_worker(manager, actors, broker):
        """The model worker, once it has been handed a batch (it is computing it now)."""
        return (broker.pool.pid(0), None) if broker.stats.batch_sizes else None

    hook = kill_later(serving_worker)
    summary = run(wam_config(out, tiny_ckpt), hook)

    assert hook.killed is not None, "the model worker was not killed"
    recs = records(out)
    assert set(recs) == planned((REACH,), 2)
    assert all(r["attempts"] == 1 and r["steps"] == 12 for r in recs.values())  # actors never noticed
    assert summary["complete"]
    broker = results_json(out)["broker"]
    assert broker["worker_restarts"] >= 1
    assert broker["requests"] >= 2 * 12 // 4  # every model call was answered (a resent batch counts twice)


def test_refused_observation_stops_the_run_with_the_fix(tmp_path, tiny_ckpt, monkeypatch):
    """An env that renders other cameras than it was asked for: only the policy can tell, mid-run.
    (Asking for too few cameras is refused up front: eval-camera-missing in test_bad_inputs.)"""
    out = tmp_path / "out"
    cfg = wam_config(out, tiny_ckpt, trials=1)
    cfg.env_kwargs = {"cameras": ["corner"]}  # the checkpoint needs corner and gripperPOV
    monkeypatch.setattr("wam_gym.eval.preflight.check_cameras", lambda env_kwargs, model: None)

    with pytest.raises(EvalError) as info:
        run(cfg)

    message = str(info.value)
    assert "lacks camera(s) ['gripperPOV']" in message and "make the env with those cameras" in message
    assert f"EVALUATION.output_dir={out}" in message and "resume" in message
    on_disk = results_json(out)
    assert on_disk["complete"] is False and "lacks camera" in on_disk["error"]


@pytest.mark.skipif(importlib.util.find_spec("libero") is not None, reason="needs LIBERO to be missing")
def test_env_error_stops_the_run_keeps_finished_episodes_and_resumes(tmp_path):
    out = tmp_path / "out"
    tasks = (REACH, "wam_gym/LIBERO-Spatial-v0:0")  # LIBERO is not installed in this venv: its env raises
    cfg = config(out, tasks=tasks, trials=1, multirun={"env_num_per_worker": 1})  # one actor: plan order

    with pytest.raises(EvalError) as info:
        run(cfg)

    message = str(info.value)
    assert "LIBERO-Spatial-v0:0 trial 0 failed: MissingSimulatorError" in message
    assert "pip install 'wam_gym[libero]'" in message and f"EVALUATION.output_dir={out}" in message
    recs = records(out)
    assert set(recs) == {(REACH, 0)} and recs[REACH, 0]["success"]  # finished before the error: kept
    on_disk = results_json(out)
    assert on_disk["complete"] is False and on_disk["overall"]["episodes"] == 1 and on_disk["error"]

    started = Started()  # the cause fixed (that task dropped), the same output_dir resumes: nothing to run
    summary = run(config(out, tasks=(REACH,), trials=1), started)
    assert started.actor_counts == [] and summary["complete"] and summary["error"] is None


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"agent": "wam"}, ValueError, r"EVALUATION.agent=wam needs ckpt=<checkpoint dir>"),
        ({"agent": "wam", "ckpt": "no/such/dir"}, MissingCheckpointError, r"ckpt=no/such/dir is not a checkpoint"),
        ({"agent": "dqn"}, ValueError, r"EVALUATION.agent='dqn': choose one of"),
        ({"tasks": ["metaworld_mt11"]}, ValueError, r"unknown task set 'metaworld_mt11'; known sets: .*metaworld_mt10"),
        ({"tasks": ["wam_gym/MetaWorld-reahc-v3"]}, UnknownEnvError, r"Did you mean wam_gym/MetaWorld-reach-v3"),
        ({"tasks": [f"{REACH}:x"]}, ValueError, r"the part after ':' is a task index"),
        ({"trials": 0}, ValueError, r"EVALUATION.num_trials must be in \[1, 100000\] \(episodes per task\), got 0"),
    ],
    ids=["wam-without-ckpt", "missing-ckpt-dir", "unknown-agent", "unknown-task-set", "unknown-env-id",
         "bad-task-index", "zero-trials"],
)
def test_bad_config_is_refused_before_anything_runs(tmp_path, changes, error, match):
    with pytest.raises(error, match=match):
        EvalManager(config(tmp_path / "out", **changes))
    assert not (tmp_path / "out").exists()


def test_cli_bad_override_names_the_key(tmp_path):
    result = cli("EVALUATION.num_trails=2", cwd=tmp_path)
    assert result.returncode != 0
    assert "Could not override 'EVALUATION.num_trails'" in result.stderr
    assert "Key 'num_trails' not in 'EvaluationConfig'" in result.stderr
    assert not list(tmp_path.iterdir())


def test_config_schemas_import_no_model_code(fresh_python):
    # A typo in an override is reported once the schema is built: that must not wait for
    # diffusers and transformers (about 7 s here), which only model workers need.
    proc = fresh_python(
        "import sys, wam_gym.eval.config, training.config\n"
        "from agents.wam import InferenceConfig, SamplerConfig\n"
        "InferenceConfig(sampler=SamplerConfig('ddim'))\n"
        "heavy = [m for m in ('diffusers', 'transformers', 'peft', 'deepspeed') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    assert proc.returncode == 0, proc.stderr


def test_cli_prints_the_config(tmp_path):
    result = cli("--cfg", "job", "EVALUATION.num_trials=3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = OmegaConf.create(result.stdout)
    assert set(printed) >= {"benchmark", "ckpt", "env_kwargs", "EVALUATION", "MULTIRUN"}
    assert printed.EVALUATION.num_trials == 3 and printed.EVALUATION.agent == "wam"
    assert printed.MULTIRUN.env_num_per_worker == 2 and printed.MULTIRUN.inference_batch_size == 4


def test_cli_random_run(tmp_path):
    result = cli("EVALUATION.agent=random", "+env_kwargs.image_size=64", f"MULTIRUN.task_sets=[{REACH}]",
                 "EVALUATION.num_trials=2", "EVALUATION.seed=3", "EVALUATION.max_episode_steps=5",
                 "EVALUATION.output_dir=out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    recs = records(out)
    assert {k: (r["seed"], r["steps"]) for k, r in recs.items()} == {(REACH, 0): (3, 5), (REACH, 1): (3 + 1, 5)}
    assert any(line.split()[:2] == [REACH, "2"] for line in result.stdout.splitlines())
    on_disk = results_json(out)
    assert on_disk["complete"] and on_disk["overall"]["episodes"] == 2
    assert on_disk["config"]["EVALUATION"]["agent"] == "random" and on_disk["config"]["env_kwargs"] == {"image_size": 64}


# ----------------------------------------------------------------- videos
def test_wam_videos_show_rollout_beside_prediction(tmp_path, tiny_ckpt):
    from agents.wam.mot.config import MoTConfig

    out = tmp_path / "out"
    run(wam_config(out, tiny_ckpt, eval_save_video=True, visualize_future_video=True))

    model = MoTConfig.load(tiny_ckpt / "wam_config.json")
    h, tile_width = model.image_size[0], len(model.cameras) * model.image_size[1]
    recs = records(out)
    assert set(recs) == planned((REACH,), 2)
    for r in recs.values():
        assert r["video"] == f"videos/MetaWorld-reach-v3/{r['trial']:05d}.mp4"
        frames = read_mp4(out / r["video"])
        assert frames.shape == (r["steps"], h, 2 * tile_width, 3)  # rollout | prediction
        assert frames[:, :, tile_width:].max() > 0  # the prediction half is not the black placeholder
        # The cost columns: one model call per 4 steps (replan_steps), 2 denoising steps each, model and env time.
        assert r["model_calls"] == -(-r["steps"] // 4) and r["denoise_steps"] == 2 * r["model_calls"]
        assert r["model_s"] > 0 and r["env_s"] > 0
    cost = json.loads((out / "results.json").read_text())["overall"]["cost"]
    assert cost["model_calls"] == sum(r["model_calls"] for r in recs.values())
    assert cost["model_s"] == pytest.approx(sum(r["model_s"] for r in recs.values()))


# ----------------------------------------------------------------- LIBERO pinning (no simulator)
def test_libero_trials_pin_the_init_state_and_metaworld_does_not(tmp_path):
    jobs = plan(resolve_tasks([LIBERO_TASK, REACH]), num_trials=3, base_seed=SEED)
    libero = [j for j in jobs if j.task.name == LIBERO_TASK]
    assert [(j.trial, j.seed, j.reset_options) for j in libero] == [
        (k, SEED + k, {"init_state_id": k}) for k in range(3)]
    assert libero[0].task.env_id == "wam_gym/LIBERO-Spatial-v0" and libero[0].task.kwargs == {"task_id": 3}
    assert [j.reset_options for j in jobs if j.task.name == REACH] == [None, None, None]
    assert LIBERO_TASK in TASK_SETS["libero_spatial"]

    # With every episode on disk nothing is simulated, and the summary says init states were pinned.
    out = tmp_path / "out"
    cfg = config(out, tasks=(LIBERO_TASK,), trials=2, tensorboard=False)
    EvalManager(cfg).plan.protocol.resume(has_episodes=False, allow=False)  # as the run that wrote them left it
    store = ResultStore(out)
    for k in range(2):
        store.write(EpisodeRecord(LIBERO_TASK, k, SEED + k, success=k == 0, steps=10, reward=0.0, init_state_id=k))
    summary = run(cfg)
    assert summary["init_state_pinned_to_trial"] is True and results_json(out)["init_state_pinned_to_trial"] is True
    assert summary["overall"]["success_rate"] == 0.5


# ----------------------------------------------------------------- imagination score
def test_imagination_score_in_records_results_and_tensorboard(tmp_path, tiny_ckpt):
    out = tmp_path / "out"
    summary = run(wam_config(out, tiny_ckpt, trials=1, imagination_score=True))  # decodes frames without videos

    (rec,) = records(out).values()
    # tiny: 4 future frames, stride 16 // 4 = 4 = replan_steps: frame 1 of each of the 3 replans is reached.
    assert rec["imagine_frames"] == 3
    for name in ("imagine_psnr", "imagine_ssim", "copy_psnr", "copy_ssim"):
        assert isinstance(rec[name], float) and np.isfinite(rec[name]), name
    on_disk = results_json(out)
    assert on_disk["imagination"]["frame_stride"] == 4 and on_disk["imagination"]["cameras"] == ["corner", "gripperPOV"]
    for stats in (on_disk["tasks"][REACH]["imagination"], on_disk["overall"]["imagination"]):
        assert stats["episodes"] == 1 and stats["frames"] == 3
        assert stats["imagine_psnr"] == pytest.approx(rec["imagine_psnr"])
        assert stats["copy_ssim"] == pytest.approx(rec["copy_ssim"])
    assert summary["overall"]["imagination"] == on_disk["overall"]["imagination"]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["imagine_frames"] for r in rows] == ["3", "3"] and float(rows[-1]["copy_psnr"]) == pytest.approx(rec["copy_psnr"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert {f"eval/imagine_psnr/{REACH}", "eval/copy_ssim/overall"} <= set(acc.Tags()["scalars"])


def test_imagination_score_off_computes_nothing(tmp_path, tiny_ckpt):
    from wam_gym.policies import policy_factory

    def manager(**evaluation):
        return EvalManager(wam_config(tmp_path / "out", tiny_ckpt, trials=1, **evaluation))

    for off in ({}, {"imagination_score": False, "visualize_future_video": True}):
        m = manager(**off)
        assert m.plan.imagination is None and m.plan.actor_spec().imagination is None
    assert policy_factory(manager().plan.config.EVALUATION, 0, None, None).args[1].visualize_future_video is False
    assert manager(visualize_future_video=True).plan.imagination is not None  # null: on when the frames are decoded anyway
    assert manager(imagination_score=True).plan.config.EVALUATION.inference().visualize_future_video is True
    with pytest.raises(ValueError, match="video_mode=joint"):
        manager(imagination_score=True, video_mode="action_only")
    with pytest.raises(ValueError, match="imagination_score"):
        EvaluationConfig(agent="expert", imagination_score=True)
    old = EpisodeRecord.from_json(json.dumps({"task": REACH, "trial": 0, "seed": 1, "success": True, "steps": 3,
                                              "reward": 0.0}))  # written before the score existed
    assert old.imagine_psnr is None and old.imagine_frames is None
