"""The broker for rollout actors on a Ray cluster (``MULTIRUN.actor_backend=ray`` with a model: agent=wam, python).

A rollout actor on another node cannot share the driver's pipes and shared memory, so the broker
(wam_gym/broker) runs in a Ray actor of its own, :class:`BrokerHost`, placed on the driver's node with no CPU.
Every rollout actor's model calls go to it as Ray calls (:class:`GateClient`, a Predictor): the observations
travel once, through Ray's object store, and the host hands them to the broker through an actor link of its
own (wam_gym/broker/client.py), so batching, routing, restarts and episode sessions are the local broker's.
Its model workers are local processes of the driver's node (``MULTIRUN.backend=local``) or Ray actors on the
cluster's GPUs (``backend=ray``): a worker whose node is lost is restarted elsewhere and its batches resent.

Noise seeds are drawn by the GateClient, from the episode's seed and call count, as a local actor's client
draws them: an episode's actions do not depend on where it ran.
"""

from __future__ import annotations

import threading
from typing import Any

from agents.policy import ModelCost
from agents.predictor import Predictor
from envs.protocol import batch_size
from wam_gym.broker import CLIENT_WAIT_SLICE_S, BrokerError, InferenceBroker

HOST_THREADS = 8  # the host's threads beyond one per rollout actor: the run loop's checks, forgets, stats


class BrokerHost:
    """The Ray actor holding the broker; each rollout actor's calls run in a thread of its own here."""

    def __init__(self, factory, config):
        self.broker = InferenceBroker(factory, config).start()
        self.clients: dict[int, Any] = {}
        self._lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        b = self.broker
        return {"devices": b.devices, "remembers_episodes": b.remembers_episodes, "action_horizon": b.action_horizon}

    def _client(self, actor_id: int):
        with self._lock:
            if actor_id not in self.clients:
                self.clients[actor_id] = self.broker.client(actor_id)
            return self.clients[actor_id]

    def call(self, actor_id: int, method: str, obs, seeds) -> tuple[Any, float | None, int | None]:
        """``method`` (predict, predict_row) of the actor's link with its seeds; the answer and what it cost."""
        client = self._client(actor_id)
        before = (client.cost.model_s or 0.0, client.cost.denoise_steps or 0)
        answer = {"predict": client.predict, "predict_row": client.predict_row}[method](obs, seeds)
        after = client.cost
        model_s = None if after.model_s is None else after.model_s - before[0]
        return answer, model_s, None if after.denoise_steps is None else after.denoise_steps - before[1]

    def release(self, actor_id: int, episode: int) -> None:
        self._client(actor_id).release_episode(episode)

    def forget(self, actor_id: int) -> None:
        with self._lock:
            client = self.clients.pop(actor_id, None)
        if client is not None:
            client.close()
        self.broker.forget_actor(actor_id)

    def failure(self) -> str | None:
        try:
            self.broker.check()
        except BrokerError as exc:
            return str(exc)
        return None

    def stats(self) -> dict[str, Any]:
        return self.broker.stats.summary()

    def close(self) -> None:
        self.broker.close()


class GateClient(Predictor):
    """A rollout actor's Predictor on any node: its model calls as Ray calls to the BrokerHost."""

    def __init__(self, host, actor_id: int, action_horizon: int | None):
        self.host, self.actor_id, self.action_horizon = host, actor_id, action_horizon
        self.cost, self.on_wait = ModelCost(), None

    def __str__(self) -> str:
        return "the model (served by the broker's workers, through the cluster)"

    def predict(self, obs, noise_seeds=None):
        return self._call("predict", obs, self.call_seeds(batch_size(obs), noise_seeds))

    def predict_row(self, obs, noise_seed=None):
        return self._call("predict_row", obs, self.call_seeds(1, None if noise_seed is None else [noise_seed])[0])

    def release_episode(self, episode: int) -> None:
        self.host.release.remote(self.actor_id, int(episode))

    def _call(self, method: str, obs, seeds):
        import ray

        ref = self.host.call.remote(self.actor_id, method, obs, seeds)
        while not ray.wait([ref], timeout=CLIENT_WAIT_SLICE_S)[0]:
            if self.on_wait is not None:  # waiting for the model is no stall of the actor's
                self.on_wait()
        # a broker error (EpisodeLost, a failed model call) comes back as itself (Ray's RayTaskError subclasses it)
        answer, model_s, denoise_steps = ray.get(ref)
        self.cost.add(model_s, denoise_steps)
        return answer


class RayBroker:
    """What the run loop holds of a BrokerHost: the InferenceBroker's methods it calls, as Ray calls."""

    def __init__(self, factory, config, actors: int):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray = ray
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.host = ray.remote(BrokerHost).options(num_cpus=0, max_concurrency=actors + HOST_THREADS,
                                                   scheduling_strategy=here).remote(factory, config)
        info = ray.get(self.host.info.remote())  # raises the broker's start error (a model that failed to load)
        self.devices, self.remembers_episodes = info["devices"], info["remembers_episodes"]
        self.action_horizon = info["action_horizon"]
        self.stats = _Stats(self)

    def client(self, actor_id: int) -> GateClient:
        return GateClient(self.host, actor_id, self.action_horizon)

    def forget_actor(self, actor_id: int) -> None:
        self.host.forget.remote(actor_id)

    def check(self) -> None:
        failure = self.ray.get(self.host.failure.remote())
        if failure:
            raise BrokerError(failure)

    def close(self) -> None:
        try:
            self.ray.get(self.host.close.remote(), timeout=60)
        finally:
            self.ray.kill(self.host)


class _Stats:
    def __init__(self, broker: RayBroker):
        self.broker = broker

    def summary(self) -> dict[str, Any]:
        return self.broker.ray.get(self.broker.host.stats.remote())
