"""make demo's pipeline, shortened (--quick): every stage runs for real and leaves its artifacts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from wam_gym.utils.video import read_mp4


def test_quick_demo_produces_every_artifact(tmp_path):
    out = tmp_path / "demo"
    run = subprocess.run([sys.executable, "-m", "wam_gym.demo", "--quick", "--output", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for path in ("data/meta/info.json", "data/meta/stats.json", "vae/config.json", "vae/fit_vae.json", "cache/cache_meta.json",
                 "train/checkpoint/wam_config.json", "train/checkpoint/dataset_stats.json", "report.md"):
        assert (out / path).is_file(), path
    assert list((out / "train" / "tensorboard").glob("events.*"))
    report = json.loads((out / "report.json").read_text())
    assert [row["task"] for row in report["tasks"]] == report["config"]["tasks"]
    for agent in ("wam", "expert", "random"):
        results = json.loads((out / "eval" / agent / "results.json").read_text())
        assert results["complete"] and results["overall"]["episodes"] == len(report["tasks"])
        assert 0.0 <= report["overall"][agent] <= 1.0
    assert report["broker"]["requests"] > 0 and report["broker"]["mean_batch_size"] >= 1
    assert len(report["outputs"]["videos"]) == len(report["tasks"])
    frames = read_mp4(out / report["outputs"]["videos"][0])
    size = report["config"]["image_size"]
    assert frames.shape[1:] == (size, 2 * 2 * size, 3)  # two cameras | the predicted future
    markdown = (out / "report.md").read_text()
    assert "| task | WAM | scripted expert | random | WAM - random (paired) |" in markdown
    # intervals on every rate, and the WAM paired with the random agent on the same episodes
    assert all(len(report["overall_ci95"][a]) == 2 for a in ("wam", "expert", "random"))
    assert report["wam_vs_random"]["overall"]["pairs"] == len(report["tasks"]) and "paired over all 2 episodes" in markdown
    assert all(row["wam_vs_random"]["pairs"] == 1 for row in report["tasks"])
    # every stage printed progress (the piped console gets a line at most every 30 s, and the stage's time)
    for stage in ("collect", "fit_vae", "cache", "train", "eval_wam"):
        assert re.search(rf"\[demo\] {stage}: \d+ s", run.stdout), stage
    trained = json.loads((out / "train" / "checkpoint" / "wam_config.json").read_text())
    assert trained["vae"]["z_dim"] == 32 and trained["vae"]["scale_factor_temporal"] == 1  # fit_vae's VAE
    assert trained["video_target"] == "change"
    assert "--action-noise 0.5" in run.stdout  # DART-style demos
    assert json.loads((out / "eval" / "wam" / "results.json").read_text())["config"]["EVALUATION"]["future_video"] == "expected"
    # a rerun resumes: every stage is found done
    again = subprocess.run([sys.executable, "-m", "wam_gym.demo", "--quick", "--output", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done already") == 7

    # --world-model: the demo's stages are found done, then a world model trained on several behaviours ranks policies.
    # A detector is in place, so the stage uses it (training one is tests/test_world_model_eval.py's, and a minute here)
    from tests.test_world_model_eval import detector_that_says

    detector_that_says(False, out / "world_model" / "detector")
    world = subprocess.run([sys.executable, "-m", "wam_gym.demo", "--quick", "--world-model", "--output", str(out)],
                           capture_output=True, text=True, timeout=900)
    assert world.returncode == 0, world.stdout[-3000:] + world.stderr[-3000:]
    assert world.stdout.count("done already") == 7
    assert "--agent expert --agent random" in world.stdout and "--max-steps 12" in world.stdout
    wm = out / "world_model"
    trained = json.loads((wm / "train" / "train_config.json").read_text())
    assert trained["world_model_prob"] == 1.0 and trained["model"]["action_expert"]["predict_state"] is True
    assert trained["dataset"]["root"] == str(wm / "data") and trained["model"]["vae_path"] == str(out / "vae")
    result = json.loads((wm / "eval" / "results.json").read_text())
    assert sorted(result["outcomes"]) == ["expert", "random", "wam=checkpoint"]
    assert result["detector"]["held_out_accuracy"] == 1.0  # the detector in place, not a new one
    assert not any(any(trials) for runs in result["outcomes"].values() for trials in runs["world_model"].values())
    assert result["settings"]["steps"] == 12 and (wm / "eval" / "scatter.png").is_file()
    assert "spearman" in (wm / "eval" / "summary.md").read_text() and "spearman" in world.stdout


def test_a_stage_shows_its_newest_progress_line_and_keeps_the_whole_log(tmp_path, capsys):
    from wam_gym.demo import Progress, _follow

    script = "import time\nfor i in range(1, 4):\n    print(f'\\r{i}/3 [00:0{i}<00:0{3 - i}]', end='', flush=True)\n" \
             "    time.sleep(0.05)\nprint('\\ndone')\n"
    log = tmp_path / "stage.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert _follow(process, handle, Progress("train", every_s=0.0)) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[:3] == [f"[demo] train 0s | {i}/3 [00:0{i}<00:0{3 - i}]" for i in (1, 2, 3)] and shown[3].endswith("| done")
    assert log.read_bytes() == b"\r1/3 [00:01<00:02]\r2/3 [00:02<00:01]\r3/3 [00:03<00:00]\ndone\n"
