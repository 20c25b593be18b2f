"""Compile DeepSpeed's CPU ops (CPU Adam, the shared-memory comm op) into torch's extension cache.

    python scripts/build_deepspeed_ops.py

DeepSpeed compiles them the first time a run needs them (ZeRO-offload's optimizer, its CPU comm backend): about
2.5 min on 2 cores. ``make test`` runs this beside the main tests, so the ZeRO-offload test finds them built
(or waits on torch's build lock while this finishes) instead of compiling inside the tests' own time. A user
may run it once after installing, for the same reason. The cache is torch's (``TORCH_EXTENSIONS_DIR``, else
``~/.cache/torch_extensions``): a second run only loads what is there.
"""

import time

from deepspeed.accelerator import get_accelerator

OPS = ("CPUAdamBuilder", "ShareMemCommBuilder")  # what ZeRO-offload and DeepSpeed's CPU backend load

if __name__ == "__main__":
    accelerator = get_accelerator()
    for op in OPS:
        start = time.perf_counter()
        accelerator.create_op_builder(op).load()
        print(f"[deepspeed-ops] {op}: ready in {time.perf_counter() - start:.1f} s")
