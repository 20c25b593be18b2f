"""Score a predicted video against its ground truth: per-frame and mean PSNR and SSIM, as JSON.

    python scripts/psnr_score.py --gt_video gt.mp4 --pred_video pred.mp4 --output_file result.json \\
        [--size H W] [--data_range 255] [--truncate]

The flags are those of UnifoLM-WMA's psnr_score_for_challenge.py. Both videos are decoded
with wam_gym.utils.video.read_mp4 and resized (bilinear, antialiased; a different aspect ratio is
stretched) to --size, by default the smaller height and the smaller width of the two. Metrics
are those of wam_gym.utils.metrics:

* ``psnr`` is the mean of per-frame PSNR with each frame capped at PSNR_CAP_DB (100 dB);
  ``per_frame_psnr`` holds the same capped values (an identical frame is 100.0, not inf, so
  the file is plain JSON and ``mean(per_frame_psnr) == psnr``).
* SSIM needs frames of at least 11x11. Smaller frames still get PSNR; ``ssim`` and
  ``per_frame_ssim`` are then null and a warning is printed.

Videos with different frame counts are an error unless --truncate, which scores the common
prefix. Every user error (missing, unreadable or empty video, frame-count mismatch, bad
--size, a --size too large to score in the available memory) prints one line to stderr and
exits with status 2; the output file is then left as it was. The file is written atomically,
so a reader never sees half of it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from wam_gym.utils import metrics
from wam_gym.utils.publish import atomic_write_text
from wam_gym.utils.video import read_mp4

PROG = "psnr_score.py"
# float64 arrays of the scored size alive at once in SSIM (both inputs, their (T*C, 1, H, W)
# copies, three products, five blurs, the map): the measured peak is about 22 (8x1024x1024).
WORKING_COPIES = 24
MEMORY_FRACTION = 0.8  # of the available memory a run may plan to use


class ScoreError(Exception):
    """A problem with the user's input: reported as one line, exit status 2."""


def _read(path: str | Path, flag: str) -> np.ndarray:
    """Frames of one video, with the read errors turned into messages naming ``flag``."""
    path = Path(path)
    if not path.is_file():
        raise ScoreError(f"{flag} {path}: no such file (check the path)")
    if path.stat().st_size == 0:
        raise ScoreError(f"{flag} {path}: file is empty (0 bytes); re-export the video")
    try:
        return read_mp4(path)
    except ValueError as e:
        if "no frames" in str(e):
            raise ScoreError(f"{flag} {path}: video has no frames; re-export the video") from e
        raise ScoreError(f"{flag} {path}: not a readable video (corrupt or not an mp4); re-export it") from e


def _match_lengths(gt: np.ndarray, pred: np.ndarray, truncate: bool) -> tuple[np.ndarray, np.ndarray]:
    if len(gt) == len(pred):
        return gt, pred
    n = min(len(gt), len(pred))
    if not truncate:
        raise ScoreError(
            f"frame counts differ: --gt_video has {len(gt)}, --pred_video has {len(pred)}; "
            f"trim the videos or pass --truncate to score the first {n} frames"
        )
    return gt[:n], pred[:n]


def _target_size(gt: np.ndarray, pred: np.ndarray, size: tuple[int, int] | None) -> tuple[int, int]:
    if size is None:
        return min(gt.shape[1], pred.shape[1]), min(gt.shape[2], pred.shape[2])
    h, w = int(size[0]), int(size[1])
    if h < 1 or w < 1:
        raise ScoreError(f"--size must be two positive integers H W, got {h} {w}")
    return h, w


def _available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable, capped by a cgroup v2 limit (containers)."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _check_memory(frames: int, size: tuple[int, int], native: tuple[int, int]) -> None:
    """Refuse a --size whose scoring cannot fit in memory, before allocating it: it used to end
    in a MemoryError traceback (or the OOM killer) minutes in."""
    h, w = size
    need = frames * h * w * 3 * 8 * WORKING_COPIES
    available = _available_memory()
    if available is not None and need > MEMORY_FRACTION * available:
        raise ScoreError(
            f"--size {h} {w} needs about {need / 2**30:.1f} GiB to score {frames} frames ({frames}x{h}x{w}x3 float64 values, "
            f"{WORKING_COPIES} working copies for SSIM) but {available / 2**30:.1f} GiB is available: pass a smaller --size "
            f"(the videos are {native[0]}x{native[1]}; leave --size out to score at that size)"
        )


def score_videos(
    gt_video: str | Path,
    pred_video: str | Path,
    size: tuple[int, int] | None = None,
    data_range: float = 255.0,
    truncate: bool = False,
) -> dict[str, Any]:
    """PSNR/SSIM of ``pred_video`` against ``gt_video`` as the JSON-ready dict the script writes.

    Raises :class:`ScoreError` for bad input (see the module docstring).
    """
    if not (data_range > 0 and math.isfinite(data_range)):
        raise ScoreError(f"--data_range must be a positive number, got {data_range}")
    gt, pred = _read(gt_video, "--gt_video"), _read(pred_video, "--pred_video")
    gt_frames, pred_frames = len(gt), len(pred)
    gt, pred = _match_lengths(gt, pred, truncate)
    h, w = _target_size(gt, pred, size)
    _check_memory(len(gt), (h, w), _target_size(gt, pred, None))
    gt, pred = metrics.resize_video(gt, (h, w)), metrics.resize_video(pred, (h, w))

    frame_psnr = np.minimum(metrics.per_frame_psnr(gt, pred, data_range), metrics.PSNR_CAP_DB)
    frame_ssim = None
    if min(h, w) >= metrics.SSIM_WINDOW:
        frame_ssim = metrics.per_frame_ssim(gt, pred, data_range)
    else:
        print(
            f"{PROG}: warning: frames are {h}x{w}, SSIM needs at least {metrics.SSIM_WINDOW}x{metrics.SSIM_WINDOW}; "
            "ssim is null (pass a larger --size to compute it)",
            file=sys.stderr,
        )
    return {
        "gt_video": str(gt_video),
        "pred_video": str(pred_video),
        "num_frames": len(gt),
        "gt_frames": gt_frames,
        "pred_frames": pred_frames,
        "size": [h, w],
        "data_range": float(data_range),
        "psnr_cap_db": metrics.PSNR_CAP_DB,
        "psnr": metrics.psnr(gt, pred, data_range),
        "ssim": None if frame_ssim is None else float(frame_ssim.mean()),
        "per_frame_psnr": [float(v) for v in frame_psnr],
        "per_frame_ssim": None if frame_ssim is None else [float(v) for v in frame_ssim],
    }


def summary_line(result: dict[str, Any], output_file: str | Path) -> str:
    h, w = result["size"]
    ssim = "n/a" if result["ssim"] is None else f"{result['ssim']:.4f}"
    return (
        f"{result['pred_video']} vs {result['gt_video']}: {result['num_frames']} frames at {h}x{w}, "
        f"PSNR {result['psnr']:.2f} dB, SSIM {ssim} -> {output_file}"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="PSNR and SSIM of a predicted video against the ground truth.")
    p.add_argument("--gt_video", required=True, help="ground-truth mp4")
    p.add_argument("--pred_video", required=True, help="predicted mp4")
    p.add_argument("--output_file", required=True, help="JSON file to write")
    p.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="resize both videos to H x W (default: min H, min W)")
    p.add_argument("--data_range", type=float, default=255.0, help="value span of the pixels (default 255)")
    p.add_argument("--truncate", action="store_true", help="score the common prefix when the frame counts differ")
    return p


def _check_output(output_file: Path, inputs: list[str]) -> None:
    if output_file.is_dir():
        raise ScoreError(f"--output_file {output_file} is a directory; give a file path such as {output_file}/result.json")
    if any(Path(i).resolve() == output_file.resolve() for i in inputs):
        raise ScoreError(f"--output_file {output_file} is one of the input videos; choose another path")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    output_file = Path(args.output_file)
    try:
        _check_output(output_file, [args.gt_video, args.pred_video])
        result = score_videos(args.gt_video, args.pred_video, args.size, args.data_range, args.truncate)
        text = json.dumps(result, indent=2, allow_nan=False) + "\n"
        try:
            atomic_write_text(output_file, text)
        except OSError as e:
            reason = e.strerror or e
            raise ScoreError(f"--output_file {output_file}: cannot write ({reason}); check the path and permissions") from e
    except ScoreError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(summary_line(result, output_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
