"""scripts/tune_eval_concurrency.py against a fake evaluation manager (a module in tmp_path)."""

import csv
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tune_eval_concurrency.py"


def _load_tuner():
    spec = importlib.util.spec_from_file_location("tune_eval_concurrency", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


tuner = _load_tuner()

# The fake manager: parses key=value overrides, records its argv, sleeps 0.3 s / batch size,
# and behaves per FAKE_PLAN (JSON {"<envs>,<batch>,<wait>": mode}); it writes FAKE_MARKER if set.
FAKE_MANAGER = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    if os.environ.get("FAKE_MARKER"):
        open(os.environ["FAKE_MARKER"], "a").write(" ".join(sys.argv[1:]) + "\\n")
    out = args["EVALUATION.output_dir"]
    envs, batch = int(args["MULTIRUN.env_num_per_worker"]), int(args["MULTIRUN.inference_batch_size"])
    wait = args["MULTIRUN.inference_batch_wait_ms"]
    mode = json.loads(os.environ.get("FAKE_PLAN", "{}")).get(f"{envs},{batch},{wait}", "ok")
    os.makedirs(out, exist_ok=True)
    json.dump(sys.argv[1:], open(os.path.join(out, "argv.json"), "w"))
    print(f"fake manager: {envs} envs, batch {batch}, mode {mode}", flush=True)
    if mode == "fail":
        sys.exit(3)
    if mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
        sys.exit(1)
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open(os.path.join(out, "child.pid"), "w").write(str(child.pid))
        time.sleep(120)
    time.sleep(0.3 / batch)
    episodes = 2 * envs
    json.dump({"complete": mode != "incomplete", "overall": {"episodes": episodes, "successes": envs,
               "success_rate": 0.5}, "wall_time_s": 0.3 / batch}, open(os.path.join(out, "results.json"), "w"))
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """cwd = tmp_path, the fake manager importable by the subprocesses, no nvidia-smi on PATH."""
    (tmp_path / "fake_manager.py").write_text(FAKE_MANAGER)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PATH", str(empty_bin))  # the manager is launched via sys.executable's full path
    monkeypatch.delenv("FAKE_PLAN", raising=False)
    monkeypatch.delenv("FAKE_MARKER", raising=False)
    return tmp_path


def _session_dir(root: Path, benchmark: str = "fakebench") -> Path:
    (session,) = (root / benchmark).iterdir()
    return session


def _cli(*extra, forwarded=()):
    return ["--benchmark", "fakebench", "--manager-module", "fake_manager", "--repeats", "1", *extra, "--", *forwarded]


# ------------------------------------------------------------------ pure functions


def test_parse_list_and_cli_errors(capsys):
    assert tuner.parse_list("4, 8,4", int, 1, "--env-counts") == [4, 8]
    assert tuner.parse_list("0,2.5", float, 0, "--wait-ms") == [0.0, 2.5]
    for bad, message in [("4,x", "'x' is not an integer"), ("4,,8", "comma-separated"), ("0,4", "must be positive")]:
        with pytest.raises(SystemExit) as exit_info:
            tuner.main(["--benchmark", "b", "--env-counts", bad])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    for argv, message in [
        (["--env-counts", "4"], "--benchmark"),
        (["--benchmark", "b", "--wait-ms", "-1"], "non-negative"),
        (["--benchmark", "b", "--repeats", "0"], "--repeats: must be positive"),
        (["--benchmark", "b", "--timeout-seconds", "abc"], "not a number"),
        (["--benchmark", "b", "--", "benchmark=other"], "--benchmark"),
    ]:
        with pytest.raises(SystemExit):
            tuner.main(argv)
        assert message in capsys.readouterr().err


def test_grid_skips_batches_larger_than_env_count():
    to_run, skipped = tuner.build_grid([4, 8], [2, 4, 8], [0.0, 10.0])
    assert [(c.env_count, c.batch_size, c.wait_ms) for c in skipped] == [(4, 8, 0.0), (4, 8, 10.0)]
    assert len(to_run) == 10 and all(c.batch_size <= c.env_count for c in to_run)


def test_split_forwarded_drops_only_owned_keys():
    kept, dropped = tuner.split_forwarded(
        [
            "task=x",
            "MULTIRUN.env_num_per_worker=16",
            "+EVALUATION.output_dir=/tmp/o",
            "++MULTIRUN.inference_batch_size=3",
            "MULTIRUN.inference_batch_wait_ms=5",
            "MULTIRUN.num_gpus=3",
            "MULTIRUN.env_num_per_worker_extra=1",
        ]
    )
    assert kept == ["task=x", "MULTIRUN.num_gpus=3", "MULTIRUN.env_num_per_worker_extra=1"]
    assert len(dropped) == 4


def test_classify():
    done = {"complete": True}
    assert tuner.classify(0, False, None, done, None) == ("ok", None, None)
    assert tuner.classify(0, False, "Killed 2 idle workers", done, None)[0] == "ok"  # OOM text only explains failures
    assert tuner.classify(None, True, None, None, "missing_results")[:2] == ("timeout", "timeout")
    assert tuner.classify(3, False, None, None, "missing_results")[:2] == ("failed", "exit_code")
    assert tuner.classify(0, False, None, None, "missing_results")[:2] == ("failed", "missing_results")
    assert tuner.classify(0, False, None, {"complete": False}, None)[:2] == ("failed", "incomplete")
    assert tuner.classify(-9, False, None, None, "missing_results")[:2] == ("oom", "sigkill")
    for text in [
        "CUDA out of memory",
        "torch.OutOfMemoryError: x",
        "OutOfMemoryError",
        "Killed",
        "MemoryError",
        "OSError: Cannot Allocate Memory",
        "cuda OUT OF MEMORY",
    ]:
        line = tuner.find_oom_line(f"step 1\n  {text}\n")
        assert line == text
        assert tuner.classify(1, False, line, None, "missing_results") == ("oom", "oom_message", text)
    assert tuner.find_oom_line("all good\n") is None


def test_parse_gpu_memory():
    assert tuner.parse_gpu_memory("0, 1200\n1, 34000\nbad line\n2, [N/A]\n") == {0: 1200, 1: 34000}


def _row(envs, batch, wait, median, status="ok", runs=2):
    return tuner.ConfigSummary(
        envs, batch, wait, runs=runs, ok_runs=runs if status == "ok" else 0, median_wall_s=median, status=status
    )


def test_recommend_smallest_within_three_percent():
    rows = [
        _row(8, 8, 0.0, 100.0),  # fastest
        _row(8, 4, 10.0, 101.0),
        _row(8, 4, 0.0, 102.9),  # smallest within 3% (env 8, batch 4, wait 0)
        _row(4, 4, 0.0, 103.5),  # 3.5% slower: out
        _row(4, 2, 0.0, 50.0, status="oom"),  # fastest of all but not fully ok
        _row(2, 2, 0.0, None, status="skipped", runs=0),
    ]
    best = tuner.recommend(rows)
    assert (best.env_count, best.batch_size, best.wait_ms) == (8, 4, 0.0)
    assert tuner.recommend([_row(8, 8, 0.0, 100.0), _row(4, 2, 0.0, 103.0)]).env_count == 4  # exactly 3% counts
    partial = tuner.ConfigSummary(4, 2, 0.0, runs=2, ok_runs=1, median_wall_s=1.0, status="ok+timeout")
    assert tuner.recommend([_row(8, 8, 0.0, 100.0), partial]).env_count == 8
    assert tuner.recommend([partial, _row(4, 4, 0.0, None, status="failed")]) is None
    assert tuner.recommend([]) is None


# ------------------------------------------------------------------ end to end


def test_dry_run_launches_and_writes_nothing(workdir, monkeypatch, capsys):
    marker = workdir / "launched.txt"
    monkeypatch.setenv("FAKE_MARKER", str(marker))
    before = sorted(p.name for p in workdir.iterdir())
    code = tuner.main(_cli("--env-counts", "2,4", "--batch-sizes", "1,4", "--wait-ms", "0", "--dry-run", forwarded=["task=x"]))
    out = capsys.readouterr().out
    assert code == 0
    assert not marker.exists() and sorted(p.name for p in workdir.iterdir()) == before
    assert "skip env2_bs4_wait0: batch size 4 > env count 2" in out
    for name in ["env2_bs1_wait0_r1", "env4_bs1_wait0_r1", "env4_bs4_wait0_r1"]:
        assert f"[{name}] output: {workdir}/evaluate_results/concurrency_tuning/fakebench/" in out
        assert f"runs/{name}/output" in out
    assert out.count("-m fake_manager benchmark=fakebench task=x EVALUATION.output_dir=") == 3


def test_libero_pro_is_a_benchmark_the_tuner_runs():
    """benchmark=libero_pro names the default task sets, LIBERO-Pro's 16 (the manager resolves them)."""
    from wam_gym.eval.tasks import BENCHMARK_TASK_SETS, resolve_tasks

    sets = BENCHMARK_TASK_SETS["libero_pro"]
    assert len(sets) == 16 and "libero_pro_spatial_swap" in sets and len(resolve_tasks(sets)) == 160
    config = tuner.Config(4, 4, 0.0)
    command = tuner.build_command("wam_gym.eval", "libero_pro", ["ckpt=x"], config, "out")
    assert command[1:4] == ["-m", "wam_gym.eval", "benchmark=libero_pro"]


def test_end_to_end_statuses_layout_and_recommendation(workdir, monkeypatch, capsys):
    plan = {"2,1,0": "fail", "2,2,0": "oom", "4,1,0": "incomplete"}  # (4,2,0) and (4,4,0) succeed
    monkeypatch.setenv("FAKE_PLAN", json.dumps(plan))
    forwarded = ["task=x", "MULTIRUN.env_num_per_worker=99", "+EVALUATION.output_dir=/nope", "MULTIRUN.num_gpus=3"]
    code = tuner.main(
        _cli("--env-counts", "2,4", "--batch-sizes", "1,2,4", "--wait-ms", "0", "--output-root", "tuning", forwarded=forwarded)
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "dropping forwarded override 'MULTIRUN.env_num_per_worker=99'" in out
    assert "dropping forwarded override '+EVALUATION.output_dir=/nope'" in out
    assert out.count("nvidia-smi not found") == 1

    session = _session_dir(workdir / "tuning")
    results = json.loads((session / "results.json").read_text())
    runs = {run["name"]: run for run in results["runs"]}
    assert set(runs) == {"env2_bs1_wait0_r1", "env2_bs2_wait0_r1", "env4_bs1_wait0_r1", "env4_bs2_wait0_r1", "env4_bs4_wait0_r1"}
    assert results["skipped"] == [{"env_count": 2, "batch_size": 4, "wait_ms": 0.0, "reason": "batch size > env count"}]
    assert results["dropped_overrides"] == ["MULTIRUN.env_num_per_worker=99", "+EVALUATION.output_dir=/nope"]
    statuses = {name: (run["status"], run["error_kind"]) for name, run in runs.items()}
    assert statuses == {
        "env2_bs1_wait0_r1": ("failed", "exit_code"),
        "env2_bs2_wait0_r1": ("oom", "oom_message"),
        "env4_bs1_wait0_r1": ("failed", "incomplete"),
        "env4_bs2_wait0_r1": ("ok", None),
        "env4_bs4_wait0_r1": ("ok", None),
    }
    assert runs["env2_bs1_wait0_r1"]["exit_code"] == 3

    for name, run in runs.items():
        run_dir = session / "runs" / name
        assert run["output_dir"] == str(workdir / "tuning" / "fakebench" / session.name / "runs" / name / "output")
        assert (run_dir / "command.txt").read_text().strip() == tuner.shlex.join(run["command"])
        assert "fake manager:" in (run_dir / "manager.log").read_text()
        assert run["peak_gpu_memory_mib"] is None and run["wall_s"] > 0 and run["repeat"] == 1
        argv = json.loads((run_dir / "output" / "argv.json").read_text())
        assert argv[0] == "benchmark=fakebench" and argv[1:3] == ["task=x", "MULTIRUN.num_gpus=3"]
        assert "MULTIRUN.env_num_per_worker=99" not in argv and "+EVALUATION.output_dir=/nope" not in argv
        for key, value in [
            ("EVALUATION.output_dir", run["output_dir"]),
            ("MULTIRUN.env_num_per_worker", str(run["env_count"])),
            ("MULTIRUN.inference_batch_size", str(run["batch_size"])),
            ("MULTIRUN.inference_batch_wait_ms", "0"),
        ]:
            assert [a for a in argv if a.split("=")[0].lstrip("+") == key] == [f"{key}={value}"]
    assert "CUDA out of memory" in (session / "runs" / "env2_bs2_wait0_r1" / "manager.log").read_text()
    assert runs["env4_bs4_wait0_r1"]["manager_summary"] == {
        "complete": True,
        "overall": {"episodes": 8, "successes": 4, "success_rate": 0.5},
        "wall_time_s": 0.075,
    }

    with open(session / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["env_num_per_worker"], r["inference_batch_size"], r["status"]) for r in rows] == [
        ("2", "1", "failed"),
        ("2", "2", "oom"),
        ("2", "4", "skipped"),
        ("4", "1", "failed"),
        ("4", "2", "ok"),
        ("4", "4", "ok"),
    ]
    assert rows[4]["runs"] == "1" and rows[4]["successes"] == "4" and rows[4]["median_wall_s"] != ""
    assert rows[2]["runs"] == "0" and rows[2]["median_wall_s"] == ""

    # The stored recommendation is recommend() applied to the stored configurations.
    recommendation = results["recommendation"]
    expected = tuner.recommend([tuner.ConfigSummary(**c) for c in results["configurations"]])
    assert (recommendation["env_num_per_worker"], recommendation["inference_batch_size"]) == (
        expected.env_count,
        expected.batch_size,
    )
    assert (expected.env_count, expected.batch_size) in {(4, 2), (4, 4)}
    assert "overrides: " + " ".join(recommendation["overrides"]) in out
    assert recommendation["overrides"] == [
        "MULTIRUN.env_num_per_worker=4",
        f"MULTIRUN.inference_batch_size={expected.batch_size}",
        "MULTIRUN.inference_batch_wait_ms=0",
    ]


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie waiting for a reaper is dead too


def _hanging_child_pid(root: Path) -> int | None:
    """The pid the fake manager in "hang" mode wrote, once it has started its child and written it."""
    for path in root.rglob("child.pid"):
        if text := path.read_text().strip():
            return int(text)
    return None


def test_timeout_kills_process_group_and_no_recommendation(workdir, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_PLAN", json.dumps({"1,1,0": "hang"}))

    class TimedFromTheHang(subprocess.Popen):
        """The time limit (``wait(timeout)``) counts from when the fake manager hangs with its child
        started, not from launch: on a loaded machine a limit counted from launch could run out first."""

        def wait(self, timeout=None):
            if timeout is not None:
                deadline = time.monotonic() + 120
                while self.poll() is None and _hanging_child_pid(workdir) is None and time.monotonic() < deadline:
                    time.sleep(0.01)
            return super().wait(timeout)

    monkeypatch.setattr(tuner.subprocess, "Popen", TimedFromTheHang)
    code = tuner.main(_cli("--env-counts", "1", "--batch-sizes", "1", "--wait-ms", "0", "--timeout-seconds", "0.5"))
    out = capsys.readouterr().out
    assert code == 1 and "no configuration succeeded" in out
    session = _session_dir(workdir / "evaluate_results" / "concurrency_tuning")
    results = json.loads((session / "results.json").read_text())
    (run,) = results["runs"]
    assert (run["status"], run["error_kind"]) == ("timeout", "timeout")
    assert results["recommendation"] is None
    child_pid = int((session / "runs" / run["name"] / "output" / "child.pid").read_text())
    assert child_pid == _hanging_child_pid(workdir)
    deadline = time.monotonic() + 60  # the group was signalled: the child exits as soon as it is scheduled
    while not _dead(child_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _dead(child_pid)  # the manager's own child went down with the group


def test_gpu_peaks_from_nvidia_smi(workdir, capsys):
    fake_smi = workdir / "bin" / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\nprintf '0, 100\\n1, 2000\\n2, 300\\n'\n")
    fake_smi.chmod(0o755)
    code = tuner.main(_cli("--env-counts", "1", "--batch-sizes", "1", "--wait-ms", "0", "--monitor-gpu-ids", "0,2,7"))
    assert code == 0 and "nvidia-smi not found" not in capsys.readouterr().out
    results = json.loads((_session_dir(workdir / "evaluate_results" / "concurrency_tuning") / "results.json").read_text())
    assert results["runs"][0]["peak_gpu_memory_mib"] == {"0": 100, "2": 300, "7": None}


def test_runs_as_a_script(workdir):
    # The CLI entry point itself, in a fresh interpreter, as a user runs it.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *_cli("--env-counts", "1", "--batch-sizes", "1", "--wait-ms", "0", "--dry-run")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    assert "env1_bs1_wait0_r1" in proc.stdout
