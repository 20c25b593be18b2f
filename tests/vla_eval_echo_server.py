"""A vla-eval model server for tests, served by vla-eval's own code (``serve_async``).

    python tests/vla_eval_echo_server.py PORT LOG [DELAY_S]

Answers a chunk of CHUNK actions derived from the state; ``chunk_size=CHUNK`` makes vla-eval
serve one action per observation from its buffer. Every episode_start, episode_end and model
call is appended to LOG as a JSON line (flushed at once: the tests read it while we run, and
SIGKILL us). Each model call sleeps DELAY_S, so a test can kill us mid-episode.
"""

from __future__ import annotations

import json
import sys
import time

import anyio
import numpy as np
from vla_eval.model_servers.predict import PredictModelServer
from vla_eval.model_servers.serve import serve_async

CHUNK = 4


class EchoServer(PredictModelServer):
    def __init__(self, log: str, delay_s: float = 0.0):
        super().__init__(chunk_size=CHUNK)
        self.log, self.delay_s = log, delay_s

    def record(self, event: str, **fields) -> None:
        with open(self.log, "a") as f:
            f.write(json.dumps({"event": event, **fields}) + "\n")

    def predict(self, obs, ctx):
        state = np.asarray(obs["state"], np.float32)
        self.record("predict", keys=sorted(obs), cameras=sorted(obs["images"]), instruction=obs["task_description"])
        time.sleep(self.delay_s)
        return {"actions": np.repeat(np.clip(-state[None, :4], -1, 1), CHUNK, axis=0)}

    async def on_episode_start(self, config, ctx):
        self.record("episode_start", seed=config.get("seed"), task=config.get("task"))
        await super().on_episode_start(config, ctx)

    async def on_episode_end(self, result, ctx):
        self.record("episode_end", result=result)
        await super().on_episode_end(result, ctx)


if __name__ == "__main__":
    port, log = int(sys.argv[1]), sys.argv[2]
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    anyio.run(serve_async, EchoServer(log, delay), "127.0.0.1", port)
