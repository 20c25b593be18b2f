"""scripts/psnr_score.py on real mp4 files written with wam_gym.utils.video.write_mp4."""

import json
import os
import subprocess
import sys
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from tests.conftest import load_script
from wam_gym.utils import metrics
from wam_gym.utils.video import read_mp4, write_mp4

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "psnr_score.py"


psnr_score = load_script("psnr_score")


def smooth_video(t: int = 4, h: int = 64, w: int = 64) -> np.ndarray:
    """Low-frequency gradients in [40, 240]: H.264 keeps them well and an offset cannot clip."""
    y, x = np.mgrid[0:h, 0:w]
    y, x = y * 64 // h, x * 64 // w
    return np.stack([np.stack([40 + 2 * x + i, 40 + 2 * y, 100 + x + y], -1) for i in range(t)]).astype(np.uint8)


@pytest.fixture
def gt_path(tmp_path):
    return write_mp4(tmp_path / "gt.mp4", smooth_video())


def run_main(*args) -> int:
    return psnr_score.main([str(a) for a in args])


def test_identical_video_scores_at_the_cap(gt_path, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert run_main("--gt_video", gt_path, "--pred_video", gt_path, "--output_file", out) == 0
    result = json.loads(out.read_text())
    assert result["num_frames"] == 4 and result["size"] == [64, 64]
    assert result["psnr"] == metrics.PSNR_CAP_DB
    assert result["per_frame_psnr"] == [metrics.PSNR_CAP_DB] * 4  # capped, never inf/null
    assert result["ssim"] == pytest.approx(1.0, abs=1e-9)
    assert result["per_frame_ssim"] == pytest.approx([1.0] * 4, abs=1e-9)
    assert result["gt_video"] == str(gt_path) and result["pred_video"] == str(gt_path)
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "PSNR 100.00 dB" in line and "SSIM 1.0000" in line


def test_known_offset_psnr_within_1db_and_equal_to_decoded_arrays(gt_path, tmp_path):
    gt = smooth_video()
    pred_path = write_mp4(tmp_path / "pred.mp4", gt + np.uint8(8))  # MSE 64 -> 20 log10(255/8)
    result = psnr_score.score_videos(gt_path, pred_path)
    assert result["psnr"] == pytest.approx(20 * np.log10(255 / 8), abs=1.0)
    g, p = read_mp4(gt_path), read_mp4(pred_path)
    assert result["psnr"] == pytest.approx(metrics.psnr(g, p), rel=1e-12)
    assert result["per_frame_psnr"] == pytest.approx(list(metrics.per_frame_psnr(g, p)), rel=1e-12)
    assert result["ssim"] == pytest.approx(metrics.ssim(g, p), rel=1e-12)
    assert np.mean(result["per_frame_psnr"]) == pytest.approx(result["psnr"])
    assert 0.5 < result["ssim"] < 1.0


def test_resizes_to_the_smaller_size(gt_path, tmp_path):
    small_path = write_mp4(tmp_path / "small.mp4", smooth_video(h=32, w=32))
    result = psnr_score.score_videos(gt_path, small_path)
    assert result["size"] == [32, 32]
    expected = metrics.psnr(metrics.resize_video(read_mp4(gt_path), (32, 32)), read_mp4(small_path))
    assert result["psnr"] == pytest.approx(expected, rel=1e-12)
    assert result["psnr"] > 25 and result["ssim"] > 0.8  # the same picture at half resolution


def test_size_flag_and_other_aspect_ratio(gt_path, tmp_path):
    wide_path = write_mp4(tmp_path / "wide.mp4", smooth_video(h=32, w=48))
    assert psnr_score.score_videos(gt_path, wide_path)["size"] == [32, 48]
    assert psnr_score.score_videos(gt_path, wide_path, size=(16, 24))["size"] == [16, 24]


def test_small_frames_skip_ssim_with_a_warning(gt_path, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert run_main("--gt_video", gt_path, "--pred_video", gt_path, "--output_file", out, "--size", 8, 8) == 0
    result = json.loads(out.read_text())
    assert result["size"] == [8, 8] and result["psnr"] == metrics.PSNR_CAP_DB
    assert result["ssim"] is None and result["per_frame_ssim"] is None
    captured = capsys.readouterr()
    assert captured.err.startswith("psnr_score.py: warning: frames are 8x8") and "SSIM n/a" in captured.out


def test_truncate_scores_the_common_prefix(gt_path, tmp_path):
    short_path = write_mp4(tmp_path / "short.mp4", smooth_video(t=3))
    result = psnr_score.score_videos(gt_path, short_path, truncate=True)
    assert (result["num_frames"], result["gt_frames"], result["pred_frames"]) == (3, 4, 3)
    assert len(result["per_frame_psnr"]) == len(result["per_frame_ssim"]) == 3


def _zero_frame_mp4(tmp_path: Path) -> Path:
    """An mp4 with a video stream but no frames: stream-copy from a seek past the end."""
    src = write_mp4(tmp_path / "src.mp4", smooth_video(t=2, h=16, w=16))
    dst = tmp_path / "zero_frames.mp4"
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error", "-ss", "5", "-i", str(src), "-c", "copy", str(dst)]
    subprocess.run(cmd, check=True, capture_output=True)
    return dst


def _bad_input(tmp_path: Path, case: str) -> tuple[Path, str]:
    """(a bad --pred_video, a phrase its error message must contain)."""
    path = tmp_path / f"{case}.mp4"
    if case == "missing":
        return path, "no such file"
    if case == "corrupt":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
        return path, "not a readable video"
    if case == "zero_bytes":
        path.touch()
        return path, "0 bytes"
    if case == "no_frames":
        return _zero_frame_mp4(tmp_path), "no frames"
    if case == "frame_count":
        return write_mp4(path, smooth_video(t=3)), "--gt_video has 4, --pred_video has 3"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing", "corrupt", "zero_bytes", "no_frames", "frame_count"])
def test_errors_are_one_line_exit_2_and_keep_the_output(case, gt_path, tmp_path, capsys):
    bad, phrase = _bad_input(tmp_path, case)
    out = tmp_path / "result.json"
    out.write_text("previous result\n")
    assert run_main("--gt_video", gt_path, "--pred_video", bad, "--output_file", out) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("psnr_score.py: error: ") and phrase in err
    assert str(bad) in err or case == "frame_count"
    assert "Traceback" not in captured.err and captured.out == ""
    assert out.read_text() == "previous result\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left


def test_frame_count_error_suggests_truncate(gt_path, tmp_path, capsys):
    short_path = write_mp4(tmp_path / "short.mp4", smooth_video(t=3))
    out = tmp_path / "result.json"
    assert run_main("--gt_video", gt_path, "--pred_video", short_path, "--output_file", out) == 2
    assert "--truncate" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize(
    "extra, phrase",
    [(["--size", "0", "8"], "--size must be two positive integers"), (["--data_range", "0"], "--data_range must be")],
)
def test_bad_flags(extra, phrase, gt_path, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert run_main("--gt_video", gt_path, "--pred_video", gt_path, "--output_file", out, *extra) == 2
    assert phrase in capsys.readouterr().err and not out.exists()


def test_a_size_that_cannot_fit_in_memory_is_refused_up_front(gt_path, tmp_path, capsys, monkeypatch):
    out = tmp_path / "result.json"
    out.write_text("previous result\n")
    monkeypatch.setattr(psnr_score, "_available_memory", lambda: 2**30)  # 1 GiB
    resized = []
    monkeypatch.setattr(psnr_score.metrics, "resize_video", lambda *a: resized.append(a) or a[0])
    assert run_main("--gt_video", gt_path, "--pred_video", gt_path, "--output_file", out, "--size", 4000, 4000) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("psnr_score.py: error: --size 4000 4000 needs about 34.3 GiB to score 4 frames")
    assert "1.0 GiB is available: pass a smaller --size (the videos are 64x64" in err
    assert resized == [] and out.read_text() == "previous result\n"  # refused before any allocation


def test_a_size_beyond_any_memory_is_refused(gt_path, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert run_main("--gt_video", gt_path, "--pred_video", gt_path, "--output_file", out, "--size", 200000, 200000) == 2
    assert "pass a smaller --size" in capsys.readouterr().err and not out.exists()


def test_output_must_not_be_an_input_or_a_directory(gt_path, tmp_path, capsys):
    before = gt_path.read_bytes()
    assert run_main("--gt_video", gt_path, "--pred_video", gt_path, "--output_file", gt_path) == 2
    assert "is one of the input videos" in capsys.readouterr().err and gt_path.read_bytes() == before
    assert run_main("--gt_video", gt_path, "--pred_video", gt_path, "--output_file", tmp_path) == 2
    assert "is a directory" in capsys.readouterr().err


def test_cli_end_to_end(gt_path, tmp_path):
    pred_path = write_mp4(tmp_path / "pred.mp4", smooth_video() + np.uint8(8))
    out = tmp_path / "nested" / "result.json"
    cmd = [sys.executable, str(SCRIPT), "--gt_video", str(gt_path), "--pred_video", str(pred_path), "--output_file", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result == psnr_score.score_videos(gt_path, pred_path)
    assert proc.stdout.count("\n") == 1 and f"PSNR {result['psnr']:.2f} dB" in proc.stdout
