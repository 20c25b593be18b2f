"""What the broker measured: batches, their sizes, queue waits, model and stacking times, restarts."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from wam_gym.utils.stats import percentile

# Percentiles come from the latest this-many samples: a week-long evaluation keeps flat memory.
STATS_WINDOW = 10_000


@dataclass
class BrokerStats:
    batches: int = 0
    requests: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    queue_wait_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    # Per batch, how long its first request waited for its last to be sent: the part of the queue
    # wait spent filling the batch, not waiting for a worker. Clients that arrive staggered (envs
    # whose steps vary, or that share too few cores to wake together) make it long.
    batch_fill_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    model_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    # Per batch, how long its worker took to stack its observations out of the actors' slots (a copy of every
    # image: 1.1-1.6 ms for 16 rows of two 224x224 images on a 2-core VM), while the call before ran when the
    # worker stacked it ahead (model_worker.BatchFeed), else between calls: time the model waits.
    stack_s: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    worker_restarts: int = 0
    resent_batches: int = 0
    stalled_workers: int = 0  # killed by the watchdog (each also counts as a restart)
    lost_episodes: int = 0  # episodes of a model that remembers them, lost with their worker (their actors restart them)
    # A model that remembers episodes: each worker's episode capacity (as it said when it last loaded), and the new
    # episodes whose first call found every worker full and waited for an episode to end; the longest such wait.
    episode_capacity: dict[int, int] = field(default_factory=dict)
    waited_episodes: int = 0
    admission_wait_s_max: float = 0.0

    def add_batch(self, waits_s: list[float]) -> None:
        self.batches += 1
        self.requests += len(waits_s)
        self.batch_sizes.append(len(waits_s))
        self.queue_wait_s.extend(waits_s)
        self.batch_fill_s.append(max(waits_s) - min(waits_s))

    def summary(self) -> dict[str, Any]:
        def pct(values, q):
            return 1000 * percentile(values, q)

        return {
            "batches": self.batches,
            "requests": self.requests,
            "mean_batch_size": self.requests / self.batches if self.batches else 0.0,
            "queue_wait_ms_p50": pct(self.queue_wait_s, 50),
            "queue_wait_ms_p95": pct(self.queue_wait_s, 95),
            "batch_fill_ms_p50": pct(self.batch_fill_s, 50),
            "batch_fill_ms_p95": pct(self.batch_fill_s, 95),
            "model_ms_p50": pct(self.model_s, 50),
            "model_ms_p95": pct(self.model_s, 95),
            "stack_ms_p50": pct(self.stack_s, 50),
            "stack_ms_p95": pct(self.stack_s, 95),
            "worker_restarts": self.worker_restarts,
            "resent_batches": self.resent_batches,
            "stalled_workers": self.stalled_workers,
            "lost_episodes": self.lost_episodes,
            "episode_capacity": [self.episode_capacity[w] for w in sorted(self.episode_capacity)],
            "waited_episodes": self.waited_episodes,
            "admission_wait_ms_max": 1000 * self.admission_wait_s_max,
        }
