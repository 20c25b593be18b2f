"""What identifying a checkpoint by every byte costs: once cold, then from the fingerprint cache.

    python bench/fingerprint.py [--gb 2] [--files 4]

Writes a synthetic safetensors checkpoint of ``--gb`` GB (10^9 bytes) in ``--files`` shards of 64 MiB
tensors, plus a wam_config.json, in a temp dir, and times ``checkpoint_fingerprint`` (what every
evaluation, resume and ``python -m wam_gym.serve`` runs) three ways in one run, each with the cache
it says (``WAM_GYM_CACHE`` pointed at a folder of the bench's own):

- cold, from disk: an empty cache, and the files' pages dropped from the OS page cache
  (fsync, then ``posix_fadvise(DONTNEED)`` on those files only), as for a checkpoint not read lately;
- cold, from the page cache: an empty cache, the files in memory (SHA-256's own speed);
- warm: the cache filled by the run before (a ``stat`` and a small read per file), median of 5.

Prints seconds and seconds per GB of each, and the cold/warm ratios; every run must give the same
fingerprint (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from wam_gym.eval.fingerprint import checkpoint_fingerprint

TENSOR_BYTES = 64 << 20


def write_checkpoint(root: Path, total: int, files: int) -> None:
    """``files`` safetensors shards of random bytes (float32 tensors of at most 64 MiB) adding up to ``total``."""
    (root / "transformer").mkdir(parents=True)
    (root / "wam_config.json").write_text(json.dumps({"preset": "bench"}))
    rng = np.random.default_rng(0)
    for shard in range(files):
        size = total // files // 4 * 4
        sizes = [TENSOR_BYTES] * (size // TENSOR_BYTES) + ([size % TENSOR_BYTES] if size % TENSOR_BYTES else [])
        header, offset = {}, 0
        for i, n in enumerate(sizes):
            header[f"blocks.{i}.weight"] = {"dtype": "F32", "shape": [n // 4], "data_offsets": [offset, offset + n]}
            offset += n
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        path = root / "transformer" / f"model-{shard:05d}-of-{files:05d}.safetensors"
        with open(path, "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text)
            for n in sizes:
                f.write(rng.bytes(n))
            f.flush()
            os.fsync(f.fileno())


def drop_from_page_cache(root: Path) -> bool:
    """Evict these files' pages (others' are untouched); False where the OS cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in root.rglob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def timed(ckpt: Path, cache: Path) -> tuple[float, str]:
    os.environ["WAM_GYM_CACHE"] = str(cache)
    start = time.perf_counter()
    digest = checkpoint_fingerprint(ckpt)
    return time.perf_counter() - start, digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="checkpoint size in GB (10^9 bytes)")
    parser.add_argument("--files", type=int, default=4, help="safetensors shards")
    parser.add_argument("--dir", default=None, help="where to write it (default: a temp dir, removed after)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-fingerprint-") as tmp:
        ckpt, gb = Path(tmp) / "ckpt", args.gb
        write_checkpoint(ckpt, int(gb * 1e9), args.files)
        rows = {}
        if drop_from_page_cache(ckpt):
            rows["cold, from disk"] = timed(ckpt, Path(tmp) / "cache-disk")
        rows["cold, from the page cache"] = timed(ckpt, Path(tmp) / "cache")
        warm = [timed(ckpt, Path(tmp) / "cache") for _ in range(5)]
        rows["warm (cache hits)"] = (statistics.median(s for s, _ in warm), warm[0][1])
    if len({digest for _, digest in rows.values()}) != 1:
        print("error: the runs gave different fingerprints", file=sys.stderr)
        return 1
    print(f"checkpoint: {gb:g} GB in {args.files} safetensors files + wam_config.json")
    print(f"{'':28}{'s':>10}{'s/GB':>10}")
    for name, (seconds, _) in rows.items():
        print(f"{name:28}{seconds:10.4f}{seconds / gb:10.4f}")
    warm_s = rows["warm (cache hits)"][0]
    ratios = ", ".join(f"{name.removeprefix('cold, ')} {s / warm_s:,.0f}x" for name, (s, _) in rows.items()
                       if name.startswith("cold"))
    print(f"cold/warm: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
