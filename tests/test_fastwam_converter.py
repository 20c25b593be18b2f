"""scripts/convert_fastwam_checkpoint.py as a careless user holds it: every subcommand against every bad file
ends in one line and writes nothing; nothing is written over without --overwrite; statistics come only from
--stats or beside the .pt, named and checked; weights holding NaN or inf are refused, named.

The bad-input catalogue (tests/bad_inputs/converter.py) holds one case of each kind, with its message; here
every subcommand meets every kind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agents.wam.fastwam.checkpoint import read_their_checkpoint
from tests.bad_inputs import Ctx, Shared
from tests.bad_inputs import converter as bad
from tests.conftest import load_script

BAD_FILES = {
    "missing": bad.missing_file, "empty": bad.empty_file, "truncated": bad.truncated_file, "random": bad.random_bytes,
    "code-pickle": bad.code_pickle, "no-mot": bad.dit_only, "mot-a-tensor": bad.mot_a_tensor,
    "mot-of-numbers": bad.mot_of_numbers, "int-weights": bad.int_weights, "other-architecture": bad.other_architecture,
    "nan": bad.edited(bad._nan_head), "folder": bad.a_folder, "mot-directory": bad.mot_checkpoint,
}
# what each subcommand must refuse besides: to-ours the edited keys, to-theirs every file (it takes our directory)
COMMANDS = {
    "to-ours": "to-ours {pt} {out} --inputs wam_gym --preset fastwam_tiny",
    "inspect": "inspect {pt}",
    "to-theirs": "to-theirs {pt} {out}",
}
EDITED = {"missing-key": bad._drop_norm_k, "extra-key": bad._add_image_key, "wrong-shape": bad._shrink_norm_k}


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Shared:
    return Shared(tmp_path_factory.mktemp("shared"))


@pytest.fixture
def ctx(tmp_path, monkeypatch, shared) -> Ctx:
    (tmp_path / "case").mkdir()
    return Ctx(tmp_path / "case", monkeypatch, shared)


def refused(ctx: Ctx, command: str, **inputs) -> str:
    with pytest.raises(bad.ConverterRefused) as info:  # one line, no traceback, nothing written: checked there
        bad.convert(command, **inputs)(ctx)
    return str(info.value)


@pytest.mark.parametrize("kind", BAD_FILES)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_refuses_every_bad_file_in_one_line(ctx, command, kind):
    assert str(ctx.tmp) in refused(ctx, COMMANDS[command], pt=BAD_FILES[kind])  # named


@pytest.mark.parametrize("kind", EDITED)
def test_keys_that_do_not_fit_are_refused_in_one_line(ctx, kind):
    message = refused(ctx, COMMANDS["to-ours"], pt=bad.edited(EDITED[kind]))
    assert "pass the config of the run that wrote it" in message or "convert the .pt FastWAM's training wrote" in message


def test_a_code_carrying_pickle_is_never_run(ctx):
    refused(ctx, COMMANDS["to-ours"], pt=bad.code_pickle)
    refused(ctx, COMMANDS["inspect"], pt=bad.code_pickle)
    assert not (ctx.tmp / "ran").exists()


# ----------------------------------------------------------------------------- nothing written over
def run(*argv) -> int:
    return load_script("convert_fastwam_checkpoint").main([str(a) for a in argv])


def test_overwrite_replaces_a_checkpoint_and_a_file_only_when_asked(ctx, capsys):
    pt, target, back = bad.release(ctx), ctx.tmp / "ours", ctx.tmp / "back.pt"
    assert run("to-ours", pt, target, *bad.TINY) == 0
    (target / "mine.txt").write_text("kept")
    assert run("to-ours", pt, target, *bad.TINY) == 1 and (target / "mine.txt").read_text() == "kept"
    assert run("to-ours", pt, target, *bad.TINY, "--overwrite") == 0 and not (target / "mine.txt").exists()
    back.write_text("mine")
    assert run("to-theirs", target, back) == 1 and back.read_text() == "mine"
    assert run("to-theirs", target, back, "--overwrite", "--step", "3") == 0
    assert torch.load(back, weights_only=True)["step"] == 3
    assert "already exists (a file)" in capsys.readouterr().err
    assert not [p.name for p in ctx.tmp.iterdir() if p.name.startswith(".")]  # no lock, staging or temp file left


def test_a_failed_write_leaves_no_temporary_file(ctx, monkeypatch):
    pt, target = bad.release(ctx), ctx.tmp / "ours"
    assert run("to-ours", pt, target, *bad.TINY) == 0

    def fails(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", fails)
    assert run("to-theirs", target, ctx.tmp / "back.pt") == 1
    monkeypatch.setattr("agents.wam.fastwam.config.FastWAMConfig.save", lambda self, path: fails(None, path))
    assert run("to-ours", pt, ctx.tmp / "second", *bad.TINY) == 1
    assert sorted(p.name for p in ctx.tmp.iterdir()) == ["ours", "their.pt"]  # nothing else, hidden or not


# ----------------------------------------------------------------------------- statistics
def test_statistics_beside_the_pt_are_taken_named_and_kept(ctx, capsys):
    pt = bad.release(ctx)
    stats = bad._unit()
    (ctx.tmp / "their_dataset_stats.json").write_text(json.dumps(stats))
    assert run("to-ours", pt, ctx.tmp / "ours", *bad.TINY) == 0
    assert f"statistics: {ctx.tmp / 'their_dataset_stats.json'} (beside the checkpoint)" in capsys.readouterr().out
    assert json.loads((ctx.tmp / "ours" / "dataset_stats.json").read_text()) == stats


def test_statistics_in_a_folder_above_are_not_taken(ctx, capsys):
    (ctx.tmp / "dataset_stats.json").write_text(json.dumps(bad._unit()))  # another run's, above
    (ctx.tmp / "checkpoints" / "weights").mkdir(parents=True)
    pt = shutil.move(bad.release(ctx), ctx.tmp / "checkpoints" / "weights" / "step_10.pt")
    assert run("to-ours", pt, ctx.tmp / "ours", *bad.TINY) == 0
    assert "statistics: none given and none beside the .pt: pass --stats" in capsys.readouterr().out
    assert not (ctx.tmp / "ours" / "dataset_stats.json").exists()


def test_lerobot_statistics_recording_fastwam_min_max_are_taken(ctx, capsys):
    stats = {"observation.state": {"min": [0.0] * 8, "max": [1.0] * 8}, "action": {"min": [0.0] * 7, "max": [1.0] * 7},
             "normalization": "fastwam_min_max"}
    (ctx.tmp / "stats.json").write_text(json.dumps(stats))
    assert run("to-ours", bad.release(ctx), ctx.tmp / "ours", *bad.TINY, "--stats", ctx.tmp / "stats.json") == 0
    assert "(--stats)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- NaN and inf
def test_an_inf_anywhere_is_named_at_conversion(ctx):
    def inf_in_proprio(flat):
        flat["proprio_encoder.weight"] = flat["proprio_encoder.weight"].clone()
        flat["proprio_encoder.weight"][-1, -1] = float("-inf")

    message = refused(ctx, COMMANDS["to-ours"], pt=bad.edited(inf_in_proprio))
    assert "tensor proprio_encoder.weight holds 1 NaN or inf value(s)" in message
    with pytest.raises(ValueError, match="proprio_encoder.weight"):
        read_their_checkpoint(ctx.tmp / "their.pt")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_the_load_check_finds_one_bad_value_in_any_position(dtype, value):
    from agents.wam.finite_weights import is_finite

    for position in (0, 4095, 70_006):
        tensor = torch.randn(70_007, dtype=dtype)
        assert is_finite(tensor)
        tensor[position] = value
        assert not is_finite(tensor) and not is_finite(tensor.view(7, 10_001).t())
    assert is_finite(torch.empty(0, dtype=dtype)) and is_finite(torch.zeros(3, dtype=torch.int64))
