"""One observation as openpi's LIBERO example sends it, with the real openpi-client (run from .venv-openpi).

    python openpi_libero_driver.py PORT ROBOSUITE_OBS.npz "task description"

ROBOSUITE_OBS.npz holds what LIBERO's robosuite env observes (``agentview_image``,
``robot0_eye_in_hand_image`` as robosuite's renderer draws them, ``robot0_eef_pos``, ``robot0_eef_quat``,
``robot0_gripper_qpos``). The observation is built as openpi's ``examples/libero/main.py`` builds it
(Physical-Intelligence/openpi at 15a9616, lines 113-141, transcribed: main.py is a script, not a
package): both images turned 180 degrees, then openpi-client's own ``image_tools.resize_with_pad`` to
224 and ``convert_to_uint8``; the state from the end effector's position, axis-angle and the gripper's
qpos. It is sent with openpi-client's own ``WebsocketClientPolicy``; the answer's chunk shape is printed.
"""

import math
import sys

import numpy as np
from openpi_client import image_tools
from openpi_client.websocket_client_policy import WebsocketClientPolicy

RESIZE_SIZE = 224  # main.py Args.resize_size


def _quat2axisangle(quat):  # main.py's, from robosuite
    if quat[3] > 1.0:
        quat[3] = 1.0
    elif quat[3] < -1.0:
        quat[3] = -1.0
    den = np.sqrt(1.0 - quat[3] * quat[3])
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return (quat[:3] * 2.0 * math.acos(quat[3])) / den


port, path, task_description = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with np.load(path, allow_pickle=False) as data:
    obs = {key: data[key] for key in data.files}
# IMPORTANT: rotate 180 degrees to match train preprocessing (main.py's comment)
img = np.ascontiguousarray(obs["agentview_image"][::-1, ::-1])
wrist_img = np.ascontiguousarray(obs["robot0_eye_in_hand_image"][::-1, ::-1])
img = image_tools.convert_to_uint8(image_tools.resize_with_pad(img, RESIZE_SIZE, RESIZE_SIZE))
wrist_img = image_tools.convert_to_uint8(image_tools.resize_with_pad(wrist_img, RESIZE_SIZE, RESIZE_SIZE))
element = {
    "observation/image": img,
    "observation/wrist_image": wrist_img,
    "observation/state": np.concatenate(
        (obs["robot0_eef_pos"], _quat2axisangle(obs["robot0_eef_quat"].copy()), obs["robot0_gripper_qpos"])
    ),
    "prompt": str(task_description),
}
client = WebsocketClientPolicy(host="127.0.0.1", port=port)
print("openpi LIBERO example: chunk", np.asarray(client.infer(element)["actions"]).shape)
