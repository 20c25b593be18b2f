"""Precompute the static caches of +infra=cache (InternW0's tools/video_cache.py).

    export WAM_LATENT_CACHE=.cache/wam/latents/metaworld_demo
    python scripts/video_cache.py task=metaworld_tiny +infra=cache video_latent_cache=generate
    python scripts/video_cache.py task=metaworld_tiny +infra=cache video_latent_cache=generate \\
        'video_latent_cache_fields=[text]' precompute.max_samples=1000

Takes the training overrides, so the cache is made with the same data and encoders the run
will use (checked when the run reads it). VAE fields always cover the whole dataset;
precompute.max_samples limits the text features, the rest are computed online in training.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from training.config import TrainConfig, register_configs
from wam_gym.utils.cli import fail, run_hydra

register_configs()
CONF = str(Path(__file__).resolve().parent.parent / "training" / "conf")


@hydra.main(version_base=None, config_path=CONF, config_name="train")
def main(cfg: DictConfig) -> None:
    import torch

    from training.caches import cache_dir, generate
    from training.loop import build

    try:
        config: TrainConfig = OmegaConf.to_object(cfg)  # the dataclasses' own checks raise ValueError here
    except ValueError as exc:
        fail(exc)
    if config.video_latent_cache != "generate":
        fail("add video_latent_cache=generate to write the cache (with the run's other overrides)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config.infra.latent_cache = False  # generating: read the frames, not a cache
    torch.manual_seed(config.seed)  # the same (random-init) encoders the run will build
    try:
        model, _, clips = build(config, device)
        directory = cache_dir()
        meta = generate(model, clips, directory, list(config.video_latent_cache_fields), config.precompute.max_samples)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        fail(exc)
    print(f"cache written to {directory}: video latents for {meta['video_samples']} samples, "
          f"text features for {meta.get('text_prompts', 0)} instructions")


if __name__ == "__main__":
    run_hydra(main, "python scripts/video_cache.py")  # a config that does not compose: one line
