"""``InferenceBroker``: what callers hold (evaluation, the policy server, benches). It builds the parts
(wam_gym/broker/__init__.py draws them), starts the workers, runs the dispatcher's thread, and registers actors.
"""

from __future__ import annotations

import logging

import multiprocess

from wam_gym.broker.actors import ActorLinks
from wam_gym.broker.client import BrokerClient
from wam_gym.broker.config import BrokerConfig, worker_devices
from wam_gym.broker.dispatcher import Dispatcher
from wam_gym.broker.errors import BrokerError
from wam_gym.broker.mailbox import Mailbox
from wam_gym.broker.model_worker import PolicyFactory
from wam_gym.broker.pool import LocalWorkerPool
from wam_gym.broker.sessions import SessionRegistry
from wam_gym.broker.stats import BrokerStats
from wam_gym.broker.supervisor import WorkerSupervisor

logger = logging.getLogger(__package__)  # the broker's parts log as one: "wam_gym.broker"


class InferenceBroker:
    """Serves actors' requests with a pool of model workers, batching dynamically."""

    def __init__(self, factory: PolicyFactory, config: BrokerConfig, ctx=None):
        self.config = config
        self.ctx = ctx or multiprocess.get_context("spawn")
        self.stats = BrokerStats()
        self.actors = ActorLinks(self.ctx)
        if config.backend == "ray":
            from wam_gym.broker.ray_pool import RayWorkerPool, ray_devices

            self.devices = ray_devices(config)
            self.pool = RayWorkerPool(factory, self.devices, config, lambda message: self.mailbox.post(message))
        else:
            self.devices = worker_devices(config)
            self.pool = LocalWorkerPool(factory, self.devices, config, self.ctx)
        self.mailbox = Mailbox(self.ctx, self.pool, self.actors)
        self.supervisor = WorkerSupervisor(self.pool, config, self.stats, self.mailbox)
        self.sessions = SessionRegistry(len(self.pool))
        # Answers leave through self._reply, looked up at each answer: the one place every answer passes
        # (tests count answers there).
        self.dispatcher = Dispatcher(config, self.supervisor, self.sessions, self.mailbox, self.actors, self.stats,
                                     lambda actor_id, message: self._reply(actor_id, message))

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> InferenceBroker:
        try:
            self.supervisor.start()
        except BaseException:
            self.close()  # the workers that did load must not hold their (GPU) memory until we exit
            raise
        for worker in range(len(self.pool)):
            self.dispatcher.worker_ready(worker)
        self.dispatcher.start()
        logger.info("broker: %d %s model worker(s) on %s", len(self.pool), self.config.backend, self.devices)
        return self

    def cancel_start(self) -> None:
        """From another thread: make a :meth:`start` in progress stop within a second, its workers closed."""
        self.supervisor.cancel_start()

    def close(self) -> None:
        self.dispatcher.stop()
        self.supervisor.end_episodes(self.sessions.held())  # each lets its episodes go before it is told to stop
        self.pool.close()
        self.actors.close()
        self.mailbox.close()

    def __enter__(self) -> InferenceBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def action_horizon(self) -> int | None:
        """Actions per chunk, as the model workers said when they loaded (None before)."""
        return None if self.supervisor.model is None else self.supervisor.model.action_horizon

    @property
    def remembers_episodes(self) -> bool:
        """Whether the model keeps each episode's state between calls (agents.policy.EpisodicPolicy), as the
        model workers said when they loaded: then each episode's calls go to the worker holding it."""
        return self.supervisor.model is not None and self.supervisor.model.remembers_episodes

    @property
    def episode_capacity(self) -> list[int] | None:
        """How many episodes each model worker holds at most (its model's EpisodicPolicy.episode_capacity), as the
        workers said when they loaded: the broker places no more on a worker, and new episodes wait past that until
        one ends. None for a model that does not remember episodes, or before the workers loaded."""
        if not self.remembers_episodes:
            return None
        return [model.episode_capacity for model in self.supervisor.models]

    @property
    def batcher(self):
        return self.dispatcher.batcher

    @property
    def _replies(self):
        return self.actors.replies

    def _reply(self, actor_id: int, message) -> None:
        self.actors.reply(actor_id, message)

    # ----------------------------------------------------------------- actors
    def client(self, actor_id: int) -> BrokerClient:
        """Register an actor; its client carries its own request pipe and reply pipe."""
        request_writer, reply_reader = self.actors.add(actor_id)
        return BrokerClient(actor_id, request_writer, reply_reader, self.action_horizon)

    def forget_actor(self, actor_id: int) -> None:
        """An actor died (or a server's client left): drop its queued requests (in-flight ones are answered into the
        void) and let its episodes go on their workers."""
        self.mailbox.post(("actor_gone", actor_id, None))

    # ----------------------------------------------------------------- health
    def dispatcher_cpu_s(self) -> float:
        """CPU seconds the dispatcher thread has used: its cost per request bounds how many
        requests/s one broker can route (bench/broker.py --standin prints it)."""
        return self.dispatcher.cpu_s()

    def ready(self) -> bool:
        """Every model worker has loaded its model and the dispatcher runs (a readiness probe)."""
        return self.dispatcher.running() and not self.supervisor.loading and self.dispatcher.failure is None

    def check(self) -> None:
        """Raise in the caller's thread if the dispatcher gave up."""
        if self.dispatcher.failure is not None:
            raise BrokerError(f"the inference broker stopped: {self.dispatcher.failure}") from self.dispatcher.failure
