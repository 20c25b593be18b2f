"""Precompute frozen text-encoder features for every instruction of a dataset.

    export WAM_LATENT_CACHE=.cache/wam/text/metaworld_demo
    python scripts/precompute_text_embeds.py task=metaworld_tiny [precompute.max_samples=N]

The same as ``scripts/video_cache.py ... video_latent_cache=generate 'video_latent_cache_fields=[text]'``;
read in training with +infra=cache (or infra.text_cache=true). Missing instructions are
encoded online.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.argv += ["video_latent_cache=generate", "video_latent_cache_fields=[text]"]
    runpy.run_path(str(Path(__file__).resolve().parent / "video_cache.py"), run_name="__main__")
