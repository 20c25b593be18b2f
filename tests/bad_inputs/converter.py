"""FastWAM checkpoints held wrong: the converter's every subcommand against every bad file, and loads of bad weights.

scripts/convert_fastwam_checkpoint.py runs in this process (``main(argv)``): each case asserts it ends in one
``error: ...`` line on stderr with exit status 1 or 2 and no traceback, and that the folder it ran in holds
afterwards exactly what it held before (nothing written, no temporary file left). The FastWAM is the parity
fixture's tiny one (tests/fixtures/fastwam/weights.safetensors: their layout, 7-d actions, 8-d state).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agents.wam.finite_weights import NonFiniteWeightsError
from tests.bad_inputs import Case, Ctx
from wam_gym.utils.publish import DestinationExists

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fastwam" / "weights.safetensors"
TINY = ("--inputs", "wam_gym", "--preset", "fastwam_tiny")
TO_OURS = "to-ours {pt} {out} --inputs wam_gym --preset fastwam_tiny"  # {out}: a new path
TO_OURS_INTO = "to-ours {pt} {dir} --inputs wam_gym --preset fastwam_tiny"
HEAD = "mot.mixtures.action.head.weight"
NORM_K = "mot.mixtures.action.blocks.1.cross_attn.norm_k.weight"
STATS_FIX = r"pass --stats with their dataset_stats\.json of this checkpoint \(it ships beside their \.pt\)$"


class ConverterRefused(Exception):
    """The converter's one-line refusal: its last stderr line, without ``error: ``."""


@functools.cache
def converter():
    from tests.conftest import load_script

    return load_script("convert_fastwam_checkpoint")


def convert(command: str, **inputs: Callable[[Ctx], Path]) -> Callable[[Ctx], object]:
    """``convert_fastwam_checkpoint.py <command>``: each ``{name}`` is the path ``inputs[name](ctx)`` makes in the
    case's folder; ``{out}`` is a new path there."""
    def trigger(ctx: Ctx):
        paths = {name: make(ctx) for name, make in inputs.items()}
        argv = [part.format(out=ctx.tmp / "out", **paths) for part in command.split()]
        before = _tree(ctx.tmp)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = converter().main(argv)
            except SystemExit as exc:  # argparse's usage errors
                status = exc.code
        assert _tree(ctx.tmp) == before, f"a refused conversion changed {ctx.tmp}: {_tree(ctx.tmp) ^ before}"
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert "Traceback" not in err.getvalue() and status in (1, 2), (status, err.getvalue()[-2000:])
        assert [line for line in lines if "error:" in line] == [lines[-1]], err.getvalue()[-2000:]
        raise ConverterRefused(lines[-1].split("error: ", 1)[1])

    return trigger


def _tree(root: Path) -> set[tuple[str, int]]:
    """Every path under ``root`` (hidden ones too) with its size: what a refusal must leave as it was."""
    return {(str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")}


# ----------------------------------------------------------------------------- their files
def _weights() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE))


def _their_file(ctx: Ctx, payload, name: str = "their.pt") -> Path:
    torch.save(payload, ctx.tmp / name)
    return ctx.tmp / name


def _grouped(flat: dict[str, torch.Tensor]) -> dict:
    groups = {"mot": {}, "proprio_encoder": {}}
    for key, value in flat.items():
        group, _, inner = key.partition(".")
        groups[group][inner] = value
    return {**groups, "step": 0}


def release(ctx: Ctx) -> Path:
    """A tiny FastWAM of theirs, sound."""
    return _their_file(ctx, _grouped(_weights()))


def edited(change: Callable[[dict], object]) -> Callable[[Ctx], Path]:
    def make(ctx: Ctx) -> Path:
        flat = _weights()
        change(flat)
        return _their_file(ctx, _grouped(flat))

    return make


def missing_file(ctx: Ctx) -> Path:
    """A path where nothing is."""
    return ctx.tmp / "nothing.pt"


def empty_file(ctx: Ctx) -> Path:
    """An empty file (an interrupted download)."""
    (ctx.tmp / "empty.pt").write_bytes(b"")
    return ctx.tmp / "empty.pt"


def truncated_file(ctx: Ctx) -> Path:
    """Their file cut short."""
    whole = release(ctx).read_bytes()
    (ctx.tmp / "their.pt").write_bytes(whole[: len(whole) // 2])
    return ctx.tmp / "their.pt"


def random_bytes(ctx: Ctx) -> Path:
    """4 kB of random bytes."""
    (ctx.tmp / "random.pt").write_bytes(os.urandom(4096))
    return ctx.tmp / "random.pt"


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def code_pickle(ctx: Ctx) -> Path:
    """A file that runs code when unpickled (refused by weights_only, never run)."""
    return _their_file(ctx, {**_grouped(_weights()), "payload": _RunsCode(ctx.tmp / "ran")})


def dit_only(ctx: Ctx) -> Path:
    """A legacy file holding a 'dit' entry and no 'mot'."""
    return _their_file(ctx, {"dit": {"x": torch.zeros(1)}})


def mot_a_tensor(ctx: Ctx) -> Path:
    """Its 'mot' entry a tensor, not a state dict."""
    return _their_file(ctx, {"mot": torch.zeros(3)})


def mot_of_numbers(ctx: Ctx) -> Path:
    """Its 'mot' state dict holding a number where a tensor belongs."""
    return _their_file(ctx, {"mot": {"patch_embedding.weight": 3}})


def int_weights(ctx: Ctx) -> Path:
    """Every weight cast to int32."""
    return _their_file(ctx, _grouped({k: (v * 100).to(torch.int32) for k, v in _weights().items()}))


def other_architecture(ctx: Ctx) -> Path:
    """A diffusers Wan transformer's state dict under 'mot' (another model's keys)."""
    return _their_file(ctx, {"mot": {"patch_embedding.weight": torch.zeros(8, 4, 1, 2, 2),
                                     "blocks.0.attn1.to_q.weight": torch.zeros(8, 8)}})


def _nan_head(flat: dict) -> None:
    flat[HEAD] = flat[HEAD].clone()
    flat[HEAD][0, 0] = float("nan")


def _drop_norm_k(flat: dict) -> None:
    del flat[NORM_K]


def _add_image_key(flat: dict) -> None:
    flat["mot.mixtures.video.blocks.0.cross_attn.k_img.weight"] = torch.zeros(64, 64)


def _shrink_norm_k(flat: dict) -> None:
    flat[NORM_K] = torch.zeros(3)


def a_folder(ctx: Ctx) -> Path:
    """A folder holding notes.txt, no checkpoint."""
    (ctx.tmp / "folder").mkdir()
    (ctx.tmp / "folder" / "notes.txt").write_text("mine")
    return ctx.tmp / "folder"


def release_in_folder(ctx: Ctx) -> Path:
    """The folder holding their .pt."""
    release(ctx)
    return ctx.tmp


def a_file(ctx: Ctx) -> Path:
    """A file of the user's."""
    (ctx.tmp / "notes.txt").write_text("mine")
    return ctx.tmp / "notes.txt"


# ----------------------------------------------------------------------------- our directories
def _converted(ctx: Ctx) -> Path:
    """The tiny release converted once per test module (kept outside the cases' folders)."""
    from agents.wam.fastwam.checkpoint import convert_their_checkpoint
    from agents.wam.fastwam.config import preset

    cached = ctx.shared.root / "fastwam_ours"
    if not cached.is_dir():
        source = _their_file(ctx, _grouped(_weights()), ".source.pt")
        convert_their_checkpoint(source, cached, preset("fastwam_tiny"))
        source.unlink()
    return cached


def our_checkpoint(ctx: Ctx) -> Path:
    """A FastWAM checkpoint directory (to-ours wrote it)."""
    return Path(shutil.copytree(_converted(ctx), ctx.tmp / "ours"))


def our_nan_checkpoint(ctx: Ctx) -> Path:
    """Our FastWAM directory whose action expert holds an inf."""
    ours = our_checkpoint(ctx)
    weights = ours / "action_expert" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(weights))
    tensors["action_in.bias"][0] = float("inf")
    save_file(tensors, str(weights))
    return ours


def mot_checkpoint(ctx: Ctx) -> Path:
    """A directory holding a MoT's wam_config.json (not a FastWAM)."""
    (ctx.tmp / "mot").mkdir()
    (ctx.tmp / "mot" / "wam_config.json").write_text(json.dumps({"preset": "tiny"}))
    return ctx.tmp / "mot"


# ----------------------------------------------------------------------------- statistics
def _unit(state: int = 8, action: int = 7, low: float = -1.0, high: float = 1.0) -> dict:
    return {group: {"default": {"global_min": [low] * dim, "global_max": [high] * dim}}
            for group, dim in (("state", state), ("action", action))}


def stats(content: object) -> Callable[[Ctx], Path]:
    def make(ctx: Ctx) -> Path:
        path = ctx.tmp / "stats.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    return make


def two_stats_beside(ctx: Ctx) -> Path:
    """Their .pt with both their_dataset_stats.json and dataset_stats.json beside it."""
    for name in ("their_dataset_stats.json", "dataset_stats.json"):
        (ctx.tmp / name).write_text(json.dumps(_unit()))
    return release(ctx)


def bad_yaml(ctx: Ctx) -> Path:
    """A config.yaml that is not YAML."""
    (ctx.tmp / "config.yaml").write_text("model: [\n")
    return ctx.tmp / "config.yaml"


# ----------------------------------------------------------------------------- loads
def load_nan_fastwam(ctx: Ctx):
    """load_fastwam of a directory whose action expert holds an inf."""
    from agents.wam.fastwam.checkpoint import load_fastwam

    load_fastwam(our_nan_checkpoint(ctx))


def load_nan_lora(ctx: Ctx):
    """load_fastwam of a directory whose LoRA adapter holds a NaN."""
    from agents.wam.fastwam.checkpoint import load_fastwam, save_fastwam
    from agents.wam.lora import LoraSettings, add_lora

    model = load_fastwam(_converted(ctx))
    add_lora(model, LoraSettings(rank=2))
    save_fastwam(model, ctx.tmp / "lora_ckpt", encoders=False)
    adapter = ctx.tmp / "lora_ckpt" / "lora" / "video" / "adapter_model.safetensors"
    tensors = load_file(str(adapter))
    next(iter(tensors.values())).fill_(float("nan"))
    save_file(tensors, str(adapter))
    load_fastwam(ctx.tmp / "lora_ckpt")


def load_nan_mot(ctx: Ctx):
    """load_pretrained of a MoT checkpoint whose transformer holds a NaN."""
    from agents.wam import load_pretrained

    ckpt = Path(shutil.copytree(ctx.shared.ckpt, ctx.tmp / "ckpt"))
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(weights))
    tensors["proj_out.bias"][0] = float("nan")
    save_file(tensors, str(weights))
    load_pretrained(ckpt)


def fit_vae_into_a_folder(ctx: Ctx):
    """python -m training.fit_vae output_dir=<a folder holding notes.txt>."""
    from training.fit_vae import FitVAEConfig, VAEDataConfig, fit_vae

    fit_vae(FitVAEConfig(dataset=VAEDataConfig(root=str(ctx.tmp / "data")), output_dir=str(a_folder(ctx))))


def cases() -> list[Case]:
    return [
        # --- The FastWAM converter: the .pt given to to-ours and inspect (issue 50)
        Case("convert-missing-file", convert(TO_OURS, pt=missing_file), ConverterRefused,
             r"nothing\.pt is not a file; pass their checkpoint \(\.pt\), e\.g\. their LIBERO release's"),
        Case("convert-a-folder", convert(TO_OURS, pt=a_folder), ConverterRefused,
             r"folder is a directory; pass their checkpoint \(\.pt\)"),
        Case("convert-empty-file", convert(TO_OURS, pt=empty_file), ConverterRefused,
             r"empty\.pt is not a torch\.save archive \(0 bytes: empty, cut short or another kind of file\); download "
             r"or copy it again$"),
        Case("convert-truncated-file", convert(TO_OURS, pt=truncated_file), ConverterRefused,
             r"their\.pt is not a torch\.save archive \(\d+ bytes: .*\); download or copy it again$"),
        Case("convert-random-bytes", convert(TO_OURS, pt=random_bytes), ConverterRefused,
             r"random\.pt is not a torch\.save archive \(4096 bytes"),
        Case("convert-code-pickle", convert(TO_OURS, pt=code_pickle), ConverterRefused,
             r"their\.pt holds more than tensors and containers, and is not unpickled \(.*GLOBAL .*\); a FastWAM "
             r"checkpoint is a dict of state dicts: re-save it with torch\.save"),
        Case("convert-no-mot", convert(TO_OURS, pt=dit_only), ConverterRefused,
             r"their\.pt is not a FastWAM checkpoint: it needs a 'mot' entry \(found \['dit'\]\)"),
        Case("convert-mot-not-a-state-dict", convert(TO_OURS, pt=mot_a_tensor), ConverterRefused,
             r"their\.pt: its 'mot' entry is a Tensor, not a state dict; re-save it with torch\.save"),
        Case("convert-value-not-a-tensor", convert(TO_OURS, pt=mot_of_numbers), ConverterRefused,
             r"their\.pt: mot\.patch_embedding\.weight is a int, not a tensor; it is not a FastWAM checkpoint"),
        Case("convert-int-weights", convert(TO_OURS, pt=int_weights), ConverterRefused,
             r"their\.pt: mot\.\S+ is torch\.int32, and a FastWAM's weights are floating point; re-save it from the "
             r"trained model"),
        Case("convert-nan-weights", convert(TO_OURS, pt=edited(_nan_head)), ConverterRefused,
             r"their\.pt: tensor mot\.mixtures\.action\.head\.weight holds 1 NaN or inf value\(s\) of 336; .*convert an "
             r"earlier checkpoint of the run$"),
        Case("inspect-nan-weights", convert("inspect {pt}", pt=edited(_nan_head)), ConverterRefused,
             r"tensor mot\.mixtures\.action\.head\.weight holds 1 NaN or inf"),
        Case("convert-missing-key", convert(TO_OURS, pt=edited(_drop_norm_k)), ConverterRefused,
             r"the checkpoint does not fit fastwam_tiny: action_expert: missing mot\.mixtures\.action\.blocks\.1\.cross_attn"
             r"\.norm_k\.weight; pass the config of the run that wrote it \(--their-config\) or the preset of its size"),
        Case("convert-extra-key", convert(TO_OURS, pt=edited(_add_image_key)), ConverterRefused,
             r"1 key\(s\) of the checkpoint have no place in FastWAM: mot\.mixtures\.video\.blocks\.0\.cross_attn\.k_img"
             r"\.weight; .*convert the \.pt FastWAM's training wrote$"),
        Case("convert-wrong-shape", convert(TO_OURS, pt=edited(_shrink_norm_k)), ConverterRefused,
             r"action_expert: shape mot\.mixtures\.action\.blocks\.1\.cross_attn\.norm_k\.weight is \(3,\), the model "
             r"needs \(64,\); pass the config"),
        Case("convert-other-architecture", convert(TO_OURS, pt=other_architecture), ConverterRefused,
             r"the checkpoint lacks mot\.mixtures\.video\.patch_embedding\.weight: it is not a FastWAM of theirs .*: pass "
             r"their release or a \.pt their training wrote$"),
        Case("inspect-other-architecture", convert("inspect {pt}", pt=other_architecture), ConverterRefused,
             r"the checkpoint lacks mot\.mixtures\.video\.patch_embedding\.weight"),
        Case("inspect-missing-file", convert("inspect {pt}", pt=missing_file), ConverterRefused,
             r"nothing\.pt does not exist; pass their \.pt or a directory to-ours wrote$"),
        Case("inspect-truncated-file", convert("inspect {pt}", pt=truncated_file), ConverterRefused,
             r"their\.pt is not a torch\.save archive"),
        Case("inspect-code-pickle", convert("inspect {pt}", pt=code_pickle), ConverterRefused,
             r"their\.pt holds more than tensors and containers, and is not unpickled"),
        Case("inspect-a-folder", convert("inspect {dir}", dir=a_folder), ConverterRefused,
             r"folder has no wam_config\.json: it is no checkpoint directory; pass one that "
             r"scripts/convert_fastwam_checkpoint\.py to-ours or python -m training wrote$"),
        # --- The FastWAM converter: what it writes to (issue 50)
        Case("convert-into-a-folder-of-files", convert(TO_OURS_INTO, pt=release, dir=a_folder),
             ConverterRefused,
             r"folder already exists \(a directory holding 1 entry \(notes\.txt\)\) and nothing is written over it: write "
             r"to a new path, or pass --overwrite to replace it$"),
        Case("convert-over-a-checkpoint", convert(TO_OURS_INTO, pt=release, dir=our_checkpoint),
             ConverterRefused, r"ours already exists \(a directory holding 4 entries .*pass --overwrite to replace it$"),
        Case("convert-over-a-file", convert(TO_OURS_INTO + " --overwrite", pt=release, dir=a_file),
             ConverterRefused, r"notes\.txt is a file, and to-ours writes a directory: name a new directory$"),
        Case("convert-over-its-own-folder", convert(TO_OURS_INTO + " --overwrite", pt=release,
                                                    dir=release_in_folder),
             ConverterRefused, r"holds the input \S+their\.pt, and writing it would delete that: write to another "
                               r"directory$"),
        Case("to-theirs-into-a-folder", convert("to-theirs {ours} {dir}", ours=our_checkpoint, dir=a_folder),
             ConverterRefused, r"folder is a directory, and to-theirs writes one file: name the \.pt to write \(e\.g\. "
                               r"\S+/folder/fastwam\.pt\)$"),
        Case("to-theirs-over-a-file", convert("to-theirs {ours} {file}", ours=our_checkpoint, file=a_file),
             ConverterRefused, r"notes\.txt already exists \(a file\) and nothing is written over it: write to a new path, "
                               r"or pass --overwrite to replace it$"),
        Case("to-theirs-negative-step", convert("to-theirs {ours} {out} --step -1", ours=our_checkpoint),
             ConverterRefused, r"--step -1 is negative: pass the training step the weights are from \(>= 0\)$"),
        # --- The FastWAM converter: the directory given to to-theirs (issue 50)
        Case("to-theirs-of-a-folder", convert("to-theirs {dir} {out}", dir=a_folder), ConverterRefused,
             r"folder has no wam_config\.json: it is no checkpoint directory; pass one that "
             r"scripts/convert_fastwam_checkpoint\.py to-ours or python -m training wrote$"),
        Case("to-theirs-of-a-mot", convert("to-theirs {dir} {out}", dir=mot_checkpoint), ConverterRefused,
             r"mot/wam_config\.json is not a FastWAM's \(\"architecture\" is 'mot', not \"fastwam\"\): pass a FastWAM "
             r"checkpoint directory \(to-ours writes one\)$"),
        Case("to-theirs-of-a-file", convert("to-theirs {pt} {out}", pt=release), ConverterRefused,
             r"FastWAM checkpoint \S+their\.pt is not a local directory; convert one with "
             r"scripts/convert_fastwam_checkpoint\.py$"),
        Case("to-theirs-nan-weights", convert("to-theirs {ours} {out}", ours=our_nan_checkpoint), ConverterRefused,
             r"ours/action_expert: tensor action_in\.bias holds 1 NaN or inf value\(s\) of 48; a model with them predicts "
             r"NaN: load an earlier checkpoint, or re-save or re-convert this one from a sound source$"),
        # --- The FastWAM converter: statistics and their config (issue 50)
        Case("convert-stats-missing", convert(TO_OURS + " --stats {stats}", pt=release, stats=missing_file),
             ConverterRefused, r"nothing\.pt is not a file: " + STATS_FIX),
        Case("convert-stats-not-json", convert(TO_OURS + " --stats {stats}", pt=release, stats=stats("global_min: -1")),
             ConverterRefused, r"stats\.json is not JSON \(Expecting value: line 1 column 1 \(char 0\)\): " + STATS_FIX),
        Case("convert-stats-a-list", convert(TO_OURS + " --stats {stats}", pt=release, stats=stats([1, 2])),
             ConverterRefused, r"stats\.json holds a JSON list, not a statistics object: " + STATS_FIX),
        Case("convert-stats-nan", convert(TO_OURS + " --stats {stats}", pt=release,
                                          stats=stats(json.dumps(_unit()).replace("-1.0", "NaN", 1))),
             ConverterRefused, r"stats\.json: state\.default\.global_min\[0\] is not a finite number: " + STATS_FIX),
        Case("convert-stats-wrong-size", convert(TO_OURS + " --stats {stats}", pt=release, stats=stats(_unit(14, 14))),
             ConverterRefused, r"stats\.json: action\.default\.global_min has 14 values and the checkpoint has 7-d actions: "
                               + STATS_FIX),
        Case("convert-stats-z-score", convert(TO_OURS + " --stats {stats}", pt=release, stats=stats(
            {"observation.state": {"mean": [0.0] * 8, "std": [1.0] * 8}, "action": {"mean": [0.0] * 7, "std": [1.0] * 7}})),
             ConverterRefused, r"stats\.json: normalization is not recorded \(LeRobot's default: the state by mean/std, a "
                               r"z-score\), and FastWAM normalises with min/max \('fastwam_min_max'\): " + STATS_FIX),
        Case("convert-stats-min-above-max", convert(TO_OURS + " --stats {stats}", pt=release, stats=stats(_unit(low=1, high=0))),
             ConverterRefused, r"stats\.json: state\.default\.global_min exceeds state\.default\.global_max at dimension\(s\) "
                               r"\[0, 1, 2, 3, 4\] \(they would flip the actions\): " + STATS_FIX),
        Case("convert-stats-no-max", convert(TO_OURS + " --stats {stats}", pt=release, stats=stats(
            {group: {"default": {"global_min": [0.0] * dim}} for group, dim in (("state", 8), ("action", 7))})),
             ConverterRefused, r"stats\.json: state\.default\.global_max is missing, not a list of numbers: " + STATS_FIX),
        Case("convert-stats-two-beside", convert(TO_OURS, pt=two_stats_beside), ConverterRefused,
             r"holds both their_dataset_stats\.json and dataset_stats\.json beside their\.pt: pass --stats with the one "
             r"of this checkpoint$"),
        Case("convert-their-config-not-yaml", convert("to-ours {pt} {out} --inputs wam_gym --their-config {config}",
                                                      pt=release, config=bad_yaml), ConverterRefused,
             r"config\.yaml is not a readable YAML config \(.*\); pass the config\.yaml their training wrote into the "
             r"run's output_dir$"),
        Case("convert-zero-text-tokens", convert(TO_OURS + " --text-tokens 0", pt=release), ConverterRefused,
             r"argument --text-tokens: 0 must be at least 1$"),
        Case("convert-nan-shift", convert("to-ours {pt} {out} --inputs wam_gym --shifts nan 5", pt=release),
             ConverterRefused, r"argument --shifts: nan must be a finite number above 0$"),
        # --- Weights holding NaN or inf, at load (issue 50)
        Case("load-fastwam-nan-weights", load_nan_fastwam, NonFiniteWeightsError,
             r"ours/action_expert: tensor action_in\.bias holds 1 NaN or inf value\(s\) of 48; a model with them predicts "
             r"NaN: load an earlier checkpoint"),
        Case("load-lora-nan-weights", load_nan_lora, NonFiniteWeightsError,
             r"LoRA weights \S+lora/video/adapter_model\.safetensors: tensor \S+ holds \d+ NaN or inf value\(s\) of \d+; "
             r"a model with them predicts NaN: load an earlier checkpoint's adapters, or re-save them$"),
        Case("load-mot-nan-weights", load_nan_mot, NonFiniteWeightsError,
             r"ckpt: transformer/: tensor proj_out\.bias holds 1 NaN or inf value\(s\) of \d+; a model with them predicts "
             r"NaN: load an earlier checkpoint"),
        # --- Other writers (issue 50)
        Case("fit-vae-into-a-folder-of-files", fit_vae_into_a_folder, DestinationExists,
             r"folder already exists \(a directory holding 1 entry \(notes\.txt\)\) and nothing is written over it: write "
             r"to a new path, or pass overwrite=true to replace it$"),
    ]
