"""The training loop: clips -> frozen encoders (or their caches) -> flow-matching loss -> engine.

Read top to bottom, CleanRL style: build, resume, loop, save. Exact resume: a checkpoint
holds the model, optimizer and scheduler (the engine's part) and the data position (epoch,
samples consumed); the loss's noise comes from a generator seeded by the micro-step, so a
resumed run draws the same noise an uninterrupted one would.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import multiprocessing
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Sampler

from agents.wam.architectures import architecture, of_config
from agents.wam.checkpoint import CONFIG_FILE, STATS_FILE
from agents.wam.compile import compile_module, compiled_config
from agents.wam.inference_config import InferenceConfig
from agents.wam.interface import LossInputs, Objective, WAMModel
from agents.wam.lora import add_lora
from agents.wam.mot.checkpoint import fit_to_vae
from agents.wam.mot.config import MoTConfig
from agents.wam.normalization import Normalizer
from envs.protocol import LEROBOT_ACTION, LEROBOT_STATE
from training import run_dir
from training.caches import LatentCache, TextFeatures, cache_dir, fingerprint
from training.config import TrainConfig
from training.data.augment import AugmentedClips
from training.data.clips import ClipDataset
from training.data.lerobot import LeRobotDataset
from training.data.lerobot.provenance import recorded_suites
from training.engine import checkpoint_dir, latest_checkpoint, make_engine, resolve_mixed_precision
from training.engine.checkpoint import staging_path
from wam_gym.utils.publish import remove_dir
from wam_gym.utils.run_dir import DiskFullError, check_writable

logger = logging.getLogger(__name__)


class ResumableSampler(Sampler[int]):
    """A seeded permutation per epoch, this rank's share of it, from any position. ``keyed``:
    yield ``(epoch, position)`` pairs, for datasets whose random draws key on both."""

    def __init__(self, size: int, seed: int, rank: int = 0, world_size: int = 1, keyed: bool = False):
        self.size, self.seed, self.rank, self.world_size, self.keyed = size, seed, rank, world_size, keyed
        self.epoch, self.start = 0, 0

    def __iter__(self):
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        positions = order[self.rank :: self.world_size][self.start :].tolist()
        yield from ((self.epoch, p) for p in positions) if self.keyed else positions

    def __len__(self) -> int:
        return max(0, math.ceil((self.size - self.rank) / self.world_size) - self.start)


def _set_worker_threads(threads: int, _worker_id: int) -> None:
    torch.set_num_threads(threads)  # workers x threads is the CPU pressure, not workers alone


def _worker_context() -> multiprocessing.context.BaseContext:
    """Loader workers start from a forkserver, never forked from the training process: that process has threads
    (the tensorboard writer, video decoders' pools, a dataset's encoder threads in a notebook) and a fork copies
    whatever lock one of them held, so a worker could wait on it forever (seen as workers stuck in video decoding).
    The server imports the clip pipeline once; each worker is forked from it, clean, in milliseconds."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "training.data.clips"])
    return context


def make_loader(clips, cfg: TrainConfig, sampler: ResumableSampler, device: torch.device) -> DataLoader:
    workers = cfg.num_workers
    return DataLoader(
        clips,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=workers,
        multiprocessing_context=_worker_context() if workers > 0 else None,
        prefetch_factor=cfg.dataloader_prefetch_factor if workers > 0 else None,
        persistent_workers=cfg.dataloader_persistent_workers and workers > 0,
        pin_memory=cfg.dataloader_pin_memory and device.type == "cuda",
        worker_init_fn=functools.partial(_set_worker_threads, cfg.dataloader_worker_threads) if workers > 0 else None,
        drop_last=True,
    )


def open_dataset(cfg: TrainConfig) -> LeRobotDataset:
    """The demos; a fresh model's config takes their state/action sizes (so the run config is final after this)."""
    if cfg.dataset.root is None:
        raise ValueError("dataset.root is not set: collect demos with `python -m training.collect ...` and pass the folder")
    dataset = LeRobotDataset(cfg.dataset.root, cache_episodes=cfg.dataset.cache_episodes)
    if not cfg.init_from:
        _fit_geometry(cfg.model, dataset)
        if isinstance(cfg.model, MoTConfig):  # model.vae_path: a MoT's VAE may be one fit_vae trained
            fit_to_vae(cfg.model)
    return dataset


def build(cfg: TrainConfig, device: torch.device, dataset: LeRobotDataset | None = None):
    """The model (fresh preset, Wan weights or a checkpoint), fitted to the dataset."""
    dataset = dataset if dataset is not None else open_dataset(cfg)
    model_cfg = cfg.model
    arch = of_config(model_cfg)
    if cfg.init_from:
        _check_init_architecture(cfg.init_from, arch)
        model = arch.load_model(cfg.init_from, vae_micro_batch_size=model_cfg.vae_micro_batch_size)
        fixed = ("cameras", "image_size", "action_horizon", "num_future_frames", "state_dim", "action_dim")
        ignored = [f for f in fixed if _as_list(getattr(model_cfg, f)) != _as_list(getattr(model.config, f))]
        if ignored:
            logger.warning("init_from=%s fixes the model's %s; the recipe's values are ignored", cfg.init_from, ignored)
    else:
        model = arch.build_model(model_cfg)
    if cfg.lora.enabled:
        if not (cfg.init_from or model_cfg.has_pretrained_weights):
            raise ValueError("LoRA fine-tunes trained weights: set init_from=<checkpoint> (or model.pretrained_path for Wan)")
        add_lora(model, cfg.lora)
    if cfg.model.gradient_checkpointing or cfg.infra.compile.enabled:
        model.enable_gradient_checkpointing()
    mc = model.config
    if mc.normalizes_actions and cfg.dataset.normalization is not None:
        raise ValueError(f"dataset.normalization={cfg.dataset.normalization}: model={mc.preset}'s input convention "
                         f"({mc.input_convention}) normalises its actions itself; leave dataset.normalization null")
    _record_suite(mc, dataset)
    stride = cfg.dataset.frame_stride or mc.default_frame_stride
    clips = ClipDataset(dataset, cameras=list(mc.cameras), image_size=tuple(mc.image_size), action_horizon=mc.action_horizon,
                        num_future_frames=mc.num_future_frames, frame_stride=stride, load_video=not cfg.infra.latent_cache,
                        normalization=cfg.dataset.normalization, convention=mc, stats_normalize=not mc.normalizes_actions)
    return model.to(device), dataset, clips


def _record_suite(model_cfg, dataset: LeRobotDataset) -> None:
    """A MoT saves the benchmark suite of its training data in its config (the policy server reads it to know
    what the field's drivers send): the dataset's one suite, None for several. A dataset that names none (one
    converted from elsewhere) leaves model.suite as set. FastWAM's suite is its input convention's."""
    suites = recorded_suites(dataset.info)
    if suites and isinstance(model_cfg, MoTConfig):
        model_cfg.suite = suites[0] if len(suites) == 1 else None


def _check_init_architecture(init_from: str, arch) -> None:
    """``init_from``'s model must be of the preset's architecture (its config is what the run trains)."""
    config_file = Path(init_from).expanduser() / CONFIG_FILE
    if not config_file.is_file():
        return  # the loader names what is missing
    saved = architecture(json.loads(config_file.read_text()), str(config_file))
    if saved.name != arch.name:
        raise ValueError(f"init_from={init_from} holds a {saved.name} model and model= chose a {arch.name} preset: "
                         f"set model=<a {saved.name} preset> (e.g. model={'fastwam' if saved.name == 'fastwam' else 'tiny'})")


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _fit_geometry(model_cfg, dataset) -> None:
    """A fresh model takes the dataset's state/action sizes; cameras must exist in it."""
    missing = [c for c in model_cfg.cameras if c not in dataset.cameras]
    if missing:
        raise ValueError(f"model.cameras {missing} are not in the dataset (it has {list(dataset.cameras)}); "
                         f"set model.cameras={list(dataset.cameras)}")
    features = dataset.info["features"]
    model_cfg.state_dim = features[LEROBOT_STATE]["shape"][0]
    model_cfg.action_dim = features[LEROBOT_ACTION]["shape"][0]


def _encoders(cfg: TrainConfig, model, clips):
    """Where latents and text features come from: the cache, or the frozen encoders online."""
    if not (cfg.infra.latent_cache or cfg.infra.text_cache):
        return None, TextFeatures(model)
    cache = LatentCache(cache_dir(), fingerprint(model, clips))
    if cfg.infra.latent_cache:
        cache.require_video()
    text = TextFeatures(model, cache.text() if cfg.infra.text_cache else None)
    return (cache if cfg.infra.latent_cache else None), text


def train(cfg: TrainConfig) -> Path:
    with ExitStack() as held:  # the output_dir's writer lock, on the main process
        torch.manual_seed(cfg.seed)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        out = Path(cfg.output_dir)
        check_writable(out, "output_dir")  # before minutes of loading
        dataset = open_dataset(cfg)
        record = run_dir.describe(cfg, dataset.identity(), resolve_mixed_precision(cfg.mixed_precision, device))
        ckpt = latest_checkpoint(out / "checkpoints") if cfg.resume else None
        # Refused before the model is built (minutes for Wan) and before anything is written.
        mismatched = run_dir.check_resume(out, record, cfg.allow_resume_mismatch) if ckpt is not None else []
        model, dataset, clips = build(cfg, device, dataset)
        if cfg.infra.compile.enabled:
            _compile(model, cfg)
        latent_cache, text_features = _encoders(cfg, model, clips)
        objective = run_objective(cfg)
        engine = make_engine(model, cfg, device)  # a TrainConfig is its own EngineConfig group
        sampler, loader, state = _resumed_batches(cfg, engine, clips, ckpt, device)
        if engine.is_main_process:  # one run per output_dir: a second is refused, naming this one, before it writes
            held.enter_context(run_dir.locked(out))
            _prepare_output_dir(cfg, out, record, resuming=ckpt is not None, mismatched=bool(mismatched))
        writer = _writer(out, engine)

        from tqdm import tqdm

        bar = tqdm(total=cfg.max_steps, initial=engine.global_step, unit="step", disable=not engine.is_main_process,
                   dynamic_ncols=True, desc=cfg.task)
        batches, tick, seen, batch = _epochs(loader, sampler, state), time.perf_counter(), 0, None
        model.train()
        while engine.global_step < cfg.max_steps:
            batch = next(batches)
            losses = _micro_step(cfg, engine, model, batch, latent_cache, text_features, objective, device, state["micro_step"])
            state["micro_step"] += 1
            state["consumed"] += cfg.batch_size
            seen += cfg.batch_size * engine.world_size
            if not engine.step():
                continue
            step = engine.global_step
            bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                rate = seen / (time.perf_counter() - tick)
                tick, seen = time.perf_counter(), 0
                scalars = {**losses, "grad_norm": engine.grad_norm, "lr": engine.lr, "samples_per_s": rate}
                bar.set_postfix(progress_fields(scalars))
                _log_scalars(writer, step, scalars)
            if cfg.log_video_every and step % cfg.log_video_every == 0:
                _log_prediction(writer, model, clips, batch, text_features, step, device)
            if step % cfg.save_every == 0 or step == cfg.max_steps:
                _checkpoint(engine, out, state, cfg.keep_checkpoints)
        bar.close()
        final = out / "checkpoint"
        if engine.is_main_process:
            batch = batch if batch is not None else next(iter(loader))  # a resumed, already finished run
            _log_prediction(writer, model, clips, batch, text_features, engine.global_step, device)
            save_final(engine.module, final, dataset.stats_path, cfg.dataset.normalization)
            if writer:
                writer.close()
            logger.info("final checkpoint: %s (text features computed online: %d)", final, text_features.online)
        return final


def _compile(model, cfg: TrainConfig) -> None:
    if os.environ.get("WAM_COMPILE_CACHE"):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.environ["WAM_COMPILE_CACHE"])
    compile_module(model, cfg.infra.compile)


def _resumed_batches(cfg: TrainConfig, engine, clips, ckpt: Path | None, device: torch.device):
    """The sampler, the loader and the loop's state (epoch, clips consumed in it, micro-steps), where the
    checkpoint ``ckpt`` left them (the engine's weights and optimizer loaded from it), else at the start."""
    augment = not cfg.dataset.deterministic
    sampler = ResumableSampler(len(clips), cfg.seed, engine.rank, engine.world_size, keyed=augment)
    if len(sampler) < cfg.batch_size:
        raise ValueError(f"the dataset has {len(clips)} clips, fewer than batch_size={cfg.batch_size}")
    state = {"epoch": 0, "consumed": 0, "micro_step": 0}
    if ckpt is not None:
        state = engine.load(ckpt)
        logger.info("resumed from %s (step %d)", ckpt, engine.global_step)
    sampler.epoch, sampler.start = state["epoch"], state["consumed"]
    loader = make_loader(AugmentedClips(clips, cfg.dataset.augment, cfg.seed) if augment else clips, cfg, sampler, device)
    return sampler, loader, state


def _epochs(loader, sampler, state: dict):
    """The loader's batches, epoch after epoch without end; at each new epoch the sampler and the loop's state
    (what a checkpoint saves) start it from its first clip."""
    while True:
        yield from loader
        state["epoch"], state["consumed"] = state["epoch"] + 1, 0
        sampler.epoch, sampler.start = state["epoch"], 0


def _prepare_output_dir(cfg: TrainConfig, out: Path, record: dict, *, resuming: bool, mismatched: bool) -> None:
    """Before the first step: drop what killed saves left, start over if asked, record the settings."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir.clean_leftovers(out)
    if not cfg.resume:
        run_dir.start_over(out)
    run_dir.write_run_config(out, record, resuming=resuming, mismatched=mismatched)


def save_final(module, final: Path, stats_path: Path, normalization: str | None = None) -> Path:
    """The WAM eval loads, with the dataset's stats inside (and the ``dataset.normalization`` they were
    used with): both are published in one rename, so a kill never leaves a checkpoint whose actions
    eval would not un-normalise."""
    with run_dir.disk_full_reported(final, final.parent):
        config = module.config
        save = of_config(config).save_model
        stats = json.loads(Path(stats_path).read_text())
        if normalization is None and config.dataset_stats(stats) == stats:
            return save(module, final, extra_files={STATS_FILE: stats_path})
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent) as tmp:
            # the dataset's statistics in the model's action units, with the mode recorded in them
            recorded = Path(tmp) / STATS_FILE
            Normalizer.from_stats(config.dataset_stats(stats), normalization, source=str(stats_path)).save(recorded)
            return save(module, final, extra_files={STATS_FILE: recorded})


def run_objective(cfg: TrainConfig) -> Objective:
    """What the loss trains, from the run's knobs (built once per run)."""
    return Objective(video_dropout=cfg.video_dropout, world_model_prob=cfg.world_model_prob,
                     action_weight=cfg.action_weight, state_weight=cfg.state_weight)


def _micro_step(cfg, engine, model: WAMModel, batch, latent_cache, text_features, objective: Objective, device,
                micro_step: int) -> dict[str, float]:
    non_blocking = cfg.infra.pinned_transfer and device.type == "cuda"

    def on_device(key: str) -> torch.Tensor:
        return batch[key].to(device, non_blocking=non_blocking)

    if latent_cache is not None:
        latents = latent_cache.video(batch["index"]).to(device, non_blocking=non_blocking)
    else:
        latents = model.encode_video(on_device("video"))
    inputs = LossInputs(latents, on_device("actions"), on_device("state"), text_features(list(batch["instruction"])),
                        next_states=on_device("next_states"), action_is_pad=on_device("action_is_pad"))
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + micro_step)
    with engine.autocast():
        losses = engine.module.loss(inputs, objective, generator)
    if not torch.isfinite(losses["loss"]):
        raise FloatingPointError(f"loss became {losses['loss'].item()} at micro-step {micro_step}; lower lr or use fp32")
    engine.backward(losses["loss"])
    return {k: float(v.detach()) for k, v in losses.items()}


def _checkpoint(engine, out: Path, state: dict, keep: int) -> None:
    root = out / "checkpoints"
    target = checkpoint_dir(root, engine.global_step)
    try:
        with run_dir.disk_full_reported(target, out):
            engine.save(target, dict(state))
    except DiskFullError:
        shutil.rmtree(staging_path(target), ignore_errors=True)  # its partial files hold the space the user must free
        raise
    if engine.is_main_process:
        for old in sorted(root.glob("step-*"))[:-keep]:
            remove_dir(old)
        for left in root.glob(".deleting-*"):  # a run killed while deleting left these
            remove_dir(left)


def _writer(out: Path, engine):
    if not engine.is_main_process:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(out / "tensorboard"))


def progress_fields(scalars: dict[str, float | None]) -> dict[str, str]:
    """What the console's progress line shows after the bar: loss, gradient norm (before clipping), samples/s."""
    grad_norm = scalars.get("grad_norm")
    return {"loss": f"{scalars['loss']:.4f}", "grad_norm": "n/a" if grad_norm is None else f"{grad_norm:.3g}",
            "samples_s": f"{scalars['samples_per_s']:.1f}"}


def _log_scalars(writer, step: int, values: dict[str, float | None]) -> None:
    """``train/<name>`` scalars; unknown values (None: a back end that did not report a grad norm) are left out."""
    if writer:
        for name, value in values.items():
            if value is not None:
                writer.add_scalar(f"train/{name}", value, step)


@torch.no_grad()
def _log_prediction(writer, model, clips, batch, text_features, step: int, device) -> None:
    """Predicted future frames beside the real ones for the first clip of a batch."""
    if writer is None or model.config.video_mode != "joint":
        return
    was_training = model.training
    model.eval()
    video = clips.video(int(batch["episode"][0]), int(batch["frame"][0]))[None].to(device)  # decoded even with a cache
    current = model.encode_video(video[:, :, :1])
    policy = of_config(model.config).policy_class()(model, _inference_config(model))
    x0 = policy.sample(current, batch["state"][:1].to(device),
                                                           text_features(list(batch["instruction"][:1])))
    predicted = model.decode_latents(torch.cat([current, x0["video"]], dim=2))
    frames = torch.cat([video, predicted], dim=-1)  # real | predicted, side by side
    writer.add_video("train/predicted_frames", ((frames.permute(0, 2, 1, 3, 4) + 1) * 127.5).clamp(0, 255).byte(), step, fps=4)
    model.train(was_training)


def _inference_config(model) -> InferenceConfig:
    """Sampling settings for the logged prediction; they keep the compile the run applied to the
    model (WAMPolicy refuses to change a compiled module's settings)."""
    compiled = compiled_config(model)
    return InferenceConfig() if compiled is None else InferenceConfig(compile=compiled)
