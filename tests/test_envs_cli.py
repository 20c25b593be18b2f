"""python -m wam_gym.envs check: constructor keywords on the command line (--kwarg KEY=VALUE)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re

import pytest

from wam_gym.envs import _kwarg, main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="needs wam_gym[metaworld]")
WORLD_MODEL = "wam_gym/WorldModel-v0"


def check(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", *argv])
    return code, out.getvalue(), err.getvalue()


def test_kwarg_values_are_json_when_they_parse():
    assert _kwarg("image_size=64") == ("image_size", 64)
    assert _kwarg('cameras=["corner"]') == ("cameras", ["corner"])
    assert _kwarg("checkpoint=outputs/demo/checkpoint") == ("checkpoint", "outputs/demo/checkpoint")
    assert _kwarg("a=b=c") == ("a", "b=c")
    with pytest.raises(Exception, match="expected KEY=VALUE"):
        _kwarg("image_size")


def test_kwargs_reach_the_env():
    code, out, err = check("wam_gym/MetaWorld-reach-v3", "--kwarg", "image_size=32", "--kwarg", 'cameras=["corner"]',
                           "--steps", "1")
    assert code == 0, err
    assert "cameras {'corner': (32, 32, 3)}" in out


def test_world_model_check_passes_with_the_keywords_its_error_asks_for(tmp_path):
    """Read the keywords from the refusal, pass them as --kwarg, and the checker passes."""
    from tests.test_world_model import _checkpoint
    from training.collect import collect

    code, _, err = check(WORLD_MODEL)
    assert code == 2 and "--kwarg KEY=VALUE" in err
    asked = re.findall(r"\b(\w+)= \(", err)
    assert asked == ["checkpoint", "dataset"]

    data = tmp_path / "data"
    collect(["wam_gym/MetaWorld-reach-v3"], episodes=1, output=data, image_size=32, max_steps=20, log=None)
    values = {"checkpoint": _checkpoint(tmp_path / "ckpt", data, predict_state=True), "dataset": data}
    code, out, err = check(WORLD_MODEL, *[a for k in asked for a in ("--kwarg", f"{k}={values[k]}")], "--steps", "2")
    assert code == 0, err
    assert out.startswith(f"{WORLD_MODEL}: ok (gymnasium ")
