"""Static caches of frozen-encoder outputs (InternW0's ``+infra=cache``).

    video   VAE latents of every training clip (current frame + future frames)
    text    text-encoder features of every instruction

A cache lives in a directory (``$WAM_LATENT_CACHE``) with ``cache_meta.json``, which records
what it was made from (dataset, clip geometry, VAE and text encoder); reading a cache made
from anything else is refused. Rules: the ``video`` field must cover every sample of the
dataset (else an error names the command that completes it); missing ``text`` entries are
computed online. Tensors are safetensors; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from wam_gym.utils.publish import atomic_write_text

META_FILE = "cache_meta.json"
TEXT_FILE = "text.safetensors"
SHARD_SIZE = 256
MAX_SHARDS = 64  # shards held in memory (256 clips each)
FIELDS = ("video", "text")


class CacheMismatchError(ValueError):
    """The cache was made from another dataset, geometry or encoder."""


def cache_dir(explicit: str | None = None) -> Path:
    path = explicit or os.environ.get("WAM_LATENT_CACHE")
    if not path:
        raise ValueError("no latent cache directory: export WAM_LATENT_CACHE=/path/to/cache (or pass one)")
    return Path(path).expanduser()


def fingerprint(model, clips) -> dict[str, Any]:
    """What the cached values depend on; equal fingerprints mean interchangeable caches."""

    def digest(module) -> str:
        h = hashlib.sha1()
        for name, tensor in sorted(module.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()

    return {
        "dataset": str(Path(clips.dataset.root).resolve()),
        "num_samples": len(clips),
        "cameras": list(clips.cameras),
        "image_size": list(clips.image_size),
        "num_future_frames": clips.num_future_frames,
        "frame_stride": clips.frame_stride,
        "vae": digest(model.vae),
        "text_encoder": digest(model.text_encoder),
        "text_max_length": model.config.text_encoder.max_length,
    }


def _shard_name(shard: int) -> str:
    return f"video-{shard:05d}.safetensors"


class LatentCache:
    def __init__(self, directory: Path, expected: dict[str, Any]):
        self.directory = directory
        meta_path = directory / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"no latent cache in {directory}: generate it with "
                "`python scripts/video_cache.py <same overrides> video_latent_cache=generate`"
            )
        self.meta = json.loads(meta_path.read_text())
        wrong = {k: (self.meta["fingerprint"].get(k), v) for k, v in expected.items() if self.meta["fingerprint"].get(k) != v}
        if wrong:
            detail = "; ".join(f"{k}: cache {a!r} vs run {b!r}" for k, (a, b) in wrong.items())
            raise CacheMismatchError(
                f"latent cache {directory} does not match this run ({detail}); regenerate it into a fresh directory: "
                "WAM_LATENT_CACHE=<new dir> python scripts/video_cache.py <this run's overrides> video_latent_cache=generate"
            )
        self._shards: OrderedDict[int, torch.Tensor] = OrderedDict()  # LRU of loaded shards
        self._text: dict[str, torch.Tensor] | None = None

    def require_video(self) -> None:
        """VAE fields need complete coverage: every sample of the dataset."""
        covered = self.meta.get("video_samples", 0)
        total = self.meta["fingerprint"]["num_samples"]
        if covered < total:
            raise ValueError(
                f"latent cache {self.directory} holds video latents for {covered} of {total} samples; VAE fields need "
                "complete coverage: rerun `python scripts/video_cache.py ... video_latent_cache=generate "
                "'video_latent_cache_fields=[video]'` into a fresh directory"
            )

    def video(self, indices: torch.Tensor) -> torch.Tensor:
        return torch.stack([self._shard(i // SHARD_SIZE)[i % SHARD_SIZE] for i in indices.tolist()])

    def _shard(self, shard: int) -> torch.Tensor:
        # Shuffled batches touch many shards: keep the most recent MAX_SHARDS in memory.
        if shard in self._shards:
            self._shards.move_to_end(shard)
        else:
            self._shards[shard] = load_file(str(self.directory / _shard_name(shard)))["video"]
            if len(self._shards) > MAX_SHARDS:
                self._shards.popitem(last=False)
        return self._shards[shard]

    def text(self) -> dict[str, torch.Tensor]:
        if self._text is None:
            path = self.directory / TEXT_FILE
            if path.is_file():
                tensors = load_file(str(path))
                names = json.loads((self.directory / "text_index.json").read_text())
                self._text = {prompt: tensors[key] for key, prompt in names.items()}
            else:
                self._text = {}
        return self._text


class TextFeatures:
    """Instruction -> frozen text-encoder features, from a cache first, online otherwise."""

    def __init__(self, model, cached: dict[str, torch.Tensor] | None = None):
        self.model = model
        self.table = dict(cached or {})
        self.online = 0

    def __call__(self, instructions: list[str]) -> torch.Tensor:
        prompts = self.model.config.prompts(instructions)  # as the model's convention words them
        missing = [p for p in dict.fromkeys(prompts) if p not in self.table]
        if missing:
            self.online += len(missing)
            for prompt, row in zip(missing, self.model.encode_prompt(missing).cpu()):
                self.table[prompt] = row
        return torch.stack([self.table[p] for p in prompts]).to(self.model.device)


@torch.no_grad()
def generate(model, clips, directory: Path, fields: list[str], max_text_samples: int | None, batch_size: int = 8) -> dict:
    """Write the cache for ``fields`` (see the module doc); returns what was written."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown video_latent_cache_fields {sorted(unknown)}; choose from {list(FIELDS)}")
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / META_FILE).is_file():
        raise FileExistsError(f"{directory} already holds a cache; generate into a fresh directory")
    meta: dict[str, Any] = {"fingerprint": fingerprint(model, clips), "fields": list(fields), "video_samples": 0}
    if "video" in fields:
        meta["video_samples"] = _generate_video(model, clips, directory, batch_size)
    if "text" in fields:
        meta["text_prompts"] = _generate_text(model, clips, directory, max_text_samples)
    atomic_write_text(directory / META_FILE, json.dumps(meta, indent=2))  # last: marks the cache complete
    return meta


def _generate_video(model, clips, directory: Path, batch_size: int) -> int:
    if not clips.load_video:
        raise ValueError("generating video latents needs the clips' frames: run without infra.latent_cache=true")
    from tqdm import tqdm

    bar = tqdm(total=len(clips), unit="clip", desc="video latents", dynamic_ncols=True)
    for shard_start in range(0, len(clips), SHARD_SIZE):
        indices = range(shard_start, min(shard_start + SHARD_SIZE, len(clips)))
        latents = []
        for start in range(0, len(indices), batch_size):
            frames = torch.stack([clips[i]["video"] for i in indices[start : start + batch_size]])
            latents.append(model.encode_video(frames.to(model.device)).cpu())
            bar.update(len(frames))
        tmp = directory / (_shard_name(shard_start // SHARD_SIZE) + ".tmp")
        save_file({"video": torch.cat(latents).contiguous()}, str(tmp))
        tmp.replace(directory / _shard_name(shard_start // SHARD_SIZE))
    bar.close()
    return len(clips)


def _generate_text(model, clips, directory: Path, max_samples: int | None) -> int:
    tasks = list(dict.fromkeys(clips.dataset.task_of(e) for e in range(clips.dataset.num_episodes)))
    prompts = model.config.prompts(tasks[:max_samples] if max_samples is not None else tasks)  # TextFeatures' keys
    embeddings = model.encode_prompt(prompts).cpu() if prompts else torch.zeros(0)
    names = {f"t{i}": p for i, p in enumerate(prompts)}
    tmp = directory / (TEXT_FILE + ".tmp")
    save_file({key: embeddings[i].contiguous() for i, key in enumerate(names)}, str(tmp))
    tmp.replace(directory / TEXT_FILE)
    atomic_write_text(directory / "text_index.json", json.dumps(names, indent=2))
    return len(prompts)
