"""bench/eval_throughput.py runs, and checks what it measures: both render modes act alike."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="needs wam_gym[metaworld]")
ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_prints_one_row_per_replan_interval(tiny_ckpt, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    sys.modules.pop("eval_throughput", None)
    import eval_throughput

    eval_throughput.main(["--suite", "metaworld", "--ckpt", str(tiny_ckpt), "--replan", "4", "8", "--image-size", "32",
                          "--inference-steps", "2", "--steps", "16", "--tasks", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["4", "8"]
    for row in rows:  # every-step, needed, ratio, bound, bound ratio, env-side ratio: all measured
        assert len([cell for cell in row.split("|") if cell.strip()]) == 7
