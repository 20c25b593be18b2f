"""What a perfect imagination could score through a checkpoint's VAE, against copying the current frame.

    python scripts/imagination_bound.py --checkpoint outputs/demo/train/checkpoint [--seeds 10] [--steps 150]

The imagination score (wam_gym/eval/imagination.py) compares the frames a WAM decodes with the frames
the env renders ``k * frame_stride`` steps later. Whatever the WAM predicts, it is decoded by its VAE;
so the future frame itself, encoded and decoded (``wam_gym.world_model.success_detector.as_the_world_model_draws``),
is the best any prediction through that VAE can score. This runs Meta-World's scripted expert on each
task (seeds 1000.., the demo's evaluation seeds) at the checkpoint's cameras and size, and prints, per
offset k, PSNR / SSIM of that round trip and of copying the frame ``k * frame_stride`` steps earlier.
Where the round trip's SSIM is below copying's, no model behind this VAE beats copying on SSIM.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from wam_gym.utils.cli import fail

os.environ.setdefault("MUJOCO_GL", "egl")


def expert_frames(task: str, seed: int, cameras: tuple[str, ...], size: tuple[int, int], steps: int) -> np.ndarray:
    """The frames (T, H, W * cameras, 3) the expert acts on in its episode, cameras side by side in the model's order."""
    import envs
    from agents import make_agent, run_episode
    from envs.protocol import PIXELS
    from wam_gym.utils.video import tile

    env = envs.make(task, cameras=cameras, image_size=size, max_episode_steps=steps)
    frames = []
    run_episode(env, make_agent("expert", action_space=env.action_space, seed=seed), seed=seed,
                after_act=lambda obs, _action: frames.append(tile([obs[PIXELS][c] for c in cameras])))
    env.close()
    return np.stack(frames)


def bound(checkpoint: str, tasks: list[str], seeds: int, steps: int) -> dict:
    """Per offset k (1..num_future_frames): mean PSNR/SSIM of the VAE round trip and of copying."""
    from wam_gym.eval.imagination import frame_stride
    from wam_gym.utils.metrics import PSNR_CAP_DB, per_frame_psnr, per_frame_ssim
    from wam_gym.world_model.env import model_config
    from wam_gym.world_model.success_detector import as_the_world_model_draws

    model = model_config(checkpoint)
    stride, _ = frame_stride(model, Path(checkpoint))
    names = ("vae_psnr", "vae_ssim", "copy_psnr", "copy_ssim")
    scores = {k: {name: [] for name in names} for k in range(1, model.num_future_frames + 1)}
    episodes = [expert_frames(task, seed, tuple(model.cameras), tuple(model.image_size), steps)
                for task in tasks for seed in range(1000, 1000 + seeds)]
    drawn = np.split(as_the_world_model_draws(np.concatenate(episodes), checkpoint),
                     np.cumsum([len(e) for e in episodes])[:-1])
    for frames, round_trip in zip(episodes, drawn):
        for k, score in scores.items():
            offset = k * stride
            if len(frames) <= offset:
                continue
            future, now = frames[offset:], frames[:-offset]
            score["vae_psnr"] += list(np.minimum(per_frame_psnr(round_trip[offset:], future), PSNR_CAP_DB))
            score["vae_ssim"] += list(per_frame_ssim(round_trip[offset:], future))
            score["copy_psnr"] += list(np.minimum(per_frame_psnr(now, future), PSNR_CAP_DB))
            score["copy_ssim"] += list(per_frame_ssim(now, future))
    means = {k: {name: float(np.mean(v)) for name, v in s.items()} | {"frames": len(s["vae_ssim"])} for k, s in scores.items()}
    return {"frame_stride": stride, "offsets": means}


def check_args(args: argparse.Namespace) -> list[str]:
    """Every argument checked before an episode runs or the VAE loads: the tasks."""
    from wam_gym.world_model.evaluate import check_checkpoint, check_tasks

    for flag, value, high in (("--seeds", args.seeds, 10_000), ("--steps", args.steps, 100_000)):
        if not 1 <= value <= high:
            raise ValueError(f"{flag} {value}: give an integer in [1, {high}]")
    if args.json is not None and (Path(args.json).is_dir() or not Path(args.json).parent.is_dir()):
        raise ValueError(f"--json {args.json}: name a file in an existing folder")
    check_checkpoint(args.checkpoint, "--checkpoint")
    return check_tasks(args.tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a WAM checkpoint (its VAE and cameras are used)")
    parser.add_argument("--task", action="append", dest="tasks", help="env id (repeat); default: the demo's four")
    parser.add_argument("--seeds", type=int, default=10, help="episodes per task, seeds 1000..")
    parser.add_argument("--steps", type=int, default=150, help="step limit of each episode")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    try:
        tasks = check_args(args)
        result = bound(args.checkpoint, tasks, args.seeds, args.steps)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        fail(exc)
    print(f"frame stride {result['frame_stride']}; PSNR dB / SSIM")
    print("| frame k | VAE round trip of the true future | copy the current frame | frames |")
    print("| --- | --- | --- | --- |")
    for k, s in result["offsets"].items():
        vae, copy = f"{s['vae_psnr']:.2f} / {s['vae_ssim']:.3f}", f"{s['copy_psnr']:.2f} / {s['copy_ssim']:.3f}"
        print(f"| {k} | {vae} | {copy} | {s['frames']} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
