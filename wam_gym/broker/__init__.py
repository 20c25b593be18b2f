"""The inference broker: rollout actors send observations, model workers answer in batches.

    actors --request pipe (one each)--> dispatcher <--result pipe (one each)-- model workers
      |                                     |                                        |
      +--- observation slot (shared memory, one each: pixels) ---------------------->+
                                            |
                      Batcher (size / wait, grouped by shape; Pacer sets the size)
                                            |
          reply pipe (one per actor) <-- replies       batches --> batch pipe of an idle worker

Its parts, one module each:

- ``inference_broker``: :class:`InferenceBroker`, what callers hold; builds the rest, registers actors;
- ``dispatcher``: the one thread: batching, routing batches to workers, answering actors;
- ``supervisor``: the model workers' start, who is idle and what each holds, restarts, the stall watchdog;
- ``sessions``: the episodes of a model that remembers them: which worker holds each, live or lost;
- ``mailbox``: every pipe the dispatcher waits on, in one epoll set; ``actors``: each actor's pipes and slot;
- ``pool``: workers as local processes (``wam_gym/broker/ray_pool.py``: as Ray actors); ``client``: an actor's end;
- ``config`` (the MULTIRUN knobs), ``stats``, ``errors``.

Requests carry handles to the pixels in the actor's slot (wam_gym/broker/shared_obs.py): the model
worker reads them from there, and the dispatcher routes only small messages. It writes replies
without ever blocking (wam_gym/broker/outbox.py): an actor that stops reading holds up nobody else.

The dispatcher thread waits on every pipe at once. Each pipe has a single writer, so a
SIGKILL can cut short only the dead process's own message and never leaves a lock held that
others need (a shared multiprocess Queue's write lock stays taken when its writer dies in
``put``). A worker holds one batch, and while every worker is busy, one more *full* batch
waits in its pipe (``MAX_HELD``), and the worker stacks it while the first runs
(model_worker.BatchFeed): it starts the moment the first ends, not after the result has crossed to
the dispatcher, the next batch back and its stacking (a gap of ~12 ms a call at saturation, a
fifth of a compiled tiny model's call on an H200); partial batches still wait for a free worker,
as requests pile up into fuller batches. A worker that dies is restarted and the batches it held are
sent again; so is one that holds a batch far longer than batches take (a hung GPU or driver: the
watchdog SIGKILLs it); an actor that dies has its pending requests dropped.

A model that remembers episodes (agents.policy.EpisodicPolicy) keeps each episode on the worker that
served its first call: its calls go there, batched with that worker's other episodes. A worker holds at
most its model's episode_capacity: a new episode past that waits, in arrival order, until one ends. An
episode is let go there when its actor resets the env, is forgotten, or the broker closes. A worker that dies
loses its episodes: their calls are answered with EpisodeLost (restart the episode), never served
by a fresh worker as if they continued (wam_gym/broker/sessions.py). Pipes and queues stay
inside this process tree: nothing listens on a network socket (the Ray backend binds Ray to
127.0.0.1 unless given a cluster).
"""

from wam_gym.broker.client import CLIENT_WAIT_SLICE_S, BrokerClient
from wam_gym.broker.config import BACKENDS, BROKER_RANGES, BrokerConfig, worker_devices
from wam_gym.broker.errors import BrokerError, EpisodeLost, RemoteInferenceError, StartCancelled
from wam_gym.broker.inference_broker import InferenceBroker
from wam_gym.broker.pool import LocalWorkerPool
from wam_gym.broker.sessions import SessionRegistry
from wam_gym.broker.stats import STATS_WINDOW, BrokerStats
from wam_gym.broker.supervisor import MAX_HELD, STALL_MIN_SAMPLES, WATCH_INTERVAL_S

__all__ = [
    "BACKENDS", "BROKER_RANGES", "CLIENT_WAIT_SLICE_S", "MAX_HELD", "STALL_MIN_SAMPLES", "STATS_WINDOW",
    "WATCH_INTERVAL_S", "BrokerClient", "BrokerConfig", "BrokerError", "BrokerStats", "EpisodeLost", "InferenceBroker",
    "LocalWorkerPool", "RemoteInferenceError", "SessionRegistry", "StartCancelled", "worker_devices",
]
