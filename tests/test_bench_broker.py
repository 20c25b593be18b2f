"""bench/broker.py --standin end to end, tiny: the broker and vla-eval's real server both serve the
stand-in workload, and every column is printed (no timing thresholds: the ratios are the bench's
to print, not the test's to judge; tests/test_pacing.py checks the batching rule exactly). The
timing is a user's own (--latency-ms and the rest), not the issue's default."""

import subprocess
import sys
from pathlib import Path

from bench.standin import Workload

BENCH = Path(__file__).resolve().parents[1] / "bench" / "broker.py"


def test_standin_points_print_broker_bound_best_and_vla_eval(tmp_path):
    done = subprocess.run([sys.executable, BENCH, "--standin", "--point", "2,1,4,32,1", "--point", "3,2,4,32,2",
                           "--latency-ms", "20", "--per-row-ms", "2", "--env-step-ms", "5", "--replan-steps", "4",
                           "--warmup-s", "0.5", "--measure-s", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line[:1] == " " and line.split()[0].isdigit()]
    assert [row[:5] for row in rows] == [["2", "1", "4", "32", "1"], ["3", "2", "4", "32", "2"]]
    assert "L(b) = 20 + 2*b ms (sleep), env step 5 ms (sleep), replan every 4" in done.stdout
    timing = {"latency_s": 0.020, "per_row_s": 0.002, "env_step_s": 0.005, "replan_steps": 4}
    assert [float(row[6]) for row in rows] == [round(Workload(2, 1, 4, **timing).bound()),
                                              round(Workload(3, 2, 4, **timing).bound())]
    header = next(line.split() for line in done.stdout.splitlines() if line.split()[:2] == ["N", "W"])
    assert header[-4:] == ["wait50", "fill50", "us/req", "stack50"]
    for row in rows:
        assert len(row) == len(header)
        wait50, fill50, stack50 = float(row[-4]), float(row[-3]), float(row[-1])
        assert wait50 >= 0 and fill50 >= 0  # the broker's queue wait, and the part spent filling batches
        assert stack50 > 0  # the workers stacked every batch (2 x 32x32 images a row)
        broker, bound, as_run, best, rule, lockstep, issue, vla_eval = map(float, row[5:13])
        assert broker > 0 and vla_eval > 0 and lockstep > 0 and issue > 0
        assert 0 < best <= bound and 0 < rule <= bound * 1.001
        assert 0 < as_run <= bound  # the envs' and the model's sleeps never end early
    assert "broker/vla-eval: min" in done.stdout
