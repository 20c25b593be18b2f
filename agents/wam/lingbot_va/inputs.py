"""How wam_gym observations become LingBot-VA's inputs, and its action chunks env actions: the conventions of its
released evaluations (github.com/Robbyant/lingbot-va; the files are named below, ``wan_va/`` and ``evaluation/``).

``lingbot_va_libero``
    their LIBERO evaluation: ``evaluation/libero/client.py`` with ``wan_va/wan_va_server.py`` serving
    ``wan_va/configs/va_libero_cfg.py``. The client renders ``agentview`` and ``robot0_eye_in_hand`` at 128 x 128
    and flips robosuite's raw frame top to bottom (``_extract_obs``: ``obs["agentview_image"][::-1]``): the
    upright frame wam_gym's envs render. The server (``_encode_obs``) takes each camera to float32, resizes it to
    ``height`` x ``width`` (``F.interpolate``, bilinear, ``align_corners=False``, no antialiasing: the identity
    at 128 x 128) and maps it ``x / 255 * 2 - 1``; each camera is VAE-encoded on its own, in ``obs_cam_keys``
    order, and the latents sit side by side. Actions (``postprocess_action``): the model's 30 channels
    un-normalised by the config's quantiles, ``(a + 1) / 2 * (q99 - q01 + 1e-6) + q01``, then channels 0..6
    kept (``used_action_channel_ids``): LIBERO's own 7-d action, gripper -1 open / +1 closed, sent as is.
    A chunk is ``frame_chunk_size`` 4 latent frames of ``action_per_frame`` 4 actions, executed frame by
    frame; the first chunk's frame 0 belongs to the observed frame (conditioned on a zero action) and is not
    executed (``run_one``: ``start_idx = 1 if first else 0``), so the first chunk runs 12 actions, later ones 16.
``lingbot_va_robotwin``
    their RoboTwin 2.0 evaluation: ``evaluation/robotwin/eval_polict_client_openpi.py`` with
    ``wan_va/configs/va_robotwin_cfg.py`` (``env_type = 'robotwin_tshape'``). RoboTwin's own frames (upright),
    the head camera resized to 256 x 320 and both wrist cameras to 128 x 160; 16-d end-effector targets
    from channels ``[0..6, 28, 7..13, 29]`` (per arm: xyz, quaternion xyzw, gripper), each relative to the
    episode's first end-effector pose (``add_init_pose``: translations added, rotations composed
    ``init * new``) with its quaternion normalised, sent as RoboTwin's ``ee`` actions. A chunk is 2 latent
    frames of 16 actions.

Between chunks their client sends the server the executed chunk (``state=action``, the first chunk's frame 0
included) and a key frame every ``action_per_frame // 4`` actions (Wan2.2's VAE packs 4 frames into a latent
frame), which the server normalises (``preprocess_action``) and encodes into its KV cache.

The LIBERO statistics and channels are those of their latest config, the one the released LIBERO-Long
weights need (their README, 2026-04-24: "Ensure that ``action_snr_shift``, ``used_action_channel_ids`` and
``norm_stat`` ... are synchronized with the latest version"): ``action_snr_shift = 0.05`` and channels 0..6.
An earlier copy (the 2026-04-08 LIBERO release) had 1.0 and ``[0..5, 28]``, with the same quantiles.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from envs.orientation import UPRIGHT, check_orientation, reorient

if TYPE_CHECKING:
    import torch

ACTION_CHANNELS = 30  # va_*_cfg.action_dim: the model's action channels, of which a robot uses some
VAE_TIME_STRIDE = 4  # Wan2.2's VAE packs 4 video frames into a latent frame
EPS = 1e-6  # the quantile span's guard in preprocess_action / postprocess_action
FED_BACK_LIMIT = 1.5  # preprocess_action clamps a fed-back chunk's normalised actions to +-1.5
LAYOUTS = ("side_by_side", "t_shape")  # how the cameras' latents are tiled (env_type 'none' / 'robotwin_tshape')


@dataclass(frozen=True)
class Sampling:
    """How their server samples a chunk (``_infer``): the video stream, then the actions, each an Euler flow with
    its own steps, text guidance and shift (``FlowMatchScheduler(shift=...)``); values from ``va_*_cfg.py``."""

    video_steps: int  # num_inference_steps
    action_steps: int  # action_num_inference_steps
    video_guidance: float  # guidance_scale
    action_guidance: float  # action_guidance_scale
    video_shift: float  # snr_shift
    action_shift: float  # action_snr_shift
    attn_window: int  # attn_window: the KV cache's window


@dataclass(frozen=True)
class LingBotVAInputs:
    """One input/output convention (see the module docstring for the named ones)."""

    name: str  # the convention's name, which evaluation protocols check (wam_config.json inputs.name)
    suite: str  # the env suite (envs.registry) its frames and actions are of
    cameras: tuple[str, ...]  # wam_gym's cameras, in their obs_cam_keys order
    sizes: tuple[tuple[int, int], ...]  # (height, width) each camera is resized to, in ``cameras`` order
    layout: str  # side_by_side (every camera at one size) | t_shape (the head above the two wrists at half size)
    frame_chunk_size: int  # latent frames a chunk predicts
    action_per_frame: int  # actions per latent frame
    channels: tuple[int, ...]  # used_action_channel_ids: env action i is model channel channels[i]
    q01: tuple[float, ...]  # norm_stat["q01"] of those channels, in the same order
    q99: tuple[float, ...]  # norm_stat["q99"] of those channels
    sampling: Sampling
    relative_pose: bool = False  # end-effector targets relative to the episode's first pose (RoboTwin's add_init_pose)
    orientation: str = UPRIGHT  # how their client's frames are turned relative to upright (envs/orientation.py)

    def __post_init__(self) -> None:
        check_orientation(self.orientation, "inputs.orientation")
        if self.layout not in LAYOUTS:
            raise ValueError(f"inputs.layout={self.layout!r}: choose one of {LAYOUTS}")
        if not len(self.cameras) == len(self.sizes) >= 1:
            raise ValueError(f"inputs.sizes has {len(self.sizes)} entries for {len(self.cameras)} cameras: give one "
                             "(height, width) per camera")
        if not len(self.channels) == len(self.q01) == len(self.q99) >= 1:
            raise ValueError(f"inputs.channels, q01 and q99 have {len(self.channels)}, {len(self.q01)} and "
                             f"{len(self.q99)} entries: give one statistic of each per channel")
        if self.action_per_frame % VAE_TIME_STRIDE:
            raise ValueError(f"inputs.action_per_frame={self.action_per_frame} must be a multiple of "
                             f"{VAE_TIME_STRIDE} (the VAE's frames per latent frame)")

    @property
    def chunk_actions(self) -> int:
        """Actions a chunk holds (the first chunk executes ``action_per_frame`` fewer)."""
        return self.frame_chunk_size * self.action_per_frame

    @property
    def steps_per_key_frame(self) -> int:
        """Executed actions between two key frames sent back for the KV cache (client: ``action.shape[2] // 4``)."""
        return self.action_per_frame // VAE_TIME_STRIDE

    def chunk_steps(self, first: bool) -> int:
        """Env actions a chunk executes: its first frame's are skipped in an episode's first chunk."""
        return (self.frame_chunk_size - int(first)) * self.action_per_frame

    # ----------------------------------------------------------------- observation -> model
    def video(self, frames: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Upright uint8 frames (T, H, W, 3) per camera -> float32 (3, T, h, w) in [-1, 1] per camera, at its
        size, in ``cameras`` order: what ``_encode_obs`` hands the VAE (which stacks the cameras on its batch axis)."""
        import torch  # here, not above: protocol records read this module's settings without torch
        import torch.nn.functional as F

        out = {}
        for camera, size in zip(self.cameras, self.sizes):
            clip = reorient(_clip(frames, camera), UPRIGHT, self.orientation)
            x = torch.from_numpy(np.ascontiguousarray(clip)).float().permute(3, 0, 1, 2)  # (3, T, H, W)
            # (3, T, H, W) read as (batch, channels, H, W): a 2-D resize of every frame, as _encode_obs does
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
            out[camera] = x / 255.0 * 2.0 - 1.0
        return out

    def prompt(self, instruction: str) -> str:
        """The instruction as their text encoder reads it (``_get_t5_prompt_embeds``: diffusers' ``prompt_clean``,
        HTML entities unescaped and whitespace runs made one space; its ftfy repair is a no-op on our text)."""
        return re.sub(r"\s+", " ", html.unescape(html.unescape(instruction)).strip()).strip()

    # ----------------------------------------------------------------- model <-> env units
    def unnormalized(self, model_actions: np.ndarray) -> np.ndarray:
        """The model's (30, F, H) actions in [-1, 1] -> the used channels (C, F, H) in the robot's units
        (``postprocess_action``)."""
        a = _model_chunk(model_actions, self.frame_chunk_size, self.action_per_frame)[list(self.channels)]
        q01, q99 = self._stats()
        return (a + 1) / 2 * (q99 - q01 + EPS) + q01

    def normalized(self, chunk: np.ndarray) -> np.ndarray:
        """A chunk (C, F, H) in the robot's units (the client's ``state=action``) -> the model's (30, F, H): the used
        channels ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`` (``preprocess_action``), the others 0 (the mask
        ``_prepare_latent_input`` applies)."""
        chunk = np.asarray(chunk, dtype=np.float32)
        if chunk.ndim != 3 or chunk.shape[0] != len(self.channels):
            raise ValueError(f"an executed chunk is ({len(self.channels)}, frames, actions per frame), got "
                             f"{chunk.shape}: pass the chunk as {self.name} unnormalized() returns it")
        q01, q99 = self._stats()
        out = np.zeros((ACTION_CHANNELS, *chunk.shape[1:]), dtype=np.float32)
        # clamped to [-1.5, 1.5] as their server does before the cache sees it (preprocess_action, a62fe9c)
        out[list(self.channels)] = np.clip((chunk - q01) / (q99 - q01 + EPS) * 2.0 - 1.0, -FED_BACK_LIMIT, FED_BACK_LIMIT)
        return out

    def model_units(self, actions: np.ndarray) -> np.ndarray:
        """Env actions (..., C) -> the used channels as training reads them (..., C): their dataset's
        ``_action_post_process``, ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`` in float64, clamped to +-1.5 (f66f602),
        in float32."""
        actions = np.asarray(actions)
        if actions.shape[-1] != len(self.channels):
            raise ValueError(f"actions of {actions.shape[-1]} values; {self.name} drives {len(self.channels)} channels: "
                             "train on demos of its robot")
        q01, q99 = (np.asarray(q, dtype=np.float64) for q in (self.q01, self.q99))
        scaled = (actions.astype(np.float64) - q01) / (q99 - q01 + EPS) * 2.0 - 1.0
        return np.clip(scaled, -FED_BACK_LIMIT, FED_BACK_LIMIT).astype(np.float32)

    def env_actions(self, model_actions: np.ndarray, first: bool, start_pose: np.ndarray | None = None) -> np.ndarray:
        """The model's (30, F, H) chunk -> the (steps, C) actions the env executes, in order: frame by frame, the
        first chunk's frame 0 left out; RoboTwin's targets made absolute from ``start_pose`` (the episode's
        first end-effector pose, 16-d as the actions)."""
        chunk = self.unnormalized(model_actions)[:, int(first):]
        steps = chunk.reshape(len(self.channels), -1).T
        if not self.relative_pose:
            return np.ascontiguousarray(steps, dtype=np.float32)
        if start_pose is None or np.shape(start_pose) != (len(self.channels),):
            raise ValueError(f"{self.name} actions are relative to the episode's first end-effector pose: pass "
                             f"start_pose, {len(self.channels)} values (per arm xyz, quaternion xyzw, gripper)")
        return np.stack([absolute_pose(step, np.asarray(start_pose, dtype=np.float64)) for step in steps])

    def _stats(self) -> tuple[np.ndarray, np.ndarray]:
        shape = (len(self.channels), 1, 1)
        return (np.asarray(self.q01, dtype=np.float32).reshape(shape), np.asarray(self.q99, dtype=np.float32).reshape(shape))


# ----------------------------------------------------------------- RoboTwin's relative end-effector targets
def quaternion_product(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The rotation ``p`` after ``q`` (Hamilton product), both unit quaternions xyzw."""
    (px, py, pz, pw), (qx, qy, qz, qw) = p, q
    return np.array([pw * qx + px * qw + py * qz - pz * qy,
                     pw * qy - px * qz + py * qw + pz * qx,
                     pw * qz + px * qy - py * qx + pz * qw,
                     pw * qw - px * qx - py * qy - pz * qz])


def absolute_pose(step: np.ndarray, start: np.ndarray) -> np.ndarray:
    """One 16-d target (per arm: xyz, quaternion xyzw, gripper) relative to ``start`` -> absolute, each quaternion
    unit length (their ``add_init_pose``, whose scipy rotations normalise their inputs, then the client's norm)."""
    arms = []
    for new, init in ((step[:8], start[:8]), (step[8:], start[8:])):
        rotation = quaternion_product(_unit(init[3:7]), _unit(new[3:7]))
        arms.append(np.concatenate([new[:3] + init[:3], _unit(rotation), new[7:8]]))
    return np.concatenate(arms)


def _unit(q: np.ndarray) -> np.ndarray:
    return np.asarray(q, dtype=np.float64) / np.linalg.norm(q)


# ----------------------------------------------------------------- checks
def _clip(frames: Mapping[str, np.ndarray], camera: str) -> np.ndarray:
    if camera not in frames:
        raise ValueError(f"no frames of camera {camera!r} (got {sorted(frames)}): evaluate with its cameras "
                         "(protocol=NAME sets env_kwargs.cameras)")
    clip = np.asarray(frames[camera])
    if clip.dtype != np.uint8 or clip.ndim != 4 or clip.shape[-1] != 3 or 0 in clip.shape[:3]:
        raise ValueError(f"frames/{camera} is {clip.dtype} {clip.shape}; pass uint8 (T, H, W, 3), T >= 1 "
                         "(0-255 RGB, upright, as wam_gym envs return)")
    return clip


def _model_chunk(actions: np.ndarray, frames: int, per_frame: int) -> np.ndarray:
    actions = np.asarray(actions, dtype=np.float32)
    if actions.shape != (ACTION_CHANNELS, frames, per_frame):
        raise ValueError(f"a LingBot-VA chunk is ({ACTION_CHANNELS}, {frames}, {per_frame}) (channels, latent frames, "
                         f"actions per frame), got {actions.shape}: drop the batch and trailing axes of "
                         "(B, 30, F, H, 1)")
    return actions


LIBERO_Q01 = (-0.6589285731315613, -0.84375, -0.9375, -0.12107142806053162, -0.15964286029338837,
              -0.26571428775787354, -1.0)  # va_libero_cfg.py norm_stat["q01"][0:7]
LIBERO_Q99 = (0.8999999761581421, 0.8544642925262451, 0.9375, 0.17142857611179352, 0.1842857152223587,
              0.34392857551574707, 1.0)  # va_libero_cfg.py norm_stat["q99"][0:7]
# va_robotwin_cfg.py norm_stat, taken at used_action_channel_ids [0..6, 28, 7..13, 29] (grippers: channels 28, 29)
ROBOTWIN_Q01 = (-0.06172713458538055, -3.6716461181640625e-05, -0.08783501386642456, -1.0, -1.0, -1.0, -1.0, 0.0,
                -0.3547105032205582, -1.3113021850585938e-06, -0.11975435614585876, -1.0, -1.0, -1.0, -1.0, 0.0)
ROBOTWIN_Q99 = (0.3462600058317184, 0.39966784834861746, 0.14745532035827624, 1.0, 1.0, 1.0, 1.0, 1.0,
                0.034201726913452024, 0.39142737388610793, 0.1792279863357542, 1.0, 1.0, 1.0, 1.0, 1.0)

CONVENTIONS = {
    "lingbot_va_libero": LingBotVAInputs(
        name="lingbot_va_libero", suite="libero", cameras=("agentview", "robot0_eye_in_hand"),
        sizes=((128, 128), (128, 128)), layout="side_by_side", frame_chunk_size=4, action_per_frame=4,
        channels=tuple(range(7)), q01=LIBERO_Q01, q99=LIBERO_Q99,
        sampling=Sampling(video_steps=20, action_steps=50, video_guidance=5.0, action_guidance=1.0, video_shift=5.0,
                          action_shift=0.05, attn_window=30),
    ),
    "lingbot_va_robotwin": LingBotVAInputs(
        name="lingbot_va_robotwin", suite="robotwin", cameras=("head_camera", "left_camera", "right_camera"),
        sizes=((256, 320), (128, 160), (128, 160)), layout="t_shape", frame_chunk_size=2, action_per_frame=16,
        channels=(*range(7), 28, *range(7, 14), 29), q01=ROBOTWIN_Q01, q99=ROBOTWIN_Q99, relative_pose=True,
        sampling=Sampling(video_steps=25, action_steps=50, video_guidance=5.0, action_guidance=1.0, video_shift=5.0,
                          action_shift=1.0, attn_window=72),
    ),
}


def convention(name: str) -> LingBotVAInputs:
    """The named convention (a copy), or a one-line error listing the names."""
    if name not in CONVENTIONS:
        raise ValueError(f"unknown LingBot-VA input convention {name!r}; choose one of {sorted(CONVENTIONS)}")
    return dataclasses.replace(CONVENTIONS[name])


def settings(inputs: LingBotVAInputs) -> dict[str, Any]:
    """Every field of a convention as JSON data (what protocol.json records of it), its name apart."""
    return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(inputs))).items() if k != "name"}
