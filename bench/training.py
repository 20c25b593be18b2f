"""Training samples/s with online encoders vs the static caches (+infra=cache), one run.

    python bench/training.py                       # tiny preset, Meta-World demos collected here
    python bench/training.py --dataset DIR --steps 40 --batch-size 16

Same model, same data, same batches: ``online`` decodes video clips and runs the frozen VAE
and text encoder every step; ``cached`` reads VAE latents and text features from a cache made
once beforehand (its generation time is printed separately). Also checks that, with
deterministic preprocessing, the two give the same loss on the same batch.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

# `python bench/training.py` puts bench/ first on sys.path, where this file would shadow the
# `training` package.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402


def config(dataset: str, output: str, args, cache: bool):
    from hydra import compose, initialize_config_dir

    from training.config import register_configs

    register_configs()
    overrides = [
        "task=metaworld_tiny", f"dataset.root={dataset}", f"output_dir={output}", f"batch_size={args.batch_size}",
        f"model.image_size=[{args.image_size},{args.image_size}]", "num_workers=0", "infra.compile.enabled=false",
    ]
    if cache:
        overrides += ["+infra=cache", "infra.compile.enabled=false"]
    conf = str(Path(__file__).resolve().parent.parent / "training" / "conf")
    with initialize_config_dir(config_dir=conf, version_base=None):
        from omegaconf import OmegaConf

        return OmegaConf.to_object(compose("train", overrides=overrides))


def timed_steps(cfg, steps: int, device) -> tuple[float, float]:
    """(samples/s over ``steps`` micro-steps after one warm-up, first-batch loss)."""
    from training.engine import EngineConfig, make_engine
    from training.loop import ResumableSampler, _encoders, _micro_step, build, make_loader

    torch.manual_seed(cfg.seed)
    model, _, clips = build(cfg, device)
    latent_cache, text = _encoders(cfg, model, clips)
    engine = make_engine(model, EngineConfig(lr=cfg.lr, batch_size=cfg.batch_size, max_steps=steps + 1), device)
    loader = iter(make_loader(clips, cfg, ResumableSampler(len(clips), cfg.seed), device))
    first = _micro_step(cfg, engine, model, next(loader), latent_cache, text, device, 0)["loss"]
    engine.step()
    start = time.perf_counter()
    for i in range(steps):
        _micro_step(cfg, engine, model, next(loader), latent_cache, text, device, i + 1)
        engine.step()
    return steps * cfg.batch_size / (time.perf_counter() - start), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", help="a LeRobot v3 dataset (default: collect Meta-World expert demos)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = args.dataset
        if dataset is None:
            from training.collect import collect

            dataset = str(Path(tmp) / "demos")
            collect(["wam_gym/MetaWorld-drawer-close-v3", "wam_gym/MetaWorld-door-close-v3"], episodes=3,
                    output=Path(dataset), image_size=args.image_size, log=lambda *a: None)
        online_rate, online_loss = timed_steps(config(dataset, f"{tmp}/online", args, cache=False), args.steps, device)

        os.environ["WAM_LATENT_CACHE"] = f"{tmp}/cache"
        from training.caches import generate
        from training.loop import build

        cached_cfg = config(dataset, f"{tmp}/cached", args, cache=True)
        cached_cfg.infra.latent_cache = False  # generating reads the frames
        torch.manual_seed(cached_cfg.seed)
        model, _, clips = build(cached_cfg, device)
        start = time.perf_counter()
        generate(model, clips, Path(f"{tmp}/cache"), ["video", "text"], None)
        generation_s = time.perf_counter() - start
        cached_cfg.infra.latent_cache = True
        cached_rate, cached_loss = timed_steps(cached_cfg, args.steps, device)

    print(f"\nbench/training.py  {date.today()}  {platform.node()}  {platform.machine()}  device {device}")
    print(f"tiny MoT, batch {args.batch_size}, {args.image_size}x{args.image_size} x 2 cameras, {len(clips)} clips, "
          f"{args.steps} timed steps")
    print(f"  online   {online_rate:7.1f} samples/s  (decode + VAE + text encoder every step)")
    print(f"  cached   {cached_rate:7.1f} samples/s  (cache generation: {generation_s:.1f} s, once)")
    print(f"  cached / online = {cached_rate / online_rate:.2f}x   (goal >= 4x; InternW0's anchor 3.80x)")
    same = abs(online_loss - cached_loss) <= 1e-5 * max(1.0, abs(online_loss))
    print(f"  first-batch loss online {online_loss:.6f} vs cached {cached_loss:.6f}: {'equal' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
