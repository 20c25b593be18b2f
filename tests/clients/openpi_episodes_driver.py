"""Episodes as openpi's LIBERO example runs them against a model that remembers each episode, with the real
openpi-client (run from .venv-openpi).

    python openpi_episodes_driver.py PORT EPISODES.npz OUT.npz

EPISODES.npz holds ``agentview``, ``wrist`` (episodes, steps, H, W, 3): robosuite's raw frames, ``state``
(episodes, steps, 8), ``prompt`` and ``noise_seed`` (episodes,; -1: none). Each step is sent as
``examples/libero/main.py`` (Physical-Intelligence/openpi at 15a9616, its loop transcribed) sends it with
``--args.replan-steps 1``: both frames turned 180 degrees, a new chunk asked for whenever the action plan is empty,
``assert len(action_chunk) >= replan_steps``, ``chunk[:replan_steps]`` executed; plus the one-line change a model
that remembers episodes needs, ``"episode_id"``. Episode e's first observation carries ``noise_seed`` when given.
Then one observation without ``episode_id``. OUT.npz: ``actions`` (episodes, steps, action_dim), ``metadata``
(the greeting, JSON) and ``refused`` (the server's error for the last observation).
"""

import collections
import json
import sys

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

REPLAN_STEPS = 1  # --args.replan-steps 1

port, path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with np.load(path, allow_pickle=False) as data:
    episodes = {key: data[key] for key in data.files}
client = WebsocketClientPolicy(host="127.0.0.1", port=port)
actions = []
for e in range(len(episodes["agentview"])):
    action_plan, executed = collections.deque(), []
    for t in range(episodes["agentview"].shape[1]):
        element = {
            "observation/image": np.ascontiguousarray(episodes["agentview"][e, t][::-1, ::-1]),
            "observation/wrist_image": np.ascontiguousarray(episodes["wrist"][e, t][::-1, ::-1]),
            "observation/state": episodes["state"][e, t],
            "prompt": str(episodes["prompt"][e]),
            "episode_id": f"0-{e}",  # the one-line change: f"{task_id}-{episode_idx}"
        }
        if t == 0 and episodes["noise_seed"][e] >= 0:
            element["noise_seed"] = int(episodes["noise_seed"][e])
        if not action_plan:
            action_chunk = client.infer(element)["actions"]
            assert len(action_chunk) >= REPLAN_STEPS, (len(action_chunk), REPLAN_STEPS)
            action_plan.extend(action_chunk[:REPLAN_STEPS])
        executed.append(action_plan.popleft())
    actions.append(np.stack(executed))
element.pop("episode_id")
try:
    client.infer(element)
    refused = ""
except RuntimeError as exc:  # openpi-client raises the server's text frame
    refused = str(exc)
np.savez(out, actions=np.stack(actions), metadata=json.dumps(client.get_server_metadata(), default=str), refused=refused)
