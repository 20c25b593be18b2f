"""python -m wam_gym.eval refuses what would give silent wrong results: resuming another run's
output dir, two runs in one dir, a full disk, records under the wrong name.

Most runs here have every episode on disk already, so no actor or model worker starts: what is
tested is the manager's bookkeeping around them (tests/test_eval.py runs real episodes).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig
from wam_gym.eval.errors import EvalError, OutputDirBusy, ResumeMismatch
from wam_gym.eval.manager import EvalManager
from wam_gym.eval.report import report
from wam_gym.eval.results import EpisodeRecord, ResultStore
from wam_gym.eval.run_protocol import LEGACY_IDENTITY_FILE, PROTOCOL_FILE, checkpoint_fingerprint, protocol_hash
from wam_gym.utils.run_dir import EVAL_LOCK as LOCK_FILE

REACH, PUSH = "wam_gym/MetaWorld-reach-v3", "wam_gym/MetaWorld-push-v3"
SEED = 7


def config(out, agent="expert", tasks=(REACH,), trials=2, ckpt=None, env_kwargs=None, **evaluation) -> EvalConfig:
    evaluation = {"seed": SEED, "tensorboard": False, **evaluation}
    return EvalConfig(
        ckpt=None if ckpt is None else str(ckpt), env_kwargs={} if env_kwargs is None else env_kwargs,
        EVALUATION=EvaluationConfig(agent=agent, num_trials=trials, output_dir=str(out), **evaluation),
        MULTIRUN=MultirunConfig(task_sets=list(tasks)),
    )


def record_episodes(out, tasks=(REACH,), trials=2, cfg: EvalConfig | None = None) -> None:
    """Every planned episode on disk, so a run starts no process; with ``cfg``, first the protocol.json a run of
    it writes (episodes without one are refused: their settings would be unknown)."""
    if cfg is not None:
        EvalManager(cfg).plan.protocol.resume(has_episodes=False, allow=False)
    for task in tasks:
        for trial in range(trials):
            ResultStore(out).write(EpisodeRecord(task, trial, SEED + trial, success=trial == 0, steps=10, reward=1.0))


def run(cfg: EvalConfig) -> dict:
    manager = EvalManager(cfg)
    manager.on_started = lambda *_: pytest.fail("no process should start: every episode is on disk")
    return manager.run()


def episode_bytes(out) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(Path(out, "episodes").rglob("*.json"))}


def results(out) -> dict:
    return json.loads(Path(out, "results.json").read_text())


@pytest.fixture
def done_run(tmp_path):
    """An expert run of REACH x 2 trials, complete, with its protocol.json."""
    out = tmp_path / "out"
    record_episodes(out, cfg=config(out))
    assert run(config(out))["complete"]
    return out


# ----------------------------------------------------------------- resume must match what it resumes
def test_first_run_records_its_protocol_and_a_matching_rerun_resumes(done_run):
    import importlib.metadata

    record = json.loads((done_run / PROTOCOL_FILE).read_text())
    protocol = record["protocol"]
    assert record["agent"] == {"EVALUATION.agent": "expert"}
    assert (protocol["EVALUATION.seed"], protocol["EVALUATION.max_episode_steps"], protocol["env_kwargs"]) == (SEED, None, {})
    assert protocol["tasks"] == {REACH: {"env_id": REACH, "kwargs": {"task": "reach"}, "max_episode_steps": 500,
                                         "init_state": None}}
    suite = protocol["suites"]["metaworld"]
    assert suite["simulator"] == {"metaworld": importlib.metadata.version("metaworld")}
    assert (suite["image_orientation"], suite["settle_steps"]) == ("upright", 0) and "truncated" in suite["termination"]
    assert record["observed"] == {}  # every episode was on disk: no env was built
    on_disk = results(done_run)
    assert on_disk["protocol"] == record and on_disk["protocol_hash"] == protocol_hash(record)
    assert on_disk["resume_mismatch"] == []
    assert run(config(done_run))["complete"]


@pytest.mark.parametrize(
    ("changes", "field", "was", "now"),
    [
        ({"seed": 8}, "EVALUATION.seed", "7", "8"),
        ({"max_episode_steps": 50}, "EVALUATION.max_episode_steps", "null", "50"),
        ({"env_kwargs": {"image_size": 32}}, "env_kwargs", "{}", '{"image_size": 32}'),
        ({"agent": "random"}, "EVALUATION.agent", '"expert"', '"random"'),
    ],
    ids=["seed", "max-episode-steps", "env-kwargs", "agent"],
)
def test_rerun_with_other_settings_is_refused_with_one_line(done_run, changes, field, was, now):
    before, summary = episode_bytes(done_run), results(done_run)
    with pytest.raises(ResumeMismatch) as info:
        run(config(done_run, **changes))
    message = str(info.value)
    assert "\n" not in message
    assert f"{field} was {was}, now {now}" in message
    assert "use a new EVALUATION.output_dir" in message and "EVALUATION.allow_resume_mismatch=true" in message
    assert episode_bytes(done_run) == before and results(done_run) == summary  # nothing credited, nothing rewritten


def test_actors_record_what_each_env_is(tmp_path):
    out = tmp_path / "out"
    summary = EvalManager(config(out, trials=1, max_episode_steps=3, env_kwargs={"image_size": 32})).run()
    observed = json.loads((out / PROTOCOL_FILE).read_text())["observed"][REACH]
    assert observed["action_space"] == {"dtype": "float32", "shape": [4], "low": [-1.0] * 4, "high": [1.0] * 4}
    assert observed["cameras"] == {"corner": [32, 32, 3], "gripperPOV": [32, 32, 3]} and observed["state_shape"]
    assert summary["protocol"]["observed"][REACH] == observed
    # The cost columns: an expert calls no model; its env time is measured.
    (record,) = ResultStore(out).records()
    assert record.model_calls is None and record.model_s is None and record.env_s > 0
    assert summary["overall"]["cost"]["env_s"] == record.env_s


def test_allowed_mismatch_is_recorded_in_results(done_run):
    summary = run(config(done_run, seed=8, allow_resume_mismatch=True))
    assert summary["complete"]
    on_disk = results(done_run)
    assert on_disk["allow_resume_mismatch"] is True
    assert on_disk["resume_mismatch"] == [{"field": "EVALUATION.seed", "recorded": SEED, "now": 8}]
    assert json.loads((done_run / PROTOCOL_FILE).read_text())["protocol"]["EVALUATION.seed"] == SEED  # the episodes' own


def test_more_trials_and_other_tasks_are_not_a_mismatch(tmp_path):
    out = tmp_path / "out"
    record_episodes(out, tasks=(REACH, PUSH), trials=3, cfg=config(out, trials=2))
    assert run(config(out, trials=2))["complete"]  # identity written with 2 trials of REACH
    assert run(config(out, tasks=(REACH, PUSH), trials=3))["planned"] == 6  # trial k is the same episode


def test_episodes_without_a_protocol_record_are_refused_unless_allowed_and_then_recorded(tmp_path, caplog):
    """Episodes whose protocol.json is gone (deleted, or an older wam_gym's) ran with unknown settings."""
    out = tmp_path / "out"
    record_episodes(out)  # episodes, no protocol.json
    with pytest.raises(ResumeMismatch, match=r"holds episodes but no protocol\.json: the settings they ran with are "
                                             r"unknown.*EVALUATION\.allow_resume_mismatch=true"):
        run(config(out))
    assert run(config(out, allow_resume_mismatch=True))["complete"]
    assert "no protocol.json" in caplog.text
    mixed = [{"field": PROTOCOL_FILE, "recorded": None, "now": "this run's settings"}]
    assert json.loads((out / PROTOCOL_FILE).read_text())["resumed_despite"] == mixed
    assert results(out)["resume_mismatch"] == mixed


def test_a_record_whose_seed_is_not_its_trials_is_set_aside_and_run_again(done_run):
    """A record edited, or copied in from another run, is not this run's trial: it runs again."""
    path = next((done_run / "episodes").glob("*/00001.json"))
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "seed": record["seed"] + 100}))
    summary = EvalManager(config(done_run)).run()
    assert summary["complete"] and path.with_name(path.name + ".mismatched").is_file()
    assert json.loads(path.read_text())["seed"] == SEED + 1


def test_older_run_identity_is_still_checked(tmp_path):
    out = tmp_path / "out"
    record_episodes(out)
    (out / LEGACY_IDENTITY_FILE).write_text(json.dumps({"EVALUATION.agent": "expert", "EVALUATION.seed": SEED + 1,
                                                        "EVALUATION.max_episode_steps": None, "env_kwargs": {}}))
    with pytest.raises(ResumeMismatch, match=f"EVALUATION.seed was {SEED + 1}, now {SEED}"):
        run(config(out))
    (out / LEGACY_IDENTITY_FILE).write_text(json.dumps({"EVALUATION.agent": "expert", "EVALUATION.seed": SEED}))
    assert run(config(out))["complete"] and (out / PROTOCOL_FILE).is_file()


# ----------------------------------------------------------------- the WAM: checkpoint content and inference knobs
@pytest.fixture
def wam_run(tmp_path, tiny_ckpt):
    ckpt = Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))
    out = tmp_path / "out"
    record_episodes(out, cfg=config(out, agent="wam", ckpt=ckpt))
    assert run(config(out, agent="wam", ckpt=ckpt))["complete"]
    return out, ckpt


def test_wam_identity_is_the_checkpoint_content_not_its_path(wam_run, tmp_path):
    out, ckpt = wam_run
    record = json.loads((out / PROTOCOL_FILE).read_text())
    assert record["agent"]["ckpt"] == {"path": str(ckpt), "fingerprint": checkpoint_fingerprint(ckpt)}
    assert record["protocol"]["env_kwargs"] == {"cameras": ["corner", "gripperPOV"], "image_size": [64, 64]}
    moved = shutil.copytree(ckpt, tmp_path / "moved")  # a copy: new mtimes, same content
    assert run(config(out, agent="wam", ckpt=moved))["complete"]


def test_wam_rerun_with_another_checkpoint_is_refused(wam_run, tmp_path):
    import torch

    from agents.wam import build_model, preset, save_pretrained

    out, ckpt = wam_run
    torch.manual_seed(1)
    other = save_pretrained(build_model(preset("tiny")), tmp_path / "other")  # same shapes, other weights
    shutil.copyfile(ckpt / "dataset_stats.json", other / "dataset_stats.json")
    with pytest.raises(ResumeMismatch, match=rf"ckpt was {ckpt} \(content \w{{12}}\), now {other} \(content \w{{12}}\)"):
        run(config(out, agent="wam", ckpt=other))


@pytest.mark.parametrize(
    "changes",
    [{"sampler": "ddim"}, {"num_inference_steps": 3}, {"shift": 1.0}, {"action_horizon": 8}, {"replan_steps": 4},
     {"video_mode": "action_only"}],
    ids=lambda c: next(iter(c)),
)
def test_wam_rerun_with_other_inference_settings_is_refused(wam_run, changes):
    out, ckpt = wam_run
    (name, value), = changes.items()
    with pytest.raises(ResumeMismatch, match=rf"EVALUATION\.{name} was .*, now {json.dumps(value)}"):
        run(config(out, agent="wam", ckpt=ckpt, **changes))


def test_a_checkpoint_one_ulp_off_is_refused_and_compared_as_another_model(wam_run, tmp_path):
    """One norm weight of the transformer moved by one ulp, where the sampled hash this replaced never read."""
    from tests.test_fingerprint import nudge_a_norm
    from wam_gym.compare import compare

    out, ckpt = wam_run
    tuned = Path(shutil.copytree(ckpt, tmp_path / "tuned"))
    nudge_a_norm(tuned)
    with pytest.raises(ResumeMismatch, match=rf"ckpt was {ckpt} \(content \w{{12}}\), now {tuned} \(content \w{{12}}\)"):
        run(config(out, agent="wam", ckpt=tuned))
    other = tmp_path / "tuned_out"
    record_episodes(other, cfg=config(other, agent="wam", ckpt=tuned))
    assert run(config(other, agent="wam", ckpt=tuned))["complete"]
    diffs = compare(out, other)["agent_differences"]
    assert [d["field"] for d in diffs] == ["ckpt"]
    assert diffs[0]["now"] == {"path": str(tuned), "fingerprint": checkpoint_fingerprint(tuned)}


def test_a_python_policy_edited_in_one_line_is_refused(tmp_path, monkeypatch):
    """One line of the policy's module, then of a sibling module of its package: another policy each time."""
    from tests.test_fingerprint import forget, make_package

    forget("mypolicy", monkeypatch)
    monkeypatch.syspath_prepend(str(tmp_path))
    package = make_package(tmp_path)
    out = tmp_path / "out"
    policy = {"agent": "python", "policy": "mypolicy.policy:make_policy"}
    record_episodes(out, cfg=config(out, **policy))
    assert run(config(out, **policy))["complete"]
    recorded = json.loads((out / PROTOCOL_FILE).read_text())["agent"]["EVALUATION.policy"]
    assert recorded["spec"] == "mypolicy.policy:make_policy" and len(recorded["fingerprint"]) == 64
    for module in ("policy.py", "helpers.py"):
        source = package / module
        original = source.read_text()
        source.write_text(original.replace("\n", "  # tuned\n", 1))
        with pytest.raises(ResumeMismatch, match=r"EVALUATION\.policy was mypolicy\.policy:make_policy \(content "
                                                 r"\w{12}\), now mypolicy\.policy:make_policy \(content \w{12}\)"):
            run(config(out, **policy))
        source.write_text(original)
    assert run(config(out, **policy))["complete"]  # as it was: the same policy again


def test_wam_rerun_with_other_statistics_is_refused(wam_run, tmp_path):
    out, ckpt = wam_run
    stats = json.loads((ckpt / "dataset_stats.json").read_text())
    stats["action"]["max"] = [2.0] * len(stats["action"]["max"])
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(ResumeMismatch, match=r"EVALUATION\.dataset_stats_path was \S+dataset_stats\.json"):
        run(config(out, agent="wam", ckpt=ckpt, dataset_stats_path=str(tmp_path / "stats.json")))


def test_ckpt_and_stats_paths_expand_the_home_directory(wam_run, tmp_path, monkeypatch):
    out, ckpt = wam_run
    monkeypatch.setenv("HOME", str(tmp_path))
    manager = EvalManager(config(out, agent="wam", ckpt="~/ckpt", dataset_stats_path="~/ckpt/dataset_stats.json"))
    assert manager.plan.ckpt == ckpt.resolve() and manager.plan.stats == (ckpt / "dataset_stats.json").resolve()
    assert manager.run()["complete"]  # and it is the same run


def test_allowed_image_resize_is_recorded(tmp_path, tiny_ckpt):
    out = tmp_path / "out"
    cfg = config(out, agent="wam", ckpt=tiny_ckpt, env_kwargs={"image_size": 96}, allow_image_resize=True)
    record_episodes(out, cfg=cfg)
    summary = run(cfg)
    assert summary["image_resized"] is True and results(out)["image_resized"] is True
    assert results(out)["protocol"]["protocol"]["env_kwargs"]["image_size"] == 96


def test_cli_wrong_stats_path_is_one_line_and_writes_nothing(tmp_path, tiny_ckpt):
    proc = subprocess.run(
        [sys.executable, "-m", "wam_gym.eval", f"ckpt={tiny_ckpt}", "EVALUATION.dataset_stats_path=/nonexistent/s.json",
         f"MULTIRUN.task_sets=[{REACH}]", "EVALUATION.output_dir=out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [proc.stderr.strip().splitlines()[-1]]
    assert errors[0].startswith("error: dataset stats /nonexistent/s.json not found; point EVALUATION.dataset_stats_path")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- one run per output dir
LOCK_HOLDER = """
import sys, time
from pathlib import Path
from wam_gym.utils.run_dir import EVAL_LOCK, locked
with locked(Path(sys.argv[1]), EVAL_LOCK):
    print("held", flush=True)
    time.sleep(300)
"""


def test_second_run_on_a_locked_output_dir_is_refused_naming_the_holder(done_run):
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(done_run)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert (done_run / LOCK_FILE).read_text().startswith(f"pid {holder.pid} on ")
        before = (done_run / "results.json").stat().st_mtime_ns
        with pytest.raises(OutputDirBusy) as info:
            run(config(done_run))
        assert f"is in use by another evaluation (pid {holder.pid} on " in str(info.value)
        assert "wait for it to finish, or use another EVALUATION.output_dir" in str(info.value)
        assert (done_run / "results.json").stat().st_mtime_ns == before
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed holder leaves no stale lock: the kernel drops it
        holder.wait()
    assert run(config(done_run))["complete"]
    assert (done_run / LOCK_FILE).read_text() == ""  # released: names nobody
    assert not [p for p in done_run.rglob(".*")]  # hidden names are interrupted writes' temp files


def test_lock_is_held_for_the_whole_run(done_run):
    seen = []
    manager = EvalManager(config(done_run, trials=3))
    manager.run_jobs = lambda todo, done: seen.append((done_run / LOCK_FILE).read_text())
    manager.run()
    assert seen and seen[0].startswith(f"pid {os.getpid()} on ")


# ----------------------------------------------------------------- a full disk
def fill_disk_after(monkeypatch, writes_left: int) -> None:
    """Every atomic write of a record or summary after the first ``writes_left`` fails with ENOSPC."""
    import wam_gym.eval.results

    real = wam_gym.eval.results.atomic_write_text
    left = [writes_left]

    def write(path, text):
        left[0] -= 1
        if left[0] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, text)

    monkeypatch.setattr(wam_gym.eval.results, "atomic_write_text", write)


def test_disk_full_while_writing_records_keeps_the_written_ones(tmp_path, monkeypatch):
    out = tmp_path / "out"
    manager = EvalManager(config(out, trials=3))

    def run_jobs(todo, done):  # stands in for the actors: three episodes finish, the third finds the disk full
        for job in list(todo):
            manager.plan.store.write(EpisodeRecord(job.task.name, job.trial, job.seed, success=True, steps=5, reward=0.0))

    monkeypatch.setattr(manager, "run_jobs", run_jobs)
    fill_disk_after(monkeypatch, writes_left=2)
    with pytest.raises(EvalError) as info:
        manager.run()
    message = str(info.value)
    assert message.startswith("no space left on device writing ") and "00002.json" in message and " MiB free" in message
    assert "every record written before is kept" in message and f"EVALUATION.output_dir={out}" in message
    assert "\n" not in message
    assert [p.name for p in sorted((out / "episodes").rglob("*.json"))] == ["00000.json", "00001.json"]
    assert not list(out.rglob(".*.tmp"))  # no half-written file


def test_disk_full_while_writing_the_summary(done_run, monkeypatch):
    fill_disk_after(monkeypatch, writes_left=0)
    before = episode_bytes(done_run)
    with pytest.raises(EvalError, match=r"^no space left on device writing \S+/results\.json"):
        run(config(done_run))
    assert episode_bytes(done_run) == before


# ----------------------------------------------------------------- records under the wrong name, incomplete runs
def test_record_under_another_trials_name_is_set_aside_and_reported(done_run):
    store = ResultStore(done_run)
    trial1 = store.episode_path(REACH, 1)
    shutil.copyfile(store.episode_path(REACH, 0), trial1)  # trial 0's record as trial 1's file
    manager = EvalManager(config(done_run))
    summary = report(manager.plan, {}, {}, 0.0, None)  # what a run reports before trial 1 reruns
    assert not summary["complete"]
    assert summary["error"].startswith(f"1 of 2 planned episodes have no record (first: {REACH} trial 1)")
    assert f"run again with EVALUATION.output_dir={done_run}" in summary["error"]
    assert summary["records_set_aside"] == [f"{trial1}.mismatched"] and not trial1.exists()
    assert results(done_run)["error"] == summary["error"]
    assert store.write(EpisodeRecord(REACH, 1, SEED + 1, success=True, steps=3, reward=0.0))  # the rerun can write it


# ----------------------------------------------------------------- the demo redoes an evaluation that did not finish
def test_demo_reruns_an_incomplete_evaluation_stage(tmp_path, monkeypatch):
    from wam_gym import demo

    calls = []
    monkeypatch.setattr(demo.subprocess, "Popen", lambda command, **kw: calls.append(command))
    monkeypatch.setattr(demo, "_follow", lambda process, log, progress: 0)  # the stage's command "exits 0"
    d = demo.Demo(demo.DemoConfig(output=str(tmp_path)))
    d.logs.mkdir(parents=True)
    results_json = tmp_path / "eval" / "expert" / "results.json"
    results_json.parent.mkdir(parents=True)
    for on_disk, runs in [({"complete": False, "error": "x"}, 1), ("{truncated", 1), ({"complete": True}, 0)]:
        results_json.write_text(on_disk if isinstance(on_disk, str) else json.dumps(on_disk))
        calls.clear()
        d.evaluate("expert")
        assert len(calls) == runs, on_disk


INCOMPLETE_RUN = r"""
import os, runpy, sys
from wam_gym.eval.manager import EvalManager
EvalManager.run = lambda self: {"complete": False, "error": os.environ["WHY"]}
sys.argv = ["wam_gym.eval", *sys.argv[1:]]
runpy.run_module("wam_gym.eval", run_name="__main__", alter_sys=True)
"""


def test_cli_exit_1_always_says_why(tmp_path):
    """An incomplete run that raised nothing ends with its error line, never a bare exit 1."""
    why = "1 of 2 planned episodes have no record (first: x trial 1); run again with EVALUATION.output_dir=out"
    proc = subprocess.run([sys.executable, "-c", INCOMPLETE_RUN, "EVALUATION.agent=random",
                           f"MULTIRUN.task_sets=[{REACH}]", "EVALUATION.output_dir=out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "WHY": why})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == f"error: {why}"


# ----------------------------------------------------------------- stop signals: a scheduler's SIGTERM, Ctrl-C
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stop_signal_mid_run_keeps_the_episodes_and_says_how_to_resume(tmp_path, sig):
    """A real ``python -m wam_gym.eval`` (Meta-World's expert, short episodes), signalled once two episodes are on
    disk: it ends in one line, with the signal's exit status, and results.json says what is missing and how to go on."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wam_gym.eval", "EVALUATION.agent=expert", f"MULTIRUN.task_sets=[{REACH}]",
         "EVALUATION.num_trials=40", "EVALUATION.max_episode_steps=30", "MULTIRUN.env_num_per_worker=1",
         "EVALUATION.tensorboard=false", "EVALUATION.output_dir=out"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(list((tmp_path / "out" / "episodes").rglob("*.json"))) < 2 and proc.poll() is None:
            assert time.monotonic() < deadline, "no episode within 240 s"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig and "Traceback" not in stderr, stderr[-3000:]
    name = signal.Signals(sig).name
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: stopped by {name}: \d+ of 40 planned episodes have no record \(first: {REACH} trial "
                        r"\d+\); run again with EVALUATION\.output_dir=out to run them", last), last
    saved = results(tmp_path / "out")
    assert saved["complete"] is False and saved["error"] == last[len("error: "):]
    assert saved["overall"]["episodes"] >= 2 and not list((tmp_path / "out").rglob(".*"))  # and no temp file
