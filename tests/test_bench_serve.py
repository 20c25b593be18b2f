"""bench/serve.py end to end, tiny: every path at every client count reports positive numbers
(no timing thresholds: the numbers are the bench's to print, not the test's to judge)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "serve.py"
PATHS = {"in-process", "server openpi", "server vla-eval png", "server vla-eval raw"}


def test_quick_run_reports_every_path_and_client_count(tmp_path):
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, BENCH, "--clients", "1", "2", "--calls", "3", "--delay-ms", "5",
                           "--image-size", "32", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "server / in-process:" in done.stdout
    report = json.loads(out.read_text())
    assert report["machine"]["cpus"] >= 1 and report["settings"]["image_size"] == 32
    rows = {(r["path"], r["clients"]): r for r in report["results"]}
    assert set(rows) == {(path, n) for path in PATHS for n in (1, 2)}
    for (_, n), row in rows.items():
        assert row["requests"] == 3 * n
        for key in ("wall_s", "requests_per_s", "p50_ms", "p95_ms", "mean_batch"):
            assert row[key] > 0, (row, key)
    ratios = {(q["path"], q["clients"]): q for q in report["ratios"]}
    assert set(ratios) == {(path, n) for path in PATHS - {"in-process"} for n in (1, 2)}
    assert all(q["throughput_ratio"] > 0 for q in ratios.values())
