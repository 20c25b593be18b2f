"""bench/fingerprint.py end to end, tiny: every row printed, every run the same fingerprint (the bench exits 1
otherwise). No timing thresholds: the ratios are the bench's to print, not the test's to judge."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "fingerprint.py"


def test_cold_and_warm_rows_are_printed(tmp_path):
    done = subprocess.run([sys.executable, BENCH, "--gb", "0.01", "--files", "2", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "checkpoint: 0.01 GB in 2 safetensors files + wam_config.json"
    rows = {line[:28].strip(): line[28:].split() for line in lines[2:-1]}
    assert list(rows) == ["cold, from disk", "cold, from the page cache", "warm (cache hits)"]
    for seconds, per_gb in rows.values():
        assert float(seconds) > 0 and float(per_gb) * 0.01 == pytest.approx(float(seconds), abs=1e-4)
    assert lines[-1].startswith("cold/warm: from disk ") and ", from the page cache " in lines[-1]
    assert list(tmp_path.iterdir()) == []  # the checkpoint and its caches are removed
