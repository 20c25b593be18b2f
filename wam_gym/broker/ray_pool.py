"""Model workers as Ray actors (``MULTIRUN.backend=ray``), for more GPUs than one machine has.

The broker's dispatcher is unchanged: this pool posts the same messages as the local one's
pipes carry, from a watcher thread that waits on the actors' result refs. Without
``MULTIRUN.ray_address`` a local Ray cluster is started on 127.0.0.1 with no dashboard;
with one, the pool joins that cluster (``ray start --head`` on your machines).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

from wam_gym.broker.model_worker import ModelInfo, ModelServer, PolicyFactory
from wam_gym.broker.shared_obs import AttachedSegments

logger = logging.getLogger(__name__)


class RayModelWorker:
    """The Ray actor: a ModelServer. Ray assigns its GPU (CUDA_VISIBLE_DEVICES), so any
    ``cuda:k`` becomes the actor's own ``cuda``."""

    def __init__(self, factory: PolicyFactory, device: str, worker_id: int, threads: int | None,
                 batch_invariant: bool = False):
        device = "cuda" if device.startswith("cuda") else device
        self.server = ModelServer(factory, device, worker_id, threads, batch_invariant)

    def ready(self) -> ModelInfo:
        return self.server.info

    def pid(self) -> int:
        return os.getpid()

    def run(self, batch_id: int, requests):
        return self.server.run(batch_id, requests)

    def end_episodes(self, episodes: list[int]) -> None:
        self.server.end_episodes(episodes)


def ray_devices(config) -> list[str]:
    """Ray places workers on the cluster's GPUs itself: one entry per worker."""
    per_machine = ["cuda"] * config.num_gpus if config.num_gpus else ["cpu"]
    return [d for d in per_machine for _ in range(config.workers_per_gpu)]


def _keep_ray_on_loopback() -> None:
    """Bind every server of a local Ray cluster (GCS, raylet, workers, agents) to 127.0.0.1.

    ``_node_ip_address`` alone is not enough: on Linux Ray resolves 127.0.0.1 to the routable
    address and its servers listen on every interface. Ray's own localhost switch (meant for
    macOS and Windows) stops that; spawned Ray processes read it from the environment, this one
    from the constant it already imported. A user's explicit setting of the variable wins.
    """
    from ray._private import ray_constants

    if os.environ.setdefault(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0") == "0":
        ray_constants.ENABLE_RAY_CLUSTER = False


def connect_ray(address: str | None) -> bool:
    """Join the Ray cluster at ``address`` (MULTIRUN.ray_address), or start a local one on 127.0.0.1 (null).
    True when this call connected (the caller then shuts Ray down); False when Ray was connected already."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        _keep_ray_on_loopback()
        # address="local": a new cluster of our own. Without it ray.init() joins whatever cluster
        # RAY_ADDRESS or /tmp/ray/ray_current_cluster names, a stale one included (it then hangs)
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    return True


class RayWorkerPool:
    def __init__(self, factory: PolicyFactory, devices: list[str], config, post):
        import ray

        self.ray, self.factory, self.devices, self.config, self.post = ray, factory, devices, config, post
        self._owns_cluster = connect_ray(config.ray_address)
        self._actor_cls = ray.remote(RayModelWorker)
        self.segments = AttachedSegments()
        self.handles: list[Any] = [None] * len(devices)
        self._dead = [False] * len(devices)
        self._causes = ["still running"] * len(devices)  # why each worker's actor ended, in words
        self._pending: dict[Any, tuple[int, str, Any]] = {}  # result ref -> (worker, kind, the actor asked)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="wam-ray-watcher", daemon=True)
        self._watcher.start()

    def __len__(self) -> int:
        return len(self.devices)

    def start(self, i: int) -> None:
        gpus = 1 / self.config.workers_per_gpu if self.devices[i].startswith("cuda") else 0
        handle = self._actor_cls.options(num_gpus=gpus, num_cpus=0).remote(
            self.factory, self.devices[i], i, self.config.torch_threads_per_worker, self.config.batch_invariant
        )
        with self._lock:
            self.handles[i], self._dead[i] = handle, False
            self._pending[handle.ready.remote()] = (i, "ready", handle)

    def submit(self, i: int, batch_id: int, requests) -> None:
        # Ray workers may run on other machines: the observations travel in the batch itself.
        requests = [dataclasses.replace(r, obs=self.segments.resolve(r.obs, copy=True), segment=None) for r in requests]
        with self._lock:
            self._pending[self.handles[i].run.remote(batch_id, requests)] = (i, "result", self.handles[i])

    def end_episodes(self, i: int, episodes: list[int]) -> None:
        """Worker ``i`` lets these episodes go. A Ray actor runs one caller's calls in the order they were made, so
        this comes after the batches submitted before it; nobody waits for its answer."""
        if self.alive(i):
            self.handles[i].end_episodes.remote(episodes)

    def alive(self, i: int) -> bool:
        return self.handles[i] is not None and not self._dead[i]

    def pid(self, i: int) -> int | None:
        return self.ray.get(self.handles[i].pid.remote())

    def kill(self, i: int) -> None:
        """End worker ``i``'s actor (a stalled one never answers); start() replaces it."""
        if self.handles[i] is not None:
            self.ray.kill(self.handles[i], no_restart=True)
            self._dead[i], self._causes[i] = True, "killed"

    def exit_cause(self, i: int) -> str:
        return self._causes[i]

    def connections(self) -> list:
        return []  # results arrive through post()

    def unsent(self) -> list:
        return []  # batches go by Ray's remote calls

    def _watch(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                refs = list(self._pending)
            if not refs:
                self._stop.wait(0.02)
                continue
            done, _ = self.ray.wait(refs, num_returns=1, timeout=0.1)
            for ref in done:
                with self._lock:
                    worker, kind, handle = self._pending.pop(ref)
                if handle is not self.handles[worker]:
                    continue  # from an actor killed and replaced already: the new one answers for it
                try:
                    value = self.ray.get(ref)
                except Exception as exc:
                    if kind == "ready":  # the actor could not build its model: say why
                        self.post(("failed", worker, str(exc)))
                    lines = str(exc).strip().splitlines()
                    self._causes[worker] = lines[-1] if lines else type(exc).__name__
                    self._dead[worker] = True  # else the broker restarts it and resends its batch
                    continue
                self.post(("ready", worker, value) if kind == "ready" else ("result", worker, value))

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(timeout=5)
        for handle in self.handles:
            if handle is not None:
                self.ray.kill(handle)
        self.segments.close()
        if self._owns_cluster:
            self.ray.shutdown()
