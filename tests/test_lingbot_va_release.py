"""A LingBot-VA release folder as published: recognised, evaluated only under a named protocol, loaded whole, and
written back in their layout (scripts/tiny_lingbot_va_release.py makes one with random weights)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agents.wam.lingbot_va.folder import ReleaseFacts, is_release
from agents.wam.lingbot_va.inputs import convention
from agents.wam.lingbot_va.release import load_release, save_release
from tests.conftest import load_script
from wam_gym.eval import preflight, protocols


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return load_script("tiny_lingbot_va_release").make(tmp_path_factory.mktemp("lingbot") / "release")


def _evaluation(**knobs):
    return SimpleNamespace(**{"dataset_stats_path": None, "video_mode": None, "action_horizon": None, **knobs})


def test_a_release_is_told_apart_from_our_checkpoints(release, tiny_ckpt, tmp_path):
    assert is_release(release) and not is_release(tiny_ckpt) and not is_release(tmp_path)
    assert json.loads((release / "transformer" / "config.json").read_text())["attn_mode"] == "flashattn"


def test_preflight_takes_its_settings_from_the_protocol(release):
    root, facts, stats = preflight.wam_checkpoint(str(release), _evaluation(), protocols.named("lingbot_va_libero"))
    assert (root, stats) == (release.resolve(), None)
    assert facts == ReleaseFacts(("agentview", "robot0_eye_in_hand"), (128, 128), 16, 7)


@pytest.mark.parametrize("protocol, knobs, message", [
    (None, {}, r"is a LingBot-VA release folder, which carries no evaluation settings: name the protocol "
               r"it is evaluated under, protocol=lingbot_va_libero"),
    ("fastwam_libero", {}, r"protocol=lingbot_va_libero"),
    ("lingbot_va_libero", {"dataset_stats_path": "stats.json"},
     r"un-normalised by its convention's statistics \(lingbot_va_libero\); drop"),
    ("lingbot_va_libero", {"action_horizon": 32}, r"EVALUATION\.action_horizon=32: the checkpoint predicts 1\.\.16 actions"),
])
def test_preflight_refuses_what_a_release_cannot_honour(release, protocol, knobs, message):
    with pytest.raises(ValueError, match=message):
        preflight.wam_checkpoint(str(release), _evaluation(**knobs), protocols.named(protocol))


def test_a_release_loads_whole_and_writes_back_in_their_layout(release, tmp_path):
    loaded = load_release(release, convention("lingbot_va_libero"))
    assert loaded.config.action_shift == 0.05 and loaded.config.action_channels == tuple(range(7))
    assert loaded.prompts.embed("pick up the bowl").shape == (1, 512, loaded.config.transformer.text_dim)
    again = load_release(save_release(tmp_path / "copy", loaded.model, loaded.vae, loaded.prompts.text_encoder,
                                      loaded.prompts.tokenizer), convention("lingbot_va_libero"))
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key]), key
    shutil.rmtree(tmp_path / "copy" / "vae")
    with pytest.raises(FileNotFoundError, match=r"lacks vae/: give a LingBot-VA release folder as published"):
        load_release(tmp_path / "copy", convention("lingbot_va_libero"))


@pytest.mark.parametrize("overrides, message", [
    ([], r"is a LingBot-VA release folder, which carries no evaluation settings: name the protocol it is evaluated "
         r"under, protocol=lingbot_va_libero"),
    (["protocol=lingbot_va_libero", "EVALUATION.replan_steps=4"],
     r"^EVALUATION\.replan_steps=4 departs from lingbot_va_libero's 16, by which a LingBot-VA is served "
     r"\(its convention fixes its sampling; its chunks run whole\): drop it$"),
])
def test_the_policy_server_refuses_a_release_without_its_protocol_in_one_line(release, tmp_path, overrides, message):
    """python -m wam_gym.serve serves a release (tests/test_serve_lingbot_va.py) under its protocol, as eval does."""
    ran = subprocess.run([sys.executable, "-m", "wam_gym.serve", f"ckpt={release}", *overrides], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert ran.returncode != 0 and "Traceback" not in ran.stderr
    assert re.search(message, ran.stderr.strip().splitlines()[-1].removeprefix("error: "))


def test_inspect_names_the_architecture_and_counts_parameters_from_headers(release):
    inspect = load_script("inspect_lingbot_va")
    lines = inspect.describe(release)
    assert lines[1] == "  transformer: 2 layers of 2 x 20 heads (width 40), ffn 64, 48 latent and 30 action channels, text 16"
    assert lines[2] == "  attn_mode: 'flashattn' (ignored: wam_gym picks the attention kernel)"
    model = load_release(release, convention("lingbot_va_libero")).model
    assert lines[3] == f"  transformer/: {sum(p.numel() for p in model.parameters()):,} parameters"
