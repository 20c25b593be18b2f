"""Regenerate tests/fixtures/lingbot_va_train/ with LingBot-VA's own training code (Robbyant/lingbot-va, Apache-2.0).

This script runs OUTSIDE the project and imports their code, never ours. The scratch venv of
scripts/lingbot_va_reference.py (the project venv's libraries without its start-up hooks, plus easydict):

    /root/.pyenv/versions/3.11.7/bin/python3 -m venv --without-pip /tmp/lingbot-venv
    echo /work/main/.venv/lib/python3.11/site-packages \\
        > /tmp/lingbot-venv/lib/python3.11/site-packages/project_venv_libraries.pth
    /work/main/.venv/bin/python -m pip install --target /tmp/lingbot-venv/lib/python3.11/site-packages easydict
    # their tree at the commit below; the store here has it in a fork that carries their history:
    #   fetch github:pkuhxy/lingbot-va, then in its git directory
    #   git archive 58c2ae5bac46bd8114065bea9d7d256eb67c16c3 wan_va | tar -x -C /tmp/lingbot-train
    /tmp/lingbot-venv/bin/python scripts/lingbot_va_train_reference.py --repo /tmp/lingbot-train

Their commit: 58c2ae5 (2026-04-29, "set default attention mode", the newest of their own on main when this was
written; the fork's later commit is not theirs). The files that run (config.json records their hashes):
``wan_va/train.py`` (``Trainer._add_noise``, ``_prepare_input_dict``, ``compute_loss``; ``_train_step``'s sum of the
two terms), ``wan_va/modules/model.py`` (``WanTransformer3DModel.forward_train`` and ``FlexAttnFunc``'s masks),
``wan_va/utils/`` (``FlowMatchScheduler`` with its training table and weights, ``sample_timestep_id``,
``get_mesh_id``, ``data_seq_to_patch``) and ``wan_va/dataset/lerobot_latent_dataset.py``
(``LatentLeRobotDataset._action_post_process``: env actions -> their 30 model channels and mask). Their LIBERO
config is ``va_libero_train_cfg`` (channels 0..6 and the quantiles of ``va_libero_cfg``).

Stubs, only where their code cannot run on a CPU in fp32 or imports what the loss never touches:

* ``FlexAttnFunc``: their training attention is a compiled flex_attention kernel over a block mask, and its
  forward casts q, k, v to bf16. Here ``create_block_mask`` evaluates THEIR mask_mod on every (query, key) pair
  into a dense mask, and the attention is fp32 SDPA under it; a query row their padding leaves without any key
  gives 0, as flex_attention does (it attends to itself, its output zeroed, so gradients stay finite).
* ``forward_train`` casts its four inputs to bf16 (their FSDP keeps bf16 parameters). For an fp32 run those four
  casts are made float32 casts in the temp copy of model.py: the only edit of their text.
* ``flash_attn`` (their model.py imports it at the top; training never calls it), ``wandb`` (logging) and
  ``lerobot`` (the dataset module's imports; ``_action_post_process`` uses none of it): empty modules.

What runs: their tiny transformer of tests/fixtures/lingbot_va/transformer (their WanTransformer3DModel,
seeded random weights, saved by scripts/lingbot_va_reference.py), loaded with ``attn_mode="flex"`` as their
trainer loads it, fp32 on the CPU, in train mode. A batch of 2 clips of 9 latent frames (each 2 x 4 latent
cells: two cameras of 2 x 2 side by side, 2 tokens a frame), prompt embeddings, and LIBERO env actions that
their ``_action_post_process`` turns into model actions and a mask. Per case, their global generator is seeded
and ``_prepare_input_dict`` draws (every draw is recorded), then ``forward_train``, ``compute_loss``, and the
backward of the sum. Case ``a`` trains the actions at shift 1.0 (their LIBERO release's config, c479967) and
``b`` at 0.05 (their latest ``va_libero_cfg``, which their LIBERO train config inherits); each case's seed is
the first from its start whose draws do what the case is for (a: the noised video context, and a window that
cuts the attention; b: the clean context).

It writes io.safetensors (inputs; per case the draws, both loss terms, each parameter's gradient norm; their
training tables) and config.json (sizes, cases, seeds, draws' names, parameter order, their files).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

COMMIT = "58c2ae5bac46bd8114065bea9d7d256eb67c16c3"
THEIR_FILES = ("wan_va/train.py", "wan_va/modules/model.py", "wan_va/utils/scheduler.py", "wan_va/utils/utils.py",
               "wan_va/dataset/lerobot_latent_dataset.py", "wan_va/configs/va_libero_cfg.py",
               "wan_va/configs/va_libero_train_cfg.py")
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
BATCH, FRAMES, LATENT_HW, CHANNELS = 2, 9, (2, 4), 48
PER_FRAME = 4  # actions per latent frame (LIBERO): one pixel frame per action, 4 per latent frame
TEXT_TOKENS, TEXT_DIM, PROMPT_LENGTHS = 512, 16, (7, 12)
EXTRA_ACTIONS = 3  # the episode goes on past the clip: their post-process cuts it
CASES = [
    dict(name="a", video_shift=5.0, action_shift=1.0, first_seed=100, noisy_context=True, window_cuts=True),
    dict(name="b", video_shift=5.0, action_shift=0.05, first_seed=200, noisy_context=False, window_cuts=False),
]
CAST = ".to(torch.bfloat16)"


# ----------------------------------------------------------------------------- their code, outside our tree
def _stub_modules() -> None:
    import importlib.machinery

    import diffusers  # noqa: F401 - it probes optional packages on import: before the stubs exist
    import transformers  # noqa: F401

    def module(name: str, **attrs) -> None:
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        vars(sys.modules[name]).update(attrs)

    def unavailable(*_, **__):
        raise RuntimeError("flash_attn is a stub here: the training path runs flex attention")

    module("flash_attn", flash_attn_func=unavailable)
    module("wandb")
    for name in ("lerobot", "lerobot.datasets", "lerobot.datasets.lerobot_dataset", "lerobot.datasets.utils",
                 "lerobot.datasets.compute_stats", "lerobot.constants"):
        module(name)
    vars(sys.modules["lerobot.datasets.lerobot_dataset"]).update(LeRobotDataset=object, LeRobotDatasetMetadata=object)
    vars(sys.modules["lerobot.datasets.utils"]).update(get_episode_data_index=None)
    vars(sys.modules["lerobot.datasets.compute_stats"]).update(aggregate_stats=None, compute_episode_stats=None)
    vars(sys.modules["lerobot.constants"]).update(HF_LEROBOT_HOME=Path("/nonexistent"))


def _fp32_copy(repo: Path, into: Path) -> Path:
    """Their wan_va/ copied, forward_train's four bf16 casts made float32 casts (see the module doc)."""
    shutil.copytree(repo / "wan_va", into / "wan_va")
    path = into / "wan_va" / "modules" / "model.py"
    text = path.read_text()
    start = text.index("def forward_train")
    end = text.index("\n    def ", start + 1)
    body = text[start:end]
    assert body.count(CAST) == 4, "their forward_train changed: review the fp32 edit"
    path.write_text(text[:start] + body.replace(CAST, ".to(torch.float32)") + text[end:])
    return into / "wan_va"


def _dense_block_mask(mask_mod, _b, _h, q_len, kv_len, device=None, _compile=False):
    """Their mask_mod on every (query, key) pair: (q_len, kv_len) bool."""
    zero = torch.zeros((), dtype=torch.long)
    return mask_mod(zero, zero, torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :])


def _fp32_flex(self, query, key, value, dtype=None):
    """flex_attention's maths in fp32 under the dense mask (query (1, S, n, d) as theirs)."""
    owner = type(self)
    mask = owner.cross_attention_mask if self.is_cross else owner.attention_mask
    empty = ~mask.any(dim=1)
    if not self.is_cross:
        mask = mask | torch.diag(empty)  # a row without keys attends to itself; its output is zeroed below
    else:
        mask = mask.clone()
        mask[empty, 0] = True
    out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                         attn_mask=mask[None, None]).transpose(1, 2)
    return torch.where(empty[None, :, None, None], torch.zeros_like(out), out)


def import_theirs(tree: Path) -> types.SimpleNamespace:
    _stub_modules()
    sys.path.insert(0, str(tree))
    import train
    from configs import VA_CONFIGS
    from dataset.lerobot_latent_dataset import LatentLeRobotDataset
    from modules import model
    from utils import FlowMatchScheduler

    model.FlexAttnFunc.compiled_create_block_mask = _dense_block_mask
    model.FlexAttnFunc.forward = _fp32_flex
    return types.SimpleNamespace(train=train, model=model, dataset=LatentLeRobotDataset, configs=VA_CONFIGS,
                                 scheduler=FlowMatchScheduler)


def trainer(theirs, video_shift: float, action_shift: float):
    """Their Trainer with the attributes its loss reads (its __init__ needs CUDA, FSDP and their dataset)."""
    t = theirs.train.Trainer.__new__(theirs.train.Trainer)
    t.device, t.patch_size, t.gradient_accumulation_steps = torch.device("cpu"), (1, 2, 2), 1
    t.train_scheduler_latent = theirs.scheduler(shift=video_shift, sigma_min=0.0, extra_one_step=True)
    t.train_scheduler_latent.set_timesteps(1000, training=True)
    t.train_scheduler_action = theirs.scheduler(shift=action_shift, sigma_min=0.0, extra_one_step=True)
    t.train_scheduler_action.set_timesteps(1000, training=True)
    return t


# ----------------------------------------------------------------------------- the batch
def make_batch(theirs, generator: torch.Generator) -> tuple[dict, dict]:
    """(their batch, the inputs kept): latents, prompt embeddings zero past each prompt, and env actions through
    their _action_post_process under their LIBERO train config."""
    h, w = LATENT_HW
    latents = torch.randn(BATCH, CHANNELS, FRAMES, h, w, generator=generator)
    text = torch.randn(BATCH, TEXT_TOKENS, TEXT_DIM, generator=generator)
    for row, length in enumerate(PROMPT_LENGTHS):
        text[row, length:] = 0
    steps = (FRAMES - 1) * PER_FRAME + EXTRA_ACTIONS
    config = theirs.configs["libero_train"]
    q01, q99 = (np.asarray(config.norm_stat[k][:7]) for k in ("q01", "q99"))
    spread = torch.rand(BATCH, steps, 7, generator=generator).numpy() * 1.4 - 0.2  # some beyond q01..q99
    env = (q01 + spread * (q99 - q01)).astype(np.float32)
    owner = types.SimpleNamespace(config=config, q01=np.array(config.norm_stat["q01"], dtype="float")[None],
                                  q99=np.array(config.norm_stat["q99"], dtype="float")[None])
    frame_ids = list(range((FRAMES - 1) * 4 + 1))  # one pixel frame per action: 4 per latent frame
    pairs = [theirs.dataset._action_post_process(owner, 0, steps, frame_ids, env[row]) for row in range(BATCH)]
    actions, mask = (torch.stack([p[i] for p in pairs]) for i in (0, 1))
    batch = dict(latents=latents, text_emb=text, actions=actions, actions_mask=mask)
    kept = {"latents": latents, "text": text[:, : max(PROMPT_LENGTHS)].clone(), "env_actions": torch.from_numpy(env),
            "model_actions": actions[..., 0].clone(), "action_mask": mask[..., 0].clone()}
    return batch, kept


@contextlib.contextmanager
def recorded_draws():
    """Every torch.rand, Tensor.normal_ and torch.randint their _prepare_input_dict makes, in order."""
    log: list[tuple[str, torch.Tensor]] = []
    originals = torch.rand, torch.randint, torch.Tensor.normal_

    def rand(*args, **kwargs):
        out = originals[0](*args, **kwargs)
        log.append(("rand", out.clone()))
        return out

    def randint(*args, **kwargs):
        out = originals[1](*args, **kwargs)
        log.append(("randint", out.clone()))
        return out

    def normal_(self, *args, **kwargs):
        out = originals[2](self, *args, **kwargs)
        log.append(("normal", out.clone()))
        return out

    torch.rand, torch.randint, torch.Tensor.normal_ = rand, randint, normal_
    try:
        yield log
    finally:
        torch.rand, torch.randint, torch.Tensor.normal_ = originals


def _prepared(t, batch: dict, seed: int) -> tuple[dict, list]:
    torch.manual_seed(seed)  # their draws come from the global generator
    fresh = {k: v.clone() for k, v in batch.items()}
    with recorded_draws() as log:
        prepared = t._prepare_input_dict(fresh)
    return prepared, log


def _wanted(case: dict, prepared: dict) -> bool:
    noisy = bool(prepared["latent_dict"]["cond_timesteps"].abs().sum() > 0)
    last_block = 2 * ((FRAMES - 1) // prepared["chunk_size"]) + 1
    cuts = prepared["window_size"] < last_block
    return noisy == case["noisy_context"] and (cuts or not case["window_cuts"])


def run_case(theirs, transformer, batch: dict, case: dict) -> tuple[dict, dict]:
    t = trainer(theirs, case["video_shift"], case["action_shift"])
    for seed in itertools.count(case["first_seed"]):
        prepared, log = _prepared(t, batch, seed)
        if _wanted(case, prepared):
            break
    transformer.zero_grad(set_to_none=True)
    video, action = t.compute_loss(prepared, transformer(prepared, train_mode=True))
    (video + action).backward()
    names = sorted(n for n, p in transformer.named_parameters() if p.grad is not None)
    grads = torch.stack([transformer.get_parameter(n).grad.double().norm() for n in names])
    name = case["name"]
    io = {f"{name}.video_loss": video.detach(), f"{name}.action_loss": action.detach(), f"{name}.grad_norms": grads}
    io.update({f"{name}.draw.{i}.{kind}": value for i, (kind, value) in enumerate(log)})
    facts = {**case, "seed": seed, "chunk_size": prepared["chunk_size"], "window_size": prepared["window_size"],
             "draws": [f"{i}.{kind}" for i, (kind, _) in enumerate(log)], "parameters": names}
    return io, facts


def tables(theirs) -> dict[str, torch.Tensor]:
    """Their training tables (timesteps and loss weights) at the shifts the cases use."""
    out = {}
    for shift in sorted({s for c in CASES for s in (c["video_shift"], c["action_shift"])}):
        s = theirs.scheduler(shift=shift, sigma_min=0.0, extra_one_step=True)
        s.set_timesteps(1000, training=True)
        out[f"table.{shift}.timesteps"], out[f"table.{shift}.weights"] = s.timesteps, s.linear_timesteps_weights
    return out


def provenance(repo: Path) -> dict:
    import diffusers

    files = {path: hashlib.sha256((repo / path).read_bytes()).hexdigest() for path in THEIR_FILES}
    return {"their_repository": "Robbyant/lingbot-va", "their_commit": COMMIT, "their_files_sha256": files,
            "torch": torch.__version__, "diffusers": diffusers.__version__, "dtype": "float32", "device": "cpu"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a tree holding their wan_va/ at the commit above")
    parser.add_argument("--out", type=Path, default=FIXTURES / "lingbot_va_train")
    args = parser.parse_args()
    from safetensors.torch import save_file

    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as scratch:
        theirs = import_theirs(_fp32_copy(args.repo, Path(scratch)))
        transformer = theirs.model.WanTransformer3DModel.from_pretrained(
            FIXTURES / "lingbot_va" / "transformer", torch_dtype=torch.float32, attn_mode="flex")
        transformer.train().requires_grad_(True)
        batch, kept = make_batch(theirs, torch.Generator().manual_seed(5))
        io, cases = {f"input.{k}": v for k, v in kept.items()}, []
        for case in CASES:
            case_io, facts = run_case(theirs, transformer, batch, case)
            io.update(case_io)
            cases.append(facts)
        io.update(tables(theirs))
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, str(args.out / "io.safetensors"))
    config = {**provenance(args.repo), "batch": BATCH, "frames": FRAMES, "latent_hw": list(LATENT_HW),
              "channels": CHANNELS, "actions_per_frame": PER_FRAME, "text_tokens": TEXT_TOKENS,
              "prompt_lengths": list(PROMPT_LENGTHS), "weights": "tests/fixtures/lingbot_va/transformer",
              "train_config": "libero_train", "cases": cases}
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {args.out}: {len(io)} tensors; " + "; ".join(
        f"{c['name']}: seed {c['seed']}, chunk {c['chunk_size']}, window {c['window_size']}, video "
        f"{io[c['name'] + '.video_loss'].item():.6f}, action {io[c['name'] + '.action_loss'].item():.6f}"
        for c in cases))


if __name__ == "__main__":
    main()
