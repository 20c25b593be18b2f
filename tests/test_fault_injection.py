"""Fault injection for python -m wam_gym.eval: real SIGKILLs of rollout actors, a model worker
and the manager itself, at seeded random points, on real processes and files.

The claim under test: after the retries (actors, model workers) or a rerun with the same
output_dir (the manager), the finished episodes are exactly an uninterrupted run's: the same
(task, trial) set, each recorded once, with the same seed, success, steps and reward (the
random and WAM agents here are deterministic given the episode seed). Faults that a plain
SIGKILL from outside cannot aim at (dying halfway through sending a record, an episode failing
while another is still running) come from ``fault_actors.faulty_actor_main``, which the spawned
actors run in place of ``actor_main`` when a test asks for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("metaworld")

from fault_actors import FAULTS_ENV, faulty_actor_main  # noqa: E402

from wam_gym.eval import actor as actor_module  # noqa: E402
from wam_gym.eval import actor_pool as actor_pool_module  # noqa: E402
from wam_gym.eval.config import EvalConfig, EvaluationConfig, MultirunConfig  # noqa: E402
from wam_gym.eval.manager import EvalError, EvalManager  # noqa: E402
from wam_gym.eval.results import EpisodeRecord, ResultStore  # noqa: E402
from wam_gym.eval.tasks import plan, resolve_tasks  # noqa: E402

REACH, PUSH = "wam_gym/MetaWorld-reach-v3", "wam_gym/MetaWorld-push-v3"
TASKS, TRIALS, STEPS, SEED = (REACH, PUSH), 3, 15, 11  # trial k uses SEED + k
EPISODES = len(TASKS) * TRIALS
ENV_KWARGS = {"image_size": 32, "cameras": ["corner"]}  # one small camera: rendering is most of a step here
TAG_ENV = "WAM_TEST_PROCESS_TAG"
WAIT_S = 300  # for anything a slow machine might take long over


# ----------------------------------------------------------------- configs and runs
def random_config(output_dir, tasks=TASKS, trials=TRIALS, **evaluation) -> EvalConfig:
    return EvalConfig(
        env_kwargs=dict(ENV_KWARGS),
        EVALUATION=EvaluationConfig(agent="random", num_trials=trials, seed=SEED, max_episode_steps=STEPS,
                                    tensorboard=False, output_dir=str(output_dir), **evaluation),
        MULTIRUN=MultirunConfig(task_sets=list(tasks)),
    )


def cli_args(output_dir) -> list[str]:
    """random_config(output_dir) as python -m wam_gym.eval overrides."""
    return ["EVALUATION.agent=random", "+env_kwargs.image_size=32", "+env_kwargs.cameras=[corner]",
            f"MULTIRUN.task_sets=[{','.join(TASKS)}]",
            f"EVALUATION.num_trials={TRIALS}", f"EVALUATION.seed={SEED}", f"EVALUATION.max_episode_steps={STEPS}",
            "EVALUATION.tensorboard=false", f"EVALUATION.output_dir={output_dir}"]


def wam_config(output_dir, ckpt) -> EvalConfig:
    # Batches of one: each request is computed alone, in every run, so outputs match bit for bit.
    return EvalConfig(
        ckpt=str(ckpt),
        EVALUATION=EvaluationConfig(agent="wam", num_trials=2, seed=SEED, max_episode_steps=8, replan_steps=4,
                                    num_inference_steps=2, tensorboard=False, output_dir=str(output_dir)),
        MULTIRUN=MultirunConfig(task_sets=[REACH], inference_batch_size=1, env_num_per_worker=1),
    )


def run(cfg: EvalConfig, hook=None) -> dict:
    manager = EvalManager(cfg)
    manager.on_started = hook
    return manager.run()


# ----------------------------------------------------------------- what is on disk
def records(output_dir) -> dict[tuple[str, int], dict]:
    """(task, trial) -> record, from every record file; fails on a duplicate or a stray file."""
    out = {}
    for path in sorted(Path(output_dir, "episodes").glob("*/*")):
        if path.name.startswith("."):
            continue  # a temp file (checked separately)
        assert path.suffix == ".json", f"unexpected file {path}"
        data = json.loads(path.read_text())  # complete JSON: never a half-written record
        key = (data["task"], data["trial"])
        assert key not in out, f"{key} recorded twice"
        out[key] = data
    return out


def outcomes(recs: dict) -> dict[tuple[str, int], tuple]:
    return {k: (r["seed"], r["success"], r["steps"], r["reward"]) for k, r in recs.items()}


def temp_files(output_dir) -> list[Path]:
    return sorted(p for p in Path(output_dir).rglob(".*"))


def snapshot(output_dir) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in Path(output_dir, "episodes").glob("*/*.json")}


def planned(tasks=TASKS, trials=TRIALS) -> set[tuple[str, int]]:
    return {(t, k) for t in tasks for k in range(trials)}


def assert_same_episodes(output_dir, reference: dict, summary: dict | None = None) -> dict:
    recs = records(output_dir)
    assert set(recs) == set(reference)
    assert outcomes(recs) == outcomes(reference)
    assert all(r["seed"] == SEED + r["trial"] for r in recs.values())
    on_disk = json.loads(Path(output_dir, "results.json").read_text())
    for s in (on_disk, summary or on_disk):
        assert s["complete"] and s["error"] is None
        assert s["overall"]["episodes"] == len(reference)
        assert s["overall"]["successes"] == sum(r["success"] for r in reference.values())
        assert {t: v["episodes"] for t, v in s["tasks"].items()} == {t: sum(k[0] == t for k in reference)
                                                                      for t, _ in reference}
    assert temp_files(output_dir) == []
    return recs


def wait_until(condition, timeout=WAIT_S, interval=0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


# ----------------------------------------------------------------- processes
def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries $WAM_TEST_PROCESS_TAG=tag (zombies have none)."""
    needle = f"{TAG_ENV}={tag}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if needle in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
    return pids


def assert_no_orphans(tag: str) -> None:
    """Every process a killed manager started (actors, model workers) exits by itself."""
    wait_until(lambda: not tagged_pids(tag), timeout=60, interval=0.2)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for pid in tagged_pids(tag)}
    for pid in left:  # don't leak them into the rest of the suite
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived their killed manager: {left}"


def cli_env(tag: str) -> dict[str, str]:
    return {**os.environ, TAG_ENV: tag, "OMP_NUM_THREADS": "1"}


# python -m wam_gym.eval, SIGKILLed at its DIE_AT_RECORD-th episode record: inside the atomic write
# (the temp file written and fsynced, the rename not done) when DIE_WHEN=before-rename, or just after
# the rename (the record in place, the rest of the plan still to run) when DIE_WHEN=after-rename.
DIE_AT_A_RECORD = r"""
import os, runpy, signal, sys
die_at, when, count, real_replace = int(os.environ["DIE_AT_RECORD"]), os.environ["DIE_WHEN"], [0], os.replace
def replace(src, dst):
    record = os.fspath(dst).endswith(".json") and f"{os.sep}episodes{os.sep}" in os.fspath(dst)
    count[0] += record
    if record and count[0] == die_at and when == "before-rename":
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
    if record and count[0] == die_at and when == "after-rename":
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
sys.argv = ["wam_gym.eval", *sys.argv[1:]]
runpy.run_module("wam_gym.eval", run_name="__main__", alter_sys=True)
"""


def run_cli_until_killed(out, tmp_path, tag: str, die_at: int, when: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DIE_AT_A_RECORD, *cli_args(out)], capture_output=True, text=True,
                          cwd=tmp_path, env={**cli_env(tag), "DIE_AT_RECORD": str(die_at), "DIE_WHEN": when},
                          timeout=WAIT_S)


# ----------------------------------------------------------------- faults
@pytest.fixture
def faults(monkeypatch):
    """Run the spawned actors as faulty_actor_main with the given faults."""

    def set_faults(**named):
        monkeypatch.setattr(actor_pool_module, "actor_main", faulty_actor_main)
        monkeypatch.setenv(FAULTS_ENV, json.dumps({k: list(v) for k, v in named.items()}))

    return set_faults


def kill_held_actors(holds: dict[tuple[str, int], Path], sig: int = signal.SIGKILL):
    """An on_started hook: a thread that SIGKILLs (or sends ``sig``), from outside, each actor that holds
    (the ``hold`` fault) in one of ``holds``' episodes, as soon as it holds. ``hook.killed`` lists the
    episodes, ``hook.pool`` is the run's ActorPool."""

    def hook(manager, actors, broker):
        hook.pool = actors

        def watch():
            waiting = dict(holds)
            while waiting and wait_until(lambda: any(path.exists() for path in waiting.values())):
                for key, path in list(waiting.items()):
                    if path.exists():
                        os.kill(int(path.read_text()), sig)
                        hook.killed.append(key)
                        del waiting[key]

        threading.Thread(target=watch, daemon=True).start()

    hook.killed = []
    return hook


# ----------------------------------------------------------------- references
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """An uninterrupted run: its records, the ground truth every faulted run must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "out"
    summary = run(random_config(out))
    recs = records(out)
    assert set(recs) == planned() and summary["complete"]
    assert all(r["attempts"] == 1 and r["steps"] <= STEPS for r in recs.values())
    return recs


@pytest.fixture(scope="module")
def wam_reference(tmp_path_factory, tiny_ckpt) -> dict:
    out = tmp_path_factory.mktemp("wam_reference") / "out"
    run(wam_config(out, tiny_ckpt))
    recs = records(out)
    assert set(recs) == planned((REACH,), 2) and all(r["steps"] == 8 for r in recs.values())
    return recs


# ----------------------------------------------------------------- actors
@pytest.mark.slow  # three actors replaced mid-run
def test_actors_killed_at_random_points_change_nothing(tmp_path, reference, faults):
    """Two actors SIGKILLed from outside in random episodes, one before its episode's env is built or
    reset, one before a random env step, and one actor killed halfway through sending its record (a
    cut-short message on its pipe): every episode is retried or kept, and the run matches the
    uninterrupted one. Each killed actor waits at its point until the kill lands, so the kills
    happen whatever the machine's speed."""
    out = tmp_path / "out"
    rng = random.Random(1)
    mid_send, *killed_in = rng.sample(sorted(planned()), 3)
    points = {killed_in[0]: -1, killed_in[1]: rng.randint(0, reference[killed_in[1]]["steps"] - 1)}
    holds = {key: tmp_path / f"hold-{i}.pid" for i, key in enumerate(killed_in)}
    faults(die_mid_send=mid_send, hold=[[*key, points[key], str(holds[key])] for key in killed_in])
    hook = kill_held_actors(holds)

    summary = run(random_config(out, max_attempts=5), hook)

    assert sorted(hook.killed) == sorted(killed_in)
    recs = assert_same_episodes(out, reference, summary)
    for key in [mid_send, *killed_in]:  # its actor died before the record arrived whole: the episode ran again
        assert recs[key]["attempts"] >= 2, key


def test_stalled_actor_is_killed_and_its_episode_retried(tmp_path, reference, faults, caplog):
    """An actor SIGSTOPped before a random env step (a hung simulator or GL driver: it never sends
    again) is killed once it has shown no progress for EVALUATION.actor_stall_s; its episode runs again
    on a fresh actor, as attempt 2, never as a policy failure, and the run matches the uninterrupted one."""
    out = tmp_path / "out"
    rng = random.Random(4)
    key, path = rng.choice(sorted(planned())), tmp_path / "hold.pid"
    faults(hold=[[*key, rng.randint(0, reference[key]["steps"] - 1), str(path)]])
    hook = kill_held_actors({key: path}, signal.SIGSTOP)

    # 15 s: far above any step or env build here, so only the stopped actor can be judged stalled.
    summary = run(random_config(out, max_attempts=2, actor_stall_s=15), hook)

    assert hook.killed == [key] and hook.pool.stalled == 1
    recs = assert_same_episodes(out, reference, summary)
    assert {k: r["attempts"] for k, r in recs.items()} == {k: 2 if k == key else 1 for k in planned()}
    assert summary["reruns"] == {"actor_lost": 1, "server_lost": 0, "worker_lost": 0, "actors_stalled": 1}
    [warning] = [r for r in caplog.records if "made no progress" in r.getMessage()]
    assert warning.levelname == "WARNING" and f"{key[0]} trial {key[1]}" in warning.getMessage()


def test_episode_finishing_after_an_error_is_kept(tmp_path, reference, faults):
    """Trial 1 fails at once while trial 0 is still running: the run stops with the error, but
    trial 0 finishes and is on disk, so a rerun runs only trial 1."""
    out = tmp_path / "out"
    faults(fail=(REACH, 1), slow=(REACH, 0))
    cfg = random_config(out, tasks=(REACH,), trials=2)

    with pytest.raises(EvalError, match=r"MetaWorld-reach-v3 trial 1 failed: RuntimeError: injected failure"):
        run(cfg)

    recs = records(out)
    assert set(recs) == {(REACH, 0)}
    assert outcomes(recs)[REACH, 0] == outcomes(reference)[REACH, 0]
    assert ResultStore(out).missing([(REACH, 0), (REACH, 1)]) == [(REACH, 1)]
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["overall"]["episodes"] == 1 and not on_disk["complete"] and "injected failure" in on_disk["error"]


# ----------------------------------------------------------------- the model worker
@pytest.mark.slow  # two WAM start-ups plus a restart / three manager runs
def test_model_worker_killed_at_a_random_point_changes_nothing(tmp_path, tiny_ckpt, wam_reference):
    """The only model worker is SIGKILLed as it is handed a random one of the run's 4 batches (2 episodes
    x 8 steps / replan 4), so it dies holding that batch, with the run still needing it."""
    out = tmp_path / "out"
    rng = random.Random(2)
    kill_at = rng.randint(1, 2)  # the batch number
    killed = []

    def hook(manager, actors, broker):  # called before any job is handed out
        submit = broker.pool.submit

        def submit_then_kill(worker, *batch):
            submit(worker, *batch)
            if not killed and broker.stats.batches == kill_at:
                killed.append(broker.pool.pid(worker))
                os.kill(killed[0], signal.SIGKILL)

        broker.pool.submit = submit_then_kill

    summary = run(wam_config(out, tiny_ckpt), hook)

    assert len(killed) == 1, "the model worker was not killed"
    recs = assert_same_episodes(out, wam_reference, summary)
    assert all(r["attempts"] == 1 for r in recs.values())  # the actors never noticed
    assert summary["broker"]["worker_restarts"] == 1


# ----------------------------------------------------------------- the manager
@pytest.mark.slow  # three manager runs, two of them fresh interpreters
def test_killed_manager_resumes_to_the_uninterrupted_result(tmp_path, reference):
    """Run 1 is SIGKILLed inside the write of a random record (temp file written, not renamed);
    run 2 is SIGKILLed just after a random number of further records landed, the rest of the plan
    still to run; run 3 (the same config, in this process) finishes. The result is the uninterrupted
    run's; nothing a killed run wrote is rewritten or counted twice; no temp file and no process of
    a killed run is left. Runs 1 and 2 are python -m wam_gym.eval, killed at those writes whatever
    the machine's speed."""
    out = tmp_path / "out"
    rng = random.Random(3)
    die_at, more = rng.randint(1, 2), rng.randint(1, 2)
    tag = f"manager-{os.getpid()}-{tmp_path.name}"

    # Run 1: dies between writing record number die_at and renaming it into place.
    first = run_cli_until_killed(out, tmp_path, f"{tag}-1", die_at, "before-rename")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert_no_orphans(f"{tag}-1")
    assert len(records(out)) == die_at - 1
    [temp] = temp_files(out)
    assert temp.parent.parent == out / "episodes" and temp.name.endswith(".tmp")
    EpisodeRecord.from_json(temp.read_text())  # complete, but never renamed: not a record
    assert len(ResultStore(out).done()) == die_at - 1
    assert not (out / "results.json").exists()

    # Run 2: dies once `more` further records are in place.
    second = run_cli_until_killed(out, tmp_path, f"{tag}-2", more, "after-rename")
    assert second.returncode == -signal.SIGKILL, second.stderr[-3000:]
    assert_no_orphans(f"{tag}-2")
    assert not temp.exists()  # the rerun removed run 1's temp file before starting
    assert len(records(out)) == die_at - 1 + more < EPISODES
    before = snapshot(out)

    # Run 3: the same config, in this process, to the end.
    summary = run(random_config(out))
    after = snapshot(out)
    assert {p: after[p] for p in before} == before  # finished episodes were kept, not rerun
    assert_same_episodes(out, reference, summary)


def test_stray_temp_files_are_never_counted_and_a_rerun_removes_them(tmp_path, reference):
    """What interrupted atomic writes leave (temp files of a record, results.json and a video)
    beside a complete run: a rerun counts only the records, runs nothing and cleans up."""
    out = tmp_path / "out"
    EvalManager(random_config(out)).plan.protocol.resume(has_episodes=False, allow=False)  # as the complete run left it
    store = ResultStore(out)
    for rec in reference.values():
        store.write(EpisodeRecord(**rec))
    record_dir = store.episode_path(REACH, 0).parent
    leftovers = [record_dir / ".00000.json.k3j9x1.tmp", record_dir / ".00007.json.a8b2c4.tmp", out / ".results.json.zz9.tmp",
                 out / "videos" / record_dir.name / ".00001.q1w2e3.tmp.mp4"]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"task": "wam_gym/MetaWorld-reach-v3", "trial": 7')  # cut short
    assert store.missing(planned()) == [] and len(store.records()) == EPISODES

    started = []
    summary = run(random_config(out), lambda *args: started.append(args))

    assert started == []  # nothing to run
    assert not any(p.exists() for p in leftovers)
    assert_same_episodes(out, reference, summary)


# ----------------------------------------------------------------- the actor alone
class _CountingEnv:
    """Just enough of a gymnasium env for _Actor.run (no simulator, no GL in the test process)."""

    def __init__(self):
        import gymnasium

        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (4,))
        self.spec, self.steps = None, 0

    def reset(self, seed=None, options=None):
        return {"state": self.action_space.sample()}, {}

    def step(self, action):
        self.steps += 1
        return {"state": action}, 0.0, False, False, {}

    def close(self):
        pass


def test_actor_stops_mid_episode_when_its_manager_is_gone(tmp_path):
    job = plan(resolve_tasks([REACH]), 1, SEED)[0]
    actor = actor_module._Actor(0, actor_module.ActorSpec(agent="random", output_dir=str(tmp_path),
                                                          max_episode_steps=5), None)
    env = actor.envs[REACH] = _CountingEnv()
    assert actor.run(job).steps == env.steps == 5

    actor.manager = -1  # what os.getppid() no longer returns once the manager died and init adopted us
    with pytest.raises(actor_module.ManagerGone):
        actor.run(job)
    assert env.steps == 5  # not one more step for nobody
