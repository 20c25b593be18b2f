"""A success detector: frames -> "is the task solved?", learnt from the simulator's own labels.

Inside a world model there is no simulator to say whether an episode succeeded; the imagined
frames are all there is. This small CNN judges them. It learns from frames the simulator labels
itself (``info["is_success"]`` of the step that produced each frame), rendered with the cameras
and image size of the world model's checkpoint: the scripted expert at several action-noise
levels and a random policy, run past their first success (``terminate_on_success=False``) so
solved scenes are plentiful. :func:`collect` also keeps each episode's executed actions and
labels, so the world model can replay them (``python -m wam_gym.world_model`` trains the
detector on the frames it imagines for them as well). Whole episodes are held out; their
accuracy is the detector's reported accuracy.

The folder holds ``detector.json`` (its config and held-out accuracy) and ``model.safetensors``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from agents.wam.finite_weights import check_finite

logger = logging.getLogger(__name__)

CONFIG_FILE, WEIGHTS_FILE = "detector.json", "model.safetensors"


@dataclass
class DetectorConfig:
    """What the detector sees, the data it learns from, and how long it trains."""

    tasks: list[str] = field(default_factory=list)  # env ids whose expert (Meta-World's scripted one) solves them
    cameras: list[str] = field(default_factory=lambda: ["corner", "gripperPOV"])  # tiled side by side, in order
    image_size: list[int] = field(default_factory=lambda: [48, 48])  # (height, width) of each camera
    episodes: int = 8  # per task and behaviour
    noise: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])  # the expert's executed-action noise levels
    max_steps: int = 150  # per episode (past the first success)
    frame_every: int = 2  # keep every n-th frame
    held_out: float = 0.25  # fraction of each task's episodes held out (whole episodes)
    train_steps: int = 800  # optimizer steps
    batch_size: int = 64  # frames per step, half solved and half not
    lr: float = 1e-3  # AdamW's learning rate
    seed: int = 0  # of the episodes' seeds, the sampling of batches and the weights


class SuccessDetector(nn.Module):
    """uint8 frames (B, H, W, 3), cameras side by side -> the logit that the task is solved."""

    def __init__(self, config: DetectorConfig):
        super().__init__()
        self.config = config

        def block(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.GroupNorm(8, c_out), nn.SiLU())

        self.net = nn.Sequential(block(3, 32), block(32, 64), block(64, 64), block(64, 128),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 1))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        return self.net(x).squeeze(1)

    @torch.no_grad()
    def probability(self, frames: np.ndarray) -> np.ndarray:
        """P(solved) of each frame (B, H, W, 3) uint8."""
        self.eval()
        return torch.sigmoid(self(torch.from_numpy(np.ascontiguousarray(frames)))).numpy()

    def save(self, folder: str | Path, metrics: dict) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, folder / WEIGHTS_FILE)
        (folder / CONFIG_FILE).write_text(json.dumps({"config": asdict(self.config), "metrics": metrics}, indent=1))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> SuccessDetector:
        folder = Path(folder)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"{folder} is not a success detector (no {CONFIG_FILE} and {WEIGHTS_FILE}): train "
                                    "one with python -m wam_gym.world_model --detector DIR (it trains one where none is)")
        detector = cls(DetectorConfig(**json.loads((folder / CONFIG_FILE).read_text())["config"]))
        weights = load_file(folder / WEIGHTS_FILE)
        check_finite(weights, folder / WEIGHTS_FILE, "train the detector again (python -m wam_gym.world_model --detector "
                     "a new folder)")
        detector.load_state_dict(weights)
        return detector.eval()


# ----------------------------------------------------------------- the labelled frames
@dataclass
class Frames:
    pixels: np.ndarray  # (N, H, W * cameras, 3) uint8
    solved: np.ndarray  # (N,) bool: the simulator's is_success for the step that produced the frame
    episode: np.ndarray  # (N,) int: which episode (held-out splits are by episode)
    group: np.ndarray  # (N,) int: which task and behaviour (each holds out its last episodes)

    @staticmethod
    def join(parts: list[Frames]) -> Frames:
        return Frames(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("pixels", "solved", "episode",
                                                                                      "group")))


@dataclass
class Replay:
    """One collected episode, to be replayed elsewhere (in a world model)."""

    env_id: str  # the task it ran
    seed: int  # its reset's seed
    actions: np.ndarray  # (T, A): the actions executed, noise included
    solved: np.ndarray  # (T,) bool: is_success after each of them
    episode: int  # its index among the collected episodes (Frames.episode)
    group: int  # its task and behaviour (Frames.group)


def collect(config: DetectorConfig) -> tuple[Frames, list[Replay]]:
    """Every ``frame_every``-th frame of the expert (each noise level) and a random policy, per task;
    and every episode's executed actions and labels."""
    import envs
    from agents import make_agent
    from envs.protocol import IS_SUCCESS, PIXELS
    from training.collect import perturbed
    from wam_gym.utils.video import tile

    pixels, solved, episodes, groups, replays = [], [], [], [], []
    episode = group = 0
    behaviours = [("expert", sigma) for sigma in config.noise] + [("random", 0.0)]
    for t, env_id in enumerate(config.tasks):
        env = envs.make(env_id, cameras=config.cameras, image_size=tuple(config.image_size), lazy_pixels=True,
                        terminate_on_success=False, max_episode_steps=config.max_steps)
        for agent_name, sigma in behaviours:
            for k in range(config.episodes):
                seed = config.seed + 1000 * t + k
                agent, noise = make_agent(agent_name, action_space=env.action_space, seed=seed), np.random.default_rng(seed)
                obs, info = env.reset(seed=seed)
                executed, labels = [], []
                for step in range(config.max_steps):
                    if step % config.frame_every == 0:
                        pixels.append(tile([obs[PIXELS][c] for c in config.cameras]))
                        solved.append(bool(info.get(IS_SUCCESS, False)))
                        episodes.append(episode)
                        groups.append(group)
                    action = agent.act(obs)
                    if sigma:  # executed with noise, recorded with it
                        action = perturbed(action, noise, sigma, env.action_space)
                    env.unwrapped.pixels_requested = (step + 1) % config.frame_every == 0  # only kept frames render
                    obs, _, terminated, truncated, info = env.step(action)
                    executed.append(action)
                    labels.append(bool(info.get(IS_SUCCESS, False)))
                    if terminated or truncated:
                        break
                replays.append(Replay(env_id, seed, np.stack(executed), np.array(labels), episode, group))
                episode += 1
            group += 1
        env.close()
    return Frames(np.stack(pixels), np.array(solved), np.array(episodes), np.array(groups)), replays


def as_the_world_model_draws(frames: np.ndarray, checkpoint: str | Path, batch: int = 64) -> np.ndarray:
    """Each frame through the checkpoint's VAE (encode, decode): the blur of imagined frames."""
    from agents.wam import load_pretrained

    model = load_pretrained(checkpoint).eval()
    out = []
    for start in range(0, len(frames), batch):
        x = torch.from_numpy(frames[start:start + batch]).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        video = model.decode_latents(model.encode_video(x[:, :, None]))[:, :, 0]
        out.append(((video.permute(0, 2, 3, 1) + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy())
    return np.concatenate(out)


# ----------------------------------------------------------------- training
def split(frames: Frames, held_out: float) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, held out): the last ``held_out`` of each task's and behaviour's episodes are held out."""
    test = np.zeros(len(frames.solved), bool)
    for g in np.unique(frames.group):
        episodes = np.unique(frames.episode[frames.group == g])
        held = min(len(episodes) - 1, max(1, int(round(held_out * len(episodes)))))  # one at least, never all
        kept = episodes[len(episodes) - held:]
        test |= np.isin(frames.episode, kept)
    return ~test, test


def train(config: DetectorConfig, frames: Frames) -> tuple[SuccessDetector, dict]:
    """Fit on the training episodes (solved and unsolved frames drawn equally often); score the held-out ones."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    train_rows, test_rows = split(frames, config.held_out)
    positives = np.flatnonzero(train_rows & frames.solved)
    negatives = np.flatnonzero(train_rows & ~frames.solved)
    if len(positives) == 0 or len(negatives) == 0:
        raise ValueError(f"the training frames hold {len(positives)} solved and {len(negatives)} unsolved frames: "
                         "both are needed (more episodes: --detector-episodes, or tasks the expert solves)")
    detector = SuccessDetector(config)
    optimizer = torch.optim.AdamW(detector.parameters(), lr=config.lr, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    half = config.batch_size // 2
    detector.train()
    for step in range(config.train_steps):
        rows = np.concatenate([rng.choice(positives, half), rng.choice(negatives, half)])
        x = torch.from_numpy(_augment(frames.pixels[rows], rng))
        y = torch.from_numpy(frames.solved[rows].astype(np.float32))
        loss = loss_fn(detector(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 250 == 0:
            logger.info("success detector step %d: loss %.4f", step, loss.item())
    return detector, evaluate(detector, frames, test_rows)


def _augment(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness jitter and pixel noise: imagined frames are neither exact nor clean."""
    x = pixels.astype(np.float32) * rng.uniform(0.85, 1.15, (len(pixels), 1, 1, 1))
    x += rng.normal(0.0, 6.0, x.shape)
    return np.clip(x, 0, 255).astype(np.uint8)


def evaluate(detector: SuccessDetector, frames: Frames, rows: np.ndarray) -> dict:
    """Accuracy and balanced accuracy of ``rows`` (threshold 0.5)."""
    pixels = frames.pixels[rows]
    predicted = np.concatenate([detector.probability(pixels[i:i + 256]) > 0.5 for i in range(0, len(pixels), 256)])
    truth = frames.solved[rows]
    recall = [float(np.mean(predicted[truth == label] == label)) for label in (True, False) if np.any(truth == label)]
    return {"held_out_accuracy": float(np.mean(predicted == truth)), "held_out_balanced_accuracy": float(np.mean(recall)),
            "held_out_frames": int(rows.sum()), "held_out_solved": int(truth.sum()),
            "train_frames": int((~rows).sum())}
