"""LingBot-VA at batch 1: memory (weights, the KV cache an episode holds) and time per chunk by phase.

    python bench/lingbot_va.py --device cuda                 # the released size in bf16 (random weights)
    python bench/lingbot_va.py --device cpu --size tiny      # the same code path at lingbot_va_tiny's size

One episode of their LIBERO protocol (``lingbot_va_libero``: two 128 x 128 cameras, chunks of 4 latent frames x 4
actions, window 30, 20 video and 50 action steps, guidance 5 on the video) runs ``--chunks`` chunks, past the
window, each: the video denoising, the action denoising (the seconds in each stream's calls), the whole chunk
(with the first chunk's encoding of the observation), then the feedback (the streaming VAE encoding the 16
key frames, the kept video and action writes). Per phase it prints the first chunk's seconds and the median of
the chunks after the cache filled. The KV cache per episode is measured (the tensors allocated) and
computed for RoboTwin (256 x 320 head + two 128 x 160 wrists in a T, chunks of 2 x 16, window 72), whose camera
layout wam_gym does not serve yet. The text encoder is not built: random prompt embeddings stand in (it runs
once per episode). ``SUMMARY`` lines at the end; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from agents.wam.lingbot_va.config import LingBotVAConfig, preset
from agents.wam.lingbot_va.inputs import convention
from agents.wam.lingbot_va.model import LingBotVATransformer
from agents.wam.lingbot_va.sampling import feed_back, infer_chunk
from agents.wam.lingbot_va.state import new_episode

GIB = 2**30


def libero_config(size: str) -> LingBotVAConfig:
    """lingbot_va_libero's geometry and steps, at the released transformer size or the tiny one."""
    base = preset("lingbot_va") if size == "full" else preset("lingbot_va_tiny")
    return LingBotVAConfig.under(convention("lingbot_va_libero"), base.transformer, base.vae)


def robotwin_cache_bytes(config: LingBotVAConfig, dtype: torch.dtype) -> int:
    """Their RoboTwin layout's KV cache per episode: a latent frame of (1.5 x 256/16) x 320/16 cells, chunks of
    2 frames x 16 actions, window 72, two guidance rows."""
    t = config.transformer
    _, p_h, p_w = t.patch_size
    tokens = (256 // 16 * 3 // 2 // p_h) * (320 // 16 // p_w)
    slots = (72 // 2) * 2 * (tokens + 16)
    return 2 * t.num_layers * 2 * slots * t.dim * torch.finfo(dtype).bits // 8


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn, *args, **kwargs):
    _sync(device)
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    _sync(device)
    return out, time.perf_counter() - start


class StreamClock:
    """Seconds spent in each stream's calls (the model's ``video`` and ``action``), synchronised, since the last read."""

    def __init__(self, model: LingBotVATransformer, device: torch.device):
        self.seconds = {"video": 0.0, "action": 0.0}
        for stream in self.seconds:
            setattr(model, stream, self._timed(stream, getattr(model, stream), device))

    def _timed(self, stream: str, call, device: torch.device):
        def timed(*args, **kwargs):
            out, seconds = _timed(device, call, *args, **kwargs)
            self.seconds[stream] += seconds
            return out
        return timed

    def read(self) -> dict[str, float]:
        out, self.seconds = self.seconds, dict.fromkeys(self.seconds, 0.0)
        return out


def build(size: str, device: torch.device, dtype: torch.dtype):
    """(config, transformer, VAE) under lingbot_va_libero at ``size``, random weights (seed 0), made in ``dtype``
    on ``device`` (in bf16 on the GPU: 5 B parameters are 20 GB in fp32)."""
    from diffusers import AutoencoderKLWan

    config = libero_config(size)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LingBotVATransformer(**config.transformer.kwargs()).eval()
            vae = AutoencoderKLWan(**config.vae.vae_kwargs()).eval()
    finally:
        torch.set_default_dtype(default)
    return config, model, vae


def run(args) -> dict:
    device, dtype = torch.device(args.device), torch.bfloat16 if args.device == "cuda" else torch.float32
    config, model, vae = build(args.size, device, dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    text = torch.randn(1, config.text_tokens, config.transformer.text_dim, device=device, dtype=dtype)
    state = new_episode(config, vae, text, torch.zeros_like(text), torch.Generator(device).manual_seed(0), dtype)
    cache = state.cache
    cache_bytes = sum(t.numel() * t.element_size() for t in (cache.keys, cache.values))
    h, w = config.image_size
    frames = lambda count: torch.rand(len(config.cameras), 3, count, h, w, device=device, dtype=dtype) * 2 - 1  # noqa: E731
    clock = StreamClock(model, device)
    phases: dict[str, list[float]] = {"video denoising": [], "action denoising": [], "chunk": [], "feedback": []}
    for index in range(args.chunks):
        chunk, seconds = _timed(device, infer_chunk, model, vae, config, state, frames(1) if index == 0 else None)
        streams = clock.read()
        phases["chunk"].append(seconds)
        phases["video denoising"].append(streams["video"])
        phases["action denoising"].append(streams["action"])
        count = 4 * (config.frame_chunk_size - (index == 0))
        _, seconds = _timed(device, feed_back, model, vae, config, state, frames(count), chunk.actions)
        clock.read()
        phases["feedback"].append(seconds)
    filled = (config.attn_window // 2) + 1  # chunks after which the window is full and eviction runs
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "size": args.size,
        "dtype": str(dtype).removeprefix("torch."), "chunks": args.chunks,
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights_gib": weights / GIB, "kv_cache_gib": {"libero": cache_bytes / GIB,
                                                        "robotwin": robotwin_cache_bytes(config, dtype) / GIB},
        "cache_slots": cache.slots,
        "seconds": {name: {"first": values[0], "after_window": statistics.median(values[filled:]) if len(values) > filled
                           else None} for name, values in phases.items()},
    }
    if device.type == "cuda":
        report["peak_gib"] = torch.cuda.max_memory_allocated(device) / GIB
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full", help="the released size (default) or tiny")
    parser.add_argument("--chunks", type=int, default=18, help="chunks to run (default 18: past the window of 15)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.chunks < 1:
        parser.error(f"--chunks {args.chunks}: give at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device; use --device cpu --size tiny for the code path")
    report = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    s = report["seconds"]
    print(f"SUMMARY lingbot_va {report['size']} {report['dtype']} on {report['device']}: {report['parameters']:,} "
          f"parameters, weights {report['weights_gib']:.2f} GiB, KV per episode {report['kv_cache_gib']['libero']:.2f} GiB "
          f"LIBERO / {report['kv_cache_gib']['robotwin']:.2f} GiB RoboTwin")
    for name, figures in s.items():
        after = figures["after_window"]
        print(f"SUMMARY lingbot_va {name}: first {figures['first']:.3f} s, after the window "
              f"{'n/a' if after is None else f'{after:.3f} s'}")


if __name__ == "__main__":
    main()
