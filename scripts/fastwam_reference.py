"""Regenerate tests/fixtures/fastwam/ with FastWAM's own code (yuantianyuan01/FastWAM).

This script runs in a scratch venv OUTSIDE the project and imports FastWAM's code, never ours:

    python3 -m venv /tmp/fastwam-venv
    /tmp/fastwam-venv/bin/pip install torch==2.13.0
    /tmp/fastwam-venv/bin/pip install einops safetensors transformers pillow imageio rich tqdm numpy omegaconf
    # a checkout of their repository (any way you like; e.g. git archive HEAD src configs | tar -x -C /tmp/fastwam)
    /tmp/fastwam-venv/bin/python scripts/fastwam_reference.py --repo /tmp/fastwam --commit <their sha>

It builds their model with seeded random weights on the CPU, at two sizes:

* the tiny size (``fastwam_tiny``: 2 layers, 2 heads of head dim 32; the video expert 64 wide, the action
  DiT 48 wide, so the action expert's width differs from its attention width as in the release), their
  schedules (shift 5), in fp32, and once more in bf16 as their evaluation runs it;
* another size, of no preset (3 layers of 3 heads of 8, their clip of 17 frames at action_video_freq_ratio 2,
  shifts that differ per modality and between training and inference), from THEIR config files
  (configs/model/fastwam.yaml, configs/data/libero_2cam.yaml) with those values changed, and the config.yaml
  their training would write for it (``run_training``: the resolved config). wam_gym must read its
  architecture from its checkpoint and that file alone.

It writes:

    weights.safetensors       the tiny weights in THEIR checkpoint layout: ``mot.<their MoT key>`` and
                              ``proprio_encoder.<key>`` (their release is a torch.save dict with exactly
                              these two state dicts; the test rebuilds that .pt from these numbers)
    other_size.safetensors    the other size's weights, the same layout
    other_size_config.yaml    its config.yaml, as their training writes it
    io.safetensors            inputs and their outputs. Tiny: one joint denoiser call (batch 2), one action-only
                              call, their seeded inference (action-only and joint) after 1, 4 and 10 denoising
                              steps with the noise their seed draws, their bf16 action-only inference (10 steps),
                              their schedules, and their training loss on a padded clip with the noise and
                              timesteps it drew. Other size (``other.``): one joint call, seeded inference.
    config.json               the tiny configuration, schedules, seed, their commit
    full_size.json            their released LIBERO model's key list with shapes and parameter counts,
                              built on the meta device (nothing allocated)

Their VAE is not run: a stub returns the stored first-frame latents and hands the denoised latents
back unchanged, so every number here is their DiT, MoT, schedules and samplers.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

TINY_VIDEO = dict(
    hidden_dim=64, in_dim=6, out_dim=6, ffn_dim=128, text_dim=32, freq_dim=32, eps=1e-6, patch_size=(1, 2, 2),
    num_heads=2, attn_head_dim=32, num_layers=2, has_image_input=False, seperated_timestep=True,
    require_vae_embedding=False, require_clip_embedding=False, fuse_vae_embedding_in_latents=True,
    video_attention_mask_mode="first_frame_causal", action_conditioned=False,
)
TINY_ACTION = dict(hidden_dim=48, action_dim=7, ffn_dim=96, text_dim=32, freq_dim=16, eps=1e-6,
                   num_heads=2, attn_head_dim=32, num_layers=2)
# Their configs/model/fastwam.yaml with LIBERO's data sizes (action 7, proprio 8).
FULL_VIDEO = dict(
    hidden_dim=3072, in_dim=48, out_dim=48, ffn_dim=14336, text_dim=4096, freq_dim=256, eps=1e-6,
    patch_size=(1, 2, 2), num_heads=24, attn_head_dim=128, num_layers=30, has_image_input=False,
    seperated_timestep=True, require_vae_embedding=False, require_clip_embedding=False,
    fuse_vae_embedding_in_latents=True, video_attention_mask_mode="first_frame_causal", action_conditioned=False,
)
FULL_ACTION = dict(hidden_dim=1024, action_dim=7, ffn_dim=4096, text_dim=4096, freq_dim=256, eps=1e-6,
                   num_heads=24, attn_head_dim=128, num_layers=30)
FULL_PROPRIO = 8

PROPRIO_DIM = 8
TEXT_TOKENS = 10  # text positions; the proprio token makes 11
LATENT = (6, 3, 4, 8)  # channels, latent frames (first + 2 future), height, width
ACTION_HORIZON = 8
VIDEO_SHIFT, ACTION_SHIFT = 5.0, 5.0  # their configs' (configs/model/*.yaml) and their FastWAM's defaults
SEED = 1234
STEPS = (1, 4, 10)  # 10: their LIBERO evaluation's (train.yaml eval_num_inference_steps)
BF16_STEPS = 10

# The other size, as changes to their own config files (keys of the resolved config).
OTHER = {
    "model.video_dit_config": dict(hidden_dim=24, in_dim=4, out_dim=4, ffn_dim=40, text_dim=16, freq_dim=8,
                                   num_heads=3, attn_head_dim=8, num_layers=3),
    "model.action_dit_config": dict(hidden_dim=20, ffn_dim=36, text_dim=16, freq_dim=12, num_heads=3, attn_head_dim=8,
                                    num_layers=3),
    "model.video_scheduler": dict(train_shift=3.0, infer_shift=4.0),
    "model.action_scheduler": dict(train_shift=7.0, infer_shift=6.0),
    "model": dict(tokenizer_max_len=7, mot_checkpoint_mixed_attn=False),
    "data.train": dict(num_frames=17, action_video_freq_ratio=2, video_size=[32, 64]),
    "data.train.processor": dict(action_output_dim=5, proprio_output_dim=6),
}
OTHER_CAMERAS = ("observation.images.corner", "observation.images.gripperPOV")  # a wam_gym dataset's keys
OTHER_STEPS = 2


@dataclass
class Size:
    """What the io functions need to know of a model's size."""

    latent: tuple[int, int, int, int]  # channels, latent frames, height, width
    action_horizon: int
    action_dim: int
    proprio_dim: int
    text_tokens: int
    text_dim: int


TINY = Size(LATENT, ACTION_HORIZON, TINY_ACTION["action_dim"], PROPRIO_DIM, TEXT_TOKENS, TINY_VIDEO["text_dim"])


def _import_theirs(repo: Path):
    sys.path.insert(0, str(repo / "src"))
    from fastwam.models.wan22.action_dit import ActionDiT
    from fastwam.models.wan22.fastwam import FastWAM
    from fastwam.models.wan22.mot import MoT
    from fastwam.models.wan22.wan_video_dit import WanVideoDiT

    return WanVideoDiT, ActionDiT, MoT, FastWAM


class _StubVAE(torch.nn.Module):
    """What FastWAM reads of its VAE, without one: the test feeds latents directly."""

    temporal_downsample_factor = 4
    upsampling_factor = 16

    def __init__(self, z_dim: int):
        super().__init__()
        self.model = types.SimpleNamespace(z_dim=z_dim)


def _latent_io_model(FastWAM):
    class LatentIO(FastWAM):
        """Their FastWAM with the VAE taken out: encoding returns the given first-frame latents (in the
        model's dtype, as their VAE would), decoding returns the latents unchanged. Every other line that
        runs is theirs."""

        first_frame: torch.Tensor

        def _encode_input_image_latents_tensor(self, input_image, **_):
            return self.first_frame.to(self.torch_dtype)

        def _decode_latents(self, latents, **_):
            return latents.detach().clone()

        def _encode_video_latents(self, video_tensor, **_):
            return self.clip_latents.clone()

    return LatentIO


def _perturb(module: torch.nn.Module, generator: torch.Generator) -> None:
    # Norm weights start at one and biases at zero; moving them makes every weight show in the
    # outputs, so a key mapped onto the wrong parameter cannot pass unnoticed.
    with torch.no_grad():
        for param in module.parameters():
            if param.ndim == 1:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


def build(repo: Path, video_config: dict, action_config: dict, proprio_dim: int, shifts: dict, z_dim: int):
    """Their FastWAM (VAE stubbed) with seeded random weights, in fp32 on the CPU."""
    WanVideoDiT, ActionDiT, MoT, FastWAM = _import_theirs(repo)
    torch.manual_seed(0)
    video, action = WanVideoDiT(**video_config), ActionDiT(**action_config)
    mot = MoT(mixtures={"video": video, "action": action}, mot_checkpoint_mixed_attn=False)
    model = _latent_io_model(FastWAM)(
        video_expert=video, action_expert=action, mot=mot, vae=_StubVAE(z_dim), text_dim=video_config["text_dim"],
        proprio_dim=proprio_dim, device="cpu", torch_dtype=torch.float32, **shifts,
    )
    generator = torch.Generator().manual_seed(1)
    _perturb(model.mot, generator)
    _perturb(model.proprio_encoder, generator)
    return model.eval()


def build_tiny(repo: Path):
    shifts = dict(video_train_shift=VIDEO_SHIFT, video_infer_shift=VIDEO_SHIFT, action_train_shift=ACTION_SHIFT,
                  action_infer_shift=ACTION_SHIFT)
    return build(repo, TINY_VIDEO, TINY_ACTION, PROPRIO_DIM, shifts, LATENT[0])


def _text(size: Size, batch: int, lengths: list[int], generator: torch.Generator) -> torch.Tensor:
    # What their encode_prompt hands on: padding positions zeroed (the mask is then all ones).
    text = torch.randn(batch, size.text_tokens, size.text_dim, generator=generator)
    for row, length in enumerate(lengths):
        text[row, length:] = 0
    return text


def denoiser_calls(model, size: Size, generator: torch.Generator, prefix: str = "") -> dict[str, torch.Tensor]:
    """One joint call and one action-only call of their denoiser, batch 2, per-row timesteps."""
    io = {
        "call.latents": torch.randn(2, *size.latent, generator=generator),
        "call.timestep_video": torch.tensor([700.5, 250.25]),
        "call.actions": torch.randn(2, size.action_horizon, size.action_dim, generator=generator),
        "call.timestep_action": torch.tensor([900.0, 100.0]),
        "call.text": _text(size, 2, [6, size.text_tokens - 1], generator),
        "call.proprio": torch.randn(2, size.proprio_dim, generator=generator),
    }
    context, mask = model._append_proprio_to_context(
        io["call.text"], torch.ones(2, size.text_tokens, dtype=torch.bool), io["call.proprio"]
    )
    with torch.no_grad():
        video_v, action_v = model._predict_joint_noise(
            latents_video=io["call.latents"], latents_action=io["call.actions"],
            timestep_video=io["call.timestep_video"], timestep_action=io["call.timestep_action"],
            context=context, context_mask=mask, fuse_vae_embedding_in_latents=True,
        )
        action_only_v = model._predict_action_noise(
            first_frame_latents=io["call.latents"][:, :, :1], latents_action=io["call.actions"],
            timestep_action=io["call.timestep_action"], context=context, context_mask=mask,
            fuse_vae_embedding_in_latents=True,
        )
    io.update({"call.context": context, "call.video_velocity": video_v, "call.action_velocity": action_v,
               "call.action_only_velocity": action_only_v})
    return {prefix + k: v for k, v in io.items()}


def _infer_inputs(model, size: Size, generator: torch.Generator) -> tuple[dict, dict]:
    """The inputs of one seeded inference, and the keyword arguments their infer_* take for them."""
    c, f, h, w = size.latent
    io = {
        "infer.first_frame": torch.randn(1, c, 1, h, w, generator=generator),
        "infer.text": _text(size, 1, [size.text_tokens - 3], generator),
        "infer.proprio": torch.randn(1, size.proprio_dim, generator=generator),
    }
    model.first_frame = io["infer.first_frame"]
    image = torch.zeros(1, 3, h * _StubVAE.upsampling_factor, w * _StubVAE.upsampling_factor)
    common = dict(prompt=None, input_image=image, action_horizon=size.action_horizon, proprio=io["infer.proprio"][0],
                  context=io["infer.text"], context_mask=torch.ones(1, size.text_tokens, dtype=torch.bool), seed=SEED)
    return io, common


def inference(model, size: Size, generator: torch.Generator, steps=STEPS, prefix: str = "") -> dict[str, torch.Tensor]:
    """Their seeded inference, action-only and joint, after each of ``steps`` denoising steps."""
    io, common = _infer_inputs(model, size, generator)
    # The noise their seed draws (fastwam.py: one generator per modality, each seeded with `seed`).
    io["infer.video_noise"] = torch.randn(1, *size.latent, generator=torch.Generator().manual_seed(SEED))
    io["infer.action_noise"] = torch.randn(
        1, size.action_horizon, size.action_dim, generator=torch.Generator().manual_seed(SEED)
    )
    frames = 1 + (size.latent[1] - 1) * _StubVAE.temporal_downsample_factor
    for n in steps:
        io[f"infer.action_only.{n}"] = model.infer_action(num_inference_steps=n, **common)["action"]
        joint = model.infer_joint(num_video_frames=frames, num_inference_steps=n, **common)
        io[f"infer.joint.action.{n}"], io[f"infer.joint.video.{n}"] = joint["action"], joint["video"]
    return {prefix + k: v for k, v in io.items()}


def bf16_inference(model, io: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Their action-only inference with the model in bf16, as their evaluation runs it (mixed_precision bf16:
    weights, noise, timesteps and Euler steps in bf16), on the tiny inputs ``io`` holds; ``model`` stays fp32."""
    model = copy.deepcopy(model).to(torch.bfloat16)
    model.torch_dtype = torch.bfloat16
    model.first_frame = io["infer.first_frame"]
    _, _, h, w = LATENT
    image = torch.zeros(1, 3, h * _StubVAE.upsampling_factor, w * _StubVAE.upsampling_factor)
    action = model.infer_action(
        prompt=None, input_image=image, action_horizon=ACTION_HORIZON, proprio=io["infer.proprio"][0],
        context=io["infer.text"], context_mask=torch.ones(1, TEXT_TOKENS, dtype=torch.bool), seed=SEED,
        num_inference_steps=BF16_STEPS,
    )["action"]
    return {f"infer.bf16.action_only.{BF16_STEPS}": action}


def training_loss(model, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Their training loss on a clip (batch 2, some actions and frames padded) and the random draws it
    makes from the global generator, replayed in the same order: video noise, video timesteps, action
    noise, action timesteps."""
    c, f, h, w = LATENT
    frames = 1 + (f - 1) * _StubVAE.temporal_downsample_factor
    io = {
        "loss.latents": torch.randn(2, c, f, h, w, generator=generator),
        "loss.actions": torch.randn(2, ACTION_HORIZON, TINY_ACTION["action_dim"], generator=generator),
        "loss.proprio": torch.randn(2, frames, PROPRIO_DIM, generator=generator),
        "loss.text": _text(TINY, 2, [4, 10], generator),
        "loss.action_is_pad": torch.arange(ACTION_HORIZON).expand(2, -1) >= torch.tensor([[ACTION_HORIZON], [5]]),
        "loss.image_is_pad": torch.arange(frames).expand(2, -1) >= torch.tensor([[frames], [5]]),
    }
    model.clip_latents = io["loss.latents"]
    sample = {
        "video": torch.zeros(2, 3, frames, h * _StubVAE.upsampling_factor, w * _StubVAE.upsampling_factor),
        "context": io["loss.text"], "context_mask": torch.ones(2, TEXT_TOKENS, dtype=torch.bool),
        "proprio": io["loss.proprio"], "action": io["loss.actions"],
        "action_is_pad": io["loss.action_is_pad"], "image_is_pad": io["loss.image_is_pad"],
    }
    seed = SEED + 1
    torch.manual_seed(seed)
    with torch.no_grad():
        total, parts = model.train().training_loss(sample)
    model.eval()
    torch.manual_seed(seed)  # the same draws, in training_loss's order (randn_like, rand, randn_like, rand)
    io["loss.video_noise"] = torch.randn(2, c, f, h, w)
    io["loss.video_timestep"] = model.train_video_scheduler.sample_training_t(2, torch.device("cpu"), torch.float32)
    io["loss.action_noise"] = torch.randn(2, ACTION_HORIZON, TINY_ACTION["action_dim"])
    io["loss.action_timestep"] = model.train_action_scheduler.sample_training_t(2, torch.device("cpu"), torch.float32)
    io.update({"loss.total": total.reshape(1), "loss.video": torch.tensor([parts["loss_video"]]),
               "loss.action": torch.tensor([parts["loss_action"]])})
    return io


def schedules(model) -> dict[str, torch.Tensor]:
    """Their inference grids (timesteps, deltas) and training-loss weights, per modality."""
    out = {}
    for name, train, infer in (("video", model.train_video_scheduler, model.infer_video_scheduler),
                               ("action", model.train_action_scheduler, model.infer_action_scheduler)):
        for steps in STEPS:
            t, d = infer.build_inference_schedule(steps, torch.device("cpu"), torch.float32)
            out[f"schedule.{name}.timesteps.{steps}"], out[f"schedule.{name}.deltas.{steps}"] = t, d
        grid = torch.linspace(0.0, 1000.0, 21)
        out["schedule.training_timesteps"] = grid
        out[f"schedule.{name}.training_weight"] = train.training_weight(grid)
    return out


def their_run_config(repo: Path) -> dict:
    """The config.yaml their training writes (``run_training``: OmegaConf.save of the resolved config) for a
    run of their configs/model/fastwam.yaml and configs/data/libero_2cam.yaml with :data:`OTHER` changed."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({
        "model": OmegaConf.load(repo / "configs/model/fastwam.yaml"),
        "data": OmegaConf.load(repo / "configs/data/libero_2cam.yaml"),
        "mixed_precision": "no", "seed": 42,
    })
    for where, changes in OTHER.items():
        for key, value in changes.items():
            OmegaConf.update(cfg, f"{where}.{key}", value, merge=False)
    images = cfg.data.train.shape_meta.images
    for image, key in zip(images, OTHER_CAMERAS):
        image.key, image.shape = key, [3, 32, 32]
    return OmegaConf.to_container(cfg, resolve=True)


def other_size(repo: Path, generator: torch.Generator) -> tuple[dict, dict, dict]:
    """(weights, io, their config.yaml) of the other size, built from their config as their create_fastwam would."""
    run = their_run_config(repo)
    model_cfg, train = run["model"], run["data"]["train"]
    drop = {"use_gradient_checkpointing"}
    video = {k: v for k, v in model_cfg["video_dit_config"].items() if k not in drop}
    action = {k: v for k, v in model_cfg["action_dit_config"].items() if k not in drop}
    shifts = {f"{modality}_{key}": model_cfg[f"{modality}_scheduler"][key] for modality in ("video", "action")
              for key in ("train_shift", "infer_shift")}
    model = build(repo, video, action, model_cfg["proprio_dim"], shifts, video["in_dim"])
    horizon = train["num_frames"] - 1
    pixel_frames = horizon // train["action_video_freq_ratio"] + 1
    h, w = (s // _StubVAE.upsampling_factor for s in train["video_size"])
    size = Size((video["in_dim"], (pixel_frames - 1) // 4 + 1, h, w), horizon, action["action_dim"],
                model_cfg["proprio_dim"], model_cfg["tokenizer_max_len"], video["text_dim"])
    io = {**denoiser_calls(model, size, generator, "other."),
          **inference(model, size, generator, (OTHER_STEPS,), "other.")}
    return _their_layout(model), io, run


def _their_layout(model) -> dict[str, torch.Tensor]:
    weights = {f"mot.{k}": v for k, v in model.mot.state_dict().items()}
    weights.update({f"proprio_encoder.{k}": v for k, v in model.proprio_encoder.state_dict().items()})
    return {k: v.contiguous() for k, v in weights.items()}


def full_size(repo: Path) -> dict:
    """Their released LIBERO model's checkpoint keys and shapes, built on the meta device."""
    WanVideoDiT, ActionDiT, MoT, _ = _import_theirs(repo)
    with torch.device("meta"):
        mot = MoT(mixtures={"video": WanVideoDiT(**FULL_VIDEO), "action": ActionDiT(**FULL_ACTION)},
                  mot_checkpoint_mixed_attn=True)
        proprio = torch.nn.Linear(FULL_PROPRIO, FULL_VIDEO["text_dim"])
    groups = {"mot": mot, "proprio_encoder": proprio}
    return {
        "keys": {group: {k: list(v.shape) for k, v in m.state_dict().items()} for group, m in groups.items()},
        "parameters": {group: sum(p.numel() for p in m.parameters()) for group, m in groups.items()},
        "video_dit_config": {**FULL_VIDEO, "patch_size": list(FULL_VIDEO["patch_size"])},
        "action_dit_config": FULL_ACTION,
        "proprio_dim": FULL_PROPRIO,
    }


def _tiny_config(commit: str) -> dict:
    return {
        "their_repository": "yuantianyuan01/FastWAM", "their_commit": commit, "torch": torch.__version__,
        "dtype": "float32", "device": "cpu",
        "video_dit_config": {**TINY_VIDEO, "patch_size": list(TINY_VIDEO["patch_size"])},
        "action_dit_config": TINY_ACTION, "proprio_dim": PROPRIO_DIM, "text_tokens": TEXT_TOKENS,
        "latent_shape": list(LATENT), "action_horizon": ACTION_HORIZON,
        "video_shift": VIDEO_SHIFT, "action_shift": ACTION_SHIFT, "num_train_timesteps": 1000,
        "seed": SEED, "steps": list(STEPS), "bf16_steps": BF16_STEPS, "other_size_steps": OTHER_STEPS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="a checkout of yuantianyuan01/FastWAM (src/, configs/)")
    parser.add_argument("--commit", default="unknown", help="their commit, recorded in config.json")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/fastwam")
    args = parser.parse_args()
    from omegaconf import OmegaConf
    from safetensors.torch import save_file

    torch.use_deterministic_algorithms(True)
    model = build_tiny(args.repo)
    generator = torch.Generator().manual_seed(2)
    io = {**denoiser_calls(model, TINY, generator), **inference(model, TINY, generator), **schedules(model),
          **training_loss(model, generator)}
    io.update(bf16_inference(model, io))
    other_weights, other_io, run = other_size(args.repo, generator)
    io.update(other_io)

    args.out.mkdir(parents=True, exist_ok=True)
    save_file(_their_layout(model), str(args.out / "weights.safetensors"))
    save_file(other_weights, str(args.out / "other_size.safetensors"))
    OmegaConf.save(run, args.out / "other_size_config.yaml")
    save_file({k: v.float().contiguous() for k, v in io.items()}, str(args.out / "io.safetensors"))
    (args.out / "config.json").write_text(json.dumps(_tiny_config(args.commit), indent=2) + "\n")
    (args.out / "full_size.json").write_text(json.dumps(full_size(args.repo), indent=1) + "\n")
    print(f"wrote {args.out}: {len(io)} tensors of inputs and outputs")


if __name__ == "__main__":
    main()
