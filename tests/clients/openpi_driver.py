"""Drives a policy server with the real openpi-client, from its own venv (.venv-openpi: numpy<2).

    python openpi_driver.py PORT CLIENTS CALLS OUT.npz [API_KEY]
    DRIVER_STATE_DIM=8 DRIVER_IMAGE_SIZE=256 python openpi_driver.py ...   # another model's state and frames

Starts CLIENTS threads at once, each its own ``WebsocketClientPolicy``; client c sends CALLS
observations (images and state drawn from seed c, noise_seed 1000 * c + call). Saves what was
sent and what came back, numeric arrays only (the test reads it without pickle).
"""

import os
import sys
import threading

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

port, clients, calls, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
api_key = sys.argv[5] if len(sys.argv) > 5 else None
size, state_dim = int(os.environ.get("DRIVER_IMAGE_SIZE", 64)), int(os.environ.get("DRIVER_STATE_DIM", 4))
results, errors, barrier = {}, [], threading.Barrier(clients)


def client(c: int) -> None:
    try:
        run_client(c)
    except BaseException as exc:  # reported below: a thread's exception would otherwise be lost
        errors.append(f"client {c}: {type(exc).__name__}: {exc}")
        barrier.abort()


def run_client(c: int) -> None:
    policy = WebsocketClientPolicy(host="127.0.0.1", port=port, api_key=api_key)
    rng = np.random.default_rng(c)
    barrier.wait()  # every client connected: their requests meet in the broker
    for k in range(calls):
        obs = {
            "observation/image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(state_dim).astype(np.float32),
            "prompt": f"task {c % 2}",
            "noise_seed": 1000 * c + k,
        }
        answer = policy.infer(obs)
        for key in ("observation/image", "observation/wrist_image", "observation/state"):
            results[f"{c}_{k}_{key.split('/')[1]}"] = obs[key]
        results[f"{c}_{k}_actions"] = answer["actions"]
        results[f"{c}_{k}_infer_ms"] = np.float64(answer["server_timing"]["infer_ms"])


threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    sys.exit("\n".join(errors))
np.savez(out, **results)
print(f"openpi driver: {clients} clients x {calls} calls answered")
