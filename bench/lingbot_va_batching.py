"""Many autoregressive episodes at once: batched vs one at a time, measured side by side in one run (issue 52).

    python bench/lingbot_va_batching.py                          # every part below, CPU
    python bench/lingbot_va_batching.py --part broker --latency-ms 1000 --per-row-ms 50 --warmup-s 10 --measure-s 40
    python bench/lingbot_va_batching.py --device cuda --size full --episodes 1 4 8 16 --part model   # on a GPU

Part ``model``: LingBot-VA itself (random weights, ``lingbot_va_libero``'s protocol: 20 video and 50 action
steps a chunk, guidance 5 on the video) runs N episodes ``--chunks`` chunks each, every chunk fed back:

* one at a time: each episode whole, then the next, every call batch 1 (what LeRobot, RLinf and their own
  server do);
* batched: the N episodes side by side, each chunk's feedback and inference one batched call for all
  (:func:`~agents.wam.lingbot_va.sampling.infer_chunks`), each episode on its own cache.

It prints chunks/s and episodes an hour (a LIBERO-Long episode: 800 steps, 50 chunks of 16), and batched / one
at a time. On the CPU at the tiny size a call costs mostly Python and small matrix products: the ratio says how
much of a call batching shares there, not what a GPU gains.

Part ``capacity``: how many episodes a worker holds at the released size in bf16
(:mod:`agents.wam.lingbot_va.memory`): the weights it loads (transformer, UMT5-XXL text encoder, Wan2.2 VAE:
counted on the meta device), one episode's bytes under LIBERO's and RoboTwin's protocols, and the episodes that
fit on an 80 GB and a 141 GB card (their memory less the CUDA context's ~0.5 GiB and the weights, less the
headroom). No weights are made: it runs anywhere in a second.

Part ``broker``: the broker's own quality with episodes as sessions, on the broker bench's stand-in workload
(bench/standin.py: a model call on b rows sleeps a + c b, an env step sleeps e; here a chunk of R = 16 steps per
call, as LingBot-VA's): N actors, each one long episode that the broker keeps on its worker
(EpisodicSleepPolicy). Printed: env-steps/s and episodes an hour (800 steps) one episode at a time (a single
actor, batch 1: the peers), N episodes batched through the broker, the most any scheduler reaches with N
(the bound: bench/standin.py's), and batched / bound (goal >= 0.9) and batched / one at a time.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # the bench's own modules (standin, broker, lingbot_va)

LIBERO_STEPS, CHUNK_ACTIONS = 800, 16  # a LIBERO-Long episode's most steps; actions a chunk


def _episodes(config, vae, n: int, device: torch.device, dtype: torch.dtype) -> list:
    from agents.wam.lingbot_va.state import new_episode

    text = torch.randn(1, config.text_tokens, config.transformer.text_dim, device=device, dtype=dtype)
    return [new_episode(config, vae, text, torch.zeros_like(text), torch.Generator(device).manual_seed(i), dtype)
            for i in range(n)]


def _chunks(model, vae, config, states, chunks: int, frames) -> None:
    """``chunks`` chunks of every episode in ``states``, all side by side (one episode: batch 1)."""
    from agents.wam.lingbot_va.sampling import feed_back_chunks, infer_chunks

    for index in range(chunks):
        out = infer_chunks(model, vae, config, states, [frames(1) if index == 0 else None] * len(states))
        count = 4 * (config.frame_chunk_size - (index == 0))
        feed_back_chunks(model, vae, config, states, [frames(count)] * len(states), [c.actions for c in out])


def model_part(args) -> None:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from lingbot_va import build

    config, model, vae = build(args.size, device, dtype)
    h, w = config.image_size
    frames = lambda count: torch.rand(len(config.cameras), 3, count, h, w, device=device, dtype=dtype) * 2 - 1  # noqa: E731
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    _chunks(model, vae, config, _episodes(config, vae, 1, device, dtype), 1, frames)  # warm up
    print(f"-- model: LingBot-VA {args.size}, {dtype}, {device}, {args.chunks} chunks an episode (lingbot_va_libero)")
    print(f"{'N':>3} {'one at a time':>14} {'batched':>9} {'chunks/s':>9} {'ep/h alone':>10} {'ep/h batched':>12} {'ratio':>6}")
    for n in args.episodes:
        seconds = {}
        for mode in ("alone", "batched"):
            states = _episodes(config, vae, n, device, dtype)
            sync()
            start = time.perf_counter()
            if mode == "alone":
                for state in states:
                    _chunks(model, vae, config, [state], args.chunks, frames)
            else:
                _chunks(model, vae, config, states, args.chunks, frames)
            sync()
            seconds[mode] = time.perf_counter() - start
        rate = {mode: n * args.chunks / s for mode, s in seconds.items()}
        per_hour = {mode: r * 3600 / (LIBERO_STEPS / CHUNK_ACTIONS) for mode, r in rate.items()}
        print(f"{n:>3} {seconds['alone']:13.1f}s {seconds['batched']:8.1f}s {rate['batched']:9.2f} "
              f"{per_hour['alone']:10.1f} {per_hour['batched']:12.1f} {rate['batched'] / rate['alone']:6.2f}", flush=True)


CARDS = {"80 GB (H100/A100)": 79.2, "141 GB (H200)": 139.8}  # GiB a process can use, as torch reports them
CUDA_CONTEXT_GIB = 0.5


def capacity_part(args) -> None:
    from diffusers import AutoencoderKLWan
    from lingbot_va import libero_config, robotwin_cache_bytes
    from transformers import UMT5Config, UMT5EncoderModel

    from agents.wam.lingbot_va.memory import HEADROOM, episode_bytes, text_bytes
    from agents.wam.lingbot_va.model import LingBotVATransformer

    libero = libero_config("full")
    with torch.device("meta"):
        parts = {"transformer": LingBotVATransformer(**libero.transformer.kwargs()),
                 "text encoder": UMT5EncoderModel(UMT5Config(d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                                                             num_heads=64, vocab_size=256384)),
                 "vae": AutoencoderKLWan(**libero.vae.vae_kwargs())}
    weights = {name: sum(p.numel() for p in part.parameters()) * 2 / 2**30 for name, part in parts.items()}
    print(f"-- capacity: released size, bf16; weights {sum(weights.values()):.1f} GiB ("
          + ", ".join(f"{name} {gib:.1f}" for name, gib in weights.items()) + ")")
    print(f"{'protocol':<22} {'GiB/episode':>11} " + " ".join(f"{card:>18}" for card in CARDS))
    # RoboTwin's T-shaped frame is not a config here yet (the cameras are not side by side): its cache by hand
    robotwin = robotwin_cache_bytes(libero, torch.bfloat16) + 2 * text_bytes(libero, torch.bfloat16)
    for name, per_episode in (("lingbot_va_libero", episode_bytes(libero, torch.bfloat16)), ("lingbot_va_robotwin", robotwin)):
        per_episode /= 2**30
        fits = [int((total - CUDA_CONTEXT_GIB - sum(weights.values())) * (1 - HEADROOM) // per_episode)
                for total in CARDS.values()]
        print(f"{name:<22} {per_episode:11.2f} " + " ".join(f"{fit:>18}" for fit in fits))


def broker_part(args) -> None:
    from broker import standin_broker
    from standin import Window, Workload

    window = Window(args.warmup_s, args.measure_s)
    timing = dict(latency_s=args.latency_ms / 1000, per_row_s=args.per_row_ms / 1000,
                  env_step_s=args.env_step_ms / 1000, replan_steps=CHUNK_ACTIONS, episodic=True)
    alone, _, _ = standin_broker(Workload(1, 1, 1, **timing), window, 0.0)
    print(f"-- broker: stand-in, call L(b) = {args.latency_ms:g} + {args.per_row_ms:g} b ms, env step "
          f"{args.env_step_ms:g} ms, a call every {CHUNK_ACTIONS} steps, one worker; one at a time: {alone:.0f} env-steps/s "
          f"= {alone * 3600 / LIBERO_STEPS:.0f} episodes/h")
    print(f"{'N':>3} {'batched':>8} {'bound':>7} {'ep/h':>7} {'/bound':>7} {'/alone':>7} {'batch':>6}")
    for n in args.episodes:
        load = Workload(n, 1, n, **timing)
        rate, stats, ran = standin_broker(load, window, args.wait_ms)
        bound = min(load.bound(), ran.bound())  # the tighter: the sleeps as they ran on this host
        print(f"{n:>3} {rate:8.0f} {bound:7.0f} {rate * 3600 / LIBERO_STEPS:7.0f} {rate / bound:7.3f} "
              f"{rate / alone:7.2f} {stats['mean_batch_size']:6.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("capacity", "model", "broker", "all"), default="all")
    parser.add_argument("--episodes", type=int, nargs="+", default=[1, 4, 8], help="concurrent episodes N")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--chunks", type=int, default=4, help="model: chunks an episode")
    parser.add_argument("--latency-ms", type=float, default=30.0, help="broker: a, a call's fixed cost")
    parser.add_argument("--per-row-ms", type=float, default=3.0, help="broker: c, each row's extra cost")
    parser.add_argument("--env-step-ms", type=float, default=10.0, help="broker: e, an env step")
    parser.add_argument("--wait-ms", type=float, default=None, help="broker: inference_batch_wait_ms (default the broker's)")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--measure-s", type=float, default=6.0)
    args = parser.parse_args()
    if args.wait_ms is None:
        from wam_gym.broker import BrokerConfig

        args.wait_ms = BrokerConfig.inference_batch_wait_ms
    print(f"bench/lingbot_va_batching.py  {date.today()}  {platform.node()}  {os.cpu_count()} cores  torch "
          f"{torch.__version__}  threads {torch.get_num_threads()}")
    for part, run in (("capacity", capacity_part), ("model", model_part), ("broker", broker_part)):
        if args.part in (part, "all"):
            run(args)


if __name__ == "__main__":
    main()
