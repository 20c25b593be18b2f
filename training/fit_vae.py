"""python -m training.fit_vae dataset.root=DIR output_dir=DIR [key=value ...]

Fits a small diffusers ``AutoencoderKLWan`` to a dataset's clips, so a small WAM's latents are
pictures (a random-weight VAE decodes coloured noise). The clips are what the WAM sees:
the current frame and ``num_future_frames`` frames ``frame_stride`` env steps apart, cameras side
by side at ``image_size`` (:class:`training.data.ClipDataset`). Whole clips, not single frames:
Wan's causal VAE codes frame 0 alone and the later frames through temporal convolutions that
single frames never train.

Loss: L1 + MSE of the reconstruction, plus ``kl_weight`` x the KL term per pixel. Every
``holdout_every``-th episode is held out and scored (PSNR of the reconstruction, beside the
PSNR of predicting the training set's mean image). The output folder is a diffusers
``AutoencoderKLWan`` folder (config.json + safetensors) whose ``latents_mean``/``latents_std``
are measured on the training clips, plus ``fit_vae.json`` (the scores, the time, the config);
train a WAM on it with ``python -m training model.vae_path=<output_dir>``. An ``output_dir`` that holds anything
is refused before any work unless ``overwrite=true``.

    python -m training.fit_vae dataset.root=outputs/demo/data output_dir=outputs/demo/vae steps=800
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from agents.wam.config import VAEConfig
from training.engine.config import EngineConfig, lr_lambda
from wam_gym.utils.cli import fail, run_hydra
from wam_gym.utils.publish import TargetBusyError

logger = logging.getLogger(__name__)


def small_vae() -> VAEConfig:
    """The small presets' trained VAE: 8x spatial (pixels patchified 2x2, then two downsamplings, as
    in Wan2.2's VAE), no temporal compression, 32 latent channels, base width 16 (0.73 M parameters).
    One latent frame per pixel frame, so a latent change is a frame's change (``model.video_target=change``).
    The patchify keeps every convolution off the full-resolution grid: 1.6x the steps per second of
    the tiny preset's unpatchified 8x geometry, and on the demo's 48x48 clips 800 steps (~5 min on 2
    cores) reach 25.4 dB held out, where the mean image scores 19.2 dB (BENCHMARKS.md)."""
    return VAEConfig(base_dim=16, z_dim=32, dim_mult=(1, 2, 2), temperal_downsample=(False, False), is_residual=True,
                     patch_size=2, in_channels=12, out_channels=12, scale_factor_temporal=1, scale_factor_spatial=8)


@dataclass
class VAEDataConfig:
    """``dataset.*``: which clips the VAE learns (the WAM's clip geometry)."""

    root: str | None = None  # a LeRobot v3.0 dataset (python -m training.collect writes one)
    cameras: list[str] | None = None  # tiled side by side in this order; null: every camera of the dataset
    image_size: list[int] = field(default_factory=lambda: [48, 48])  # per camera (H, W)
    num_future_frames: int = 4  # frames after the current one (a multiple of 4: Wan's VAE codes them in groups of 4)
    frame_stride: int = 4  # env steps between them (the WAM's dataset.frame_stride)
    holdout_every: int = 4  # every N-th episode is held out and scored; 0: none (no score)
    cache_episodes: int = 1024  # decoded (episode, camera) pairs kept: every step samples all episodes


@dataclass
class FitVAEConfig:
    dataset: VAEDataConfig = field(default_factory=VAEDataConfig)  # the clips
    vae: VAEConfig = field(default_factory=small_vae)  # the geometry (diffusers AutoencoderKLWan kwargs)
    output_dir: str | None = None  # the diffusers folder written (model.vae_path of python -m training)
    overwrite: bool = False  # replace what output_dir holds (else a non-empty one is refused before any work)
    steps: int = 800  # optimizer steps
    batch_size: int = 4  # clips per step
    lr: float = 3e-3  # peak learning rate (5% linear warm-up, then a half cosine to 0)
    kl_weight: float = 1e-4  # of the KL term per pixel (a small one keeps the latents near N(0, 1))
    eval_clips: int = 64  # held-out clips scored at the end (and every log_every steps)
    stats_clips: int = 256  # training clips whose latents give latents_mean / latents_std
    log_every: int = 100  # steps between held-out scores in the log (the final score is in the last line)
    seed: int = 0  # init, clip order

    def __post_init__(self) -> None:
        self.vae = VAEConfig.from_diffusers(dataclasses.asdict(self.vae))  # scale factors follow vae.dim_mult etc.
        if not self.dataset.root:
            raise ValueError("dataset.root is not set: collect demos with `python -m training.collect ...` and pass the folder")
        if not self.output_dir:
            raise ValueError("output_dir is not set: pass output_dir=<folder for the VAE> (then model.vae_path=<it>)")
        for name in ("steps", "batch_size", "eval_clips", "stats_clips", "log_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive integer")
        self.vae.check_future_frames(self.dataset.num_future_frames, "dataset.num_future_frames")
        if any(s % self.vae.scale_factor_spatial for s in self.dataset.image_size):
            raise ValueError(f"dataset.image_size={list(self.dataset.image_size)} must be divisible by "
                             f"vae.scale_factor_spatial={self.vae.scale_factor_spatial}")


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-clip PSNR (dB) of two [-1, 1] tensors (B, ...)."""
    mse = ((a - b) ** 2).flatten(1).mean(1).clamp_min(1e-10)
    return 10 * torch.log10(4.0 / mse)


def fit_vae(cfg: FitVAEConfig) -> dict:
    from diffusers import AutoencoderKLWan

    from training.data import ClipDataset, LeRobotDataset
    from wam_gym.utils.publish import atomic_dir, check_destination

    if Path(cfg.output_dir).is_file():
        raise FileExistsError(f"output_dir={cfg.output_dir} is a file, and fit_vae writes a folder: name a new folder")
    check_destination(cfg.output_dir, cfg.overwrite, flag="overwrite=true")
    torch.manual_seed(cfg.seed)
    dataset = LeRobotDataset(cfg.dataset.root, cache_episodes=cfg.dataset.cache_episodes, require_stats=False)
    train, held = split_clips(cfg, dataset, ClipDataset)
    vae = AutoencoderKLWan(**cfg.vae.vae_kwargs())
    start = time.perf_counter()
    train_steps(vae, train, held, cfg, start)
    vae.eval()
    mean, std = latent_stats(vae, train, cfg)
    vae.register_to_config(latents_mean=mean, latents_std=std)
    scores = held_out_scores(vae, train, held, cfg)
    report = {**scores, "steps": cfg.steps, "train_s": round(time.perf_counter() - start, 1),
              "train_clips": len(train), "held_out_clips": len(held) if held is not None else 0,
              "parameters": sum(p.numel() for p in vae.parameters()), "config": asdict(cfg)}
    with atomic_dir(Path(cfg.output_dir)) as staging:
        vae.save_pretrained(str(staging), safe_serialization=True)
        (staging / "fit_vae.json").write_text(json.dumps(report, indent=2))
    logger.info("VAE written to %s: %s", cfg.output_dir, json.dumps({k: v for k, v in report.items() if k != "config"}))
    return report


def split_clips(cfg: FitVAEConfig, dataset, clip_dataset):
    """Training and held-out clips (whole episodes held out); only video is read."""
    d = cfg.dataset
    every = d.holdout_every
    held_eps = [e for e in range(dataset.num_episodes) if every and e % every == every - 1]
    train_eps = [e for e in range(dataset.num_episodes) if e not in held_eps]
    if not train_eps:
        raise ValueError(f"dataset.holdout_every={every} leaves no training episode in {d.root}: raise it or set 0")

    def clips(episodes):
        return clip_dataset(dataset, cameras=d.cameras, image_size=tuple(d.image_size), num_future_frames=d.num_future_frames,
                            frame_stride=d.frame_stride, stats_normalize=False, episodes=episodes)

    return clips(train_eps), (clips(held_eps) if held_eps else None)


def clip_batch(clips, positions) -> torch.Tensor:
    return torch.stack([clips.video(*clips.locate(int(p))) for p in positions])


def evenly(clips, count: int) -> list[int]:
    """``count`` positions spread over the whole set (deterministic: every run scores the same clips)."""
    n = len(clips)
    return sorted({int(i * n / min(count, n)) for i in range(min(count, n))})


def train_steps(vae, train, held, cfg: FitVAEConfig, start: float) -> None:
    optimizer = torch.optim.AdamW(vae.parameters(), lr=cfg.lr, weight_decay=0.0)
    warmup = max(1, cfg.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(EngineConfig(
        lr=cfg.lr, max_steps=cfg.steps, warmup_steps=warmup, lr_schedule="cosine")))
    generator = torch.Generator().manual_seed(cfg.seed)
    bar = tqdm(total=cfg.steps, unit="step", desc="fit_vae", dynamic_ncols=True)
    vae.train()
    for step in range(1, cfg.steps + 1):
        x = clip_batch(train, torch.randint(len(train), (cfg.batch_size,), generator=generator))
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        kl = posterior.kl().mean() / x[0].numel()
        loss = (recon - x).abs().mean() + ((recon - x) ** 2).mean() + cfg.kl_weight * kl
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"fit_vae: loss is {loss.item()} at step {step}; lower lr (now {cfg.lr})")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if held is not None and step % cfg.log_every == 0 and step < cfg.steps:  # the last one: held_out_scores
            logger.info("step %d/%d loss %.4f held-out PSNR %.2f dB (%.0f s)", step, cfg.steps, loss.item(),
                        reconstruction_psnr(vae, held, cfg), time.perf_counter() - start)
            vae.train()
    bar.close()


@torch.no_grad()
def reconstruction_psnr(vae, clips, cfg: FitVAEConfig) -> float:
    vae.eval()
    values = []
    positions = evenly(clips, cfg.eval_clips)
    for i in range(0, len(positions), 16):
        x = clip_batch(clips, positions[i:i + 16])
        values.append(psnr(vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1), x))
    return float(torch.cat(values).mean())


@torch.no_grad()
def latent_stats(vae, train, cfg: FitVAEConfig) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the training clips' latents: what the WAM's denoiser normalises by."""
    positions = evenly(train, cfg.stats_clips)
    latents = torch.cat([vae.encode(clip_batch(train, positions[i:i + 16])).latent_dist.mode()
                         for i in range(0, len(positions), 16)])
    channels = latents.transpose(0, 1).flatten(1)
    return channels.mean(1).tolist(), channels.std(1).clamp_min(1e-6).tolist()


@torch.no_grad()
def held_out_scores(vae, train, held, cfg: FitVAEConfig) -> dict:
    """Held-out reconstruction PSNR, and the mean training image's PSNR on the same clips (the floor)."""
    if held is None:
        return {"held_out_psnr": None, "mean_image_psnr": None}
    mean_image = torch.stack([clip_batch(train, evenly(train, cfg.stats_clips)).mean(0)])
    x = clip_batch(held, evenly(held, cfg.eval_clips))
    return {"held_out_psnr": round(reconstruction_psnr(vae, held, cfg), 2),
            "mean_image_psnr": round(float(psnr(mean_image.expand_as(x), x).mean()), 2)}


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="fit_vae_schema", node=FitVAEConfig)


register_configs()


@hydra.main(version_base=None, config_path="conf", config_name="fit_vae")
def main(cfg: DictConfig) -> None:
    logging.getLogger().setLevel(logging.INFO)
    try:
        fit_vae(OmegaConf.to_object(cfg))
    except (ValueError, FileNotFoundError, FileExistsError, FloatingPointError, TargetBusyError) as exc:
        fail(exc)


if __name__ == "__main__":
    run_hydra(main, "python -m training.fit_vae")
