"""The broker's knobs (``MULTIRUN.*``): how many model workers on which devices, how requests batch, how faults
are handled."""

from __future__ import annotations

from dataclasses import dataclass

from wam_gym.broker.errors import BrokerError
from wam_gym.utils.ranges import Range, check_ranges

BACKENDS = ("local", "ray")


@dataclass
class BrokerConfig:
    """The MULTIRUN knobs of the broker (EasyWAM's names)."""

    num_gpus: int = 0  # 0: CPU workers
    gpu_ids: list[int] | None = None  # null: the first num_gpus devices; else the first num_gpus of this pool
    workers_per_gpu: int = 1  # model copies per GPU (per machine on CPU), each its own process
    inference_batch_size: int = 4  # most requests one model call takes
    inference_batch_wait_ms: float = 5.0  # longest the oldest queued request waits for a fuller batch
    backend: str = "local"  # local processes, or ray actors
    ray_address: str | None = None  # null: a local Ray cluster on 127.0.0.1
    torch_threads_per_worker: int | None = None  # null: 1 on CPU workers (they share cores with envs), else torch's; 0: torch's
    max_worker_restarts: int = 3  # restarts of each model worker (died, stalled, killed while loading) before the run stops
    startup_timeout_s: float = 600.0  # time for every model worker to load its model
    # The stall watchdog: a worker holding a batch longer than max(stall_floor_s, stall_factor x the
    # p95 time a batch keeps its worker) is SIGKILLed (a hung GPU or driver never answers), restarted, and its batch resent.
    stall_factor: float = 10.0  # times the p95 batch time a batch may take before its worker counts as stalled
    stall_floor_s: float = 60.0  # never sooner; also the bound while too few batches were timed for a p95
    stall_first_batch_s: float = 1800.0  # a (re)started worker's first batch: torch.compile, CUDA graphs, lazy loads
    batch_invariant: bool = False  # each request runs alone: bit-identical actions whatever the batching, no batching speed-up
    batch_pacing: bool = True  # release batches of the size that keeps actors waiting least (batching.Pacer), not always full

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"MULTIRUN.backend={self.backend!r}: choose one of {BACKENDS}")
        check_ranges(self, "MULTIRUN", BROKER_RANGES)


BROKER_RANGES = {  # every numeric knob of the broker (MULTIRUN.*)
    "num_gpus": Range(0, 1024, note="0: CPU workers"),
    "workers_per_gpu": Range(1, 256),
    "inference_batch_size": Range(1, 65_536),
    "inference_batch_wait_ms": Range(0, integer=False, note="milliseconds"),
    "torch_threads_per_worker": Range(0, note="0: torch's own count, untouched", null="1 on CPU workers, else torch's"),
    "max_worker_restarts": Range(0, 10_000, note="0: the first death stops the run"),
    "startup_timeout_s": Range(0, open_low=True, integer=False, note="seconds"),
    "stall_factor": Range(1, integer=False),
    "stall_floor_s": Range(0, open_low=True, integer=False, note="seconds"),
    "stall_first_batch_s": Range(0, open_low=True, integer=False, note="seconds"),
}


def worker_devices(config: BrokerConfig, available_gpus: int | None = None) -> list[str]:
    """One device string per model worker, GPUs chosen as MULTIRUN.gpu_ids says."""
    if config.num_gpus == 0:
        return ["cpu"] * config.workers_per_gpu
    if available_gpus is None:
        import torch

        available_gpus = torch.cuda.device_count()
    pool = list(range(available_gpus)) if config.gpu_ids is None else list(config.gpu_ids)
    if available_gpus == 0:
        raise BrokerError(
            f"MULTIRUN.num_gpus={config.num_gpus} but no CUDA device is visible; set MULTIRUN.num_gpus=0 for CPU workers"
        )
    if len(pool) < config.num_gpus:
        raise BrokerError(f"MULTIRUN.num_gpus={config.num_gpus} but the GPU pool {pool} has only {len(pool)}")
    unknown = [g for g in pool[: config.num_gpus] if not 0 <= g < available_gpus]
    if unknown:
        raise BrokerError(f"MULTIRUN.gpu_ids {unknown} do not exist (this machine has {available_gpus} GPUs)")
    return [f"cuda:{g}" for g in pool[: config.num_gpus] for _ in range(config.workers_per_gpu)]
