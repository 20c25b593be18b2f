"""Types at every boundary (issue 50): env keywords checked where they enter (``gymnasium.make``, one place for
every registered env), and run files (protocol.json, results.json) checked where they are read, naming the file
and the field."""

from __future__ import annotations

import json

from tests.bad_inputs import Case, Ctx

MW = "wam_gym/MetaWorld-reach-v3"


# ----------------------------------------------------------------------------- triggers
def _make(env_id: str = MW, **kwargs):
    import gymnasium

    import envs  # noqa: F401 - registers the ids

    gymnasium.make(env_id, **kwargs)


def lazy_pixels_string(ctx: Ctx):
    """``gymnasium.make(ID, lazy_pixels="false")``: a true string, so pixels read black."""
    _make(lazy_pixels="false")


def image_size_string(ctx: Ctx):
    """``image_size="64"``, as a config file or a command line hands it over."""
    _make(image_size="64")


def cameras_one_string(ctx: Ctx):
    """``cameras="corner"``: a string is a sequence of one-letter camera names."""
    _make(cameras="corner")


def bool_as_int(ctx: Ctx):
    """``terminate_on_success=0``."""
    _make(terminate_on_success=0)


def unknown_keyword(ctx: Ctx):
    """``lazy_pixel=True``, one letter short (gymnasium's TypeError ran over several lines)."""
    _make(lazy_pixel=True)


def world_model_checkpoint_int(ctx: Ctx):
    """``gymnasium.make("wam_gym/WorldModel-v0", checkpoint=5)``."""
    _make("wam_gym/WorldModel-v0", checkpoint=5, dataset="d")


def world_model_zero_steps(ctx: Ctx):
    """``gymnasium.make("wam_gym/WorldModel-v0", ..., num_inference_steps=0)``: refused at the first reset, once."""
    _make("wam_gym/WorldModel-v0", checkpoint=str(ctx.shared.ckpt), start_from=MW, num_inference_steps=0)


def huge_image(ctx: Ctx):
    """``image_size=100000``: a camera buffer of 10^10 pixels."""
    _make(image_size=100_000)


def vector_kwarg_string(ctx: Ctx):
    """``envs.make_vec(ID, 2, lazy_pixels="no")``: refused here, not in each async worker."""
    import envs

    envs.make_vec(MW, 2, lazy_pixels="no")


def vector_zero_envs(ctx: Ctx):
    """``envs.make_vec(ID, 0)``."""
    import envs

    envs.make_vec(MW, 0)


def vector_forked(ctx: Ctx):
    """``envs.make_vec(ID, 2, context="fork")``: the guard against forking a GL context, turned off."""
    import envs

    envs.make_vec(MW, 2, context="fork")


def _run_pair(ctx: Ctx, protocol: dict):
    """Two runs with the same hand-edited protocol.json, compared."""
    from wam_gym.compare import compare

    for run in ("a", "b"):
        (ctx.tmp / run).mkdir()
        (ctx.tmp / run / "protocol.json").write_text(json.dumps({"observed": {}, "agent": {}, **protocol}))
    compare(ctx.tmp / "a", ctx.tmp / "b")


def protocol_tasks_list(ctx: Ctx):
    """protocol.json edited to ``"tasks": []`` (compare died with AttributeError)."""
    _run_pair(ctx, {"protocol": {"tasks": []}})


def protocol_seed_string(ctx: Ctx):
    """protocol.json edited to ``"EVALUATION.seed": "0"``."""
    _run_pair(ctx, {"protocol": {"EVALUATION.seed": "0"}})


def protocol_observed_number(ctx: Ctx):
    """protocol.json's observed env of a task edited to a number."""
    _run_pair(ctx, {"protocol": {}, "observed": {"pick": 3}})


def results_complete_string(ctx: Ctx):
    """results.json edited to ``"complete": "yes"`` (the demo read any truthy value as done)."""
    from wam_gym.eval.run_files import read_results

    (ctx.tmp / "results.json").write_text(json.dumps({"complete": "yes", "tasks": {}}))
    read_results(ctx.tmp / "results.json")


def cases() -> list[Case]:
    from envs.kwargs import EnvKwargError

    fix_protocol = r": restore the field as the evaluation wrote it, or rerun the evaluation into a new output dir"
    return [
        # --- env keywords, checked by gymnasium.make for every registered env
        Case("env-kwarg-string-bool", lazy_pixels_string, EnvKwargError,
             r"^wam_gym/MetaWorld-reach-v3: lazy_pixels='false' is a str, not a bool: pass lazy_pixels=True or "
             r"lazy_pixels=False", needs="metaworld"),
        Case("env-kwarg-string-size", image_size_string, EnvKwargError,
             r"image_size='64' is a str, not an int or a list of int: pass an int or a list of int, e\.g\. image_size=128",
             needs="metaworld"),
        Case("env-kwarg-one-camera-string", cameras_one_string, EnvKwargError,
             r"cameras='corner' is a str, not a list of str: pass a list of str, e\.g\. cameras=\['corner', "
             r"'gripperPOV'\]", needs="metaworld"),
        Case("env-kwarg-int-for-bool", bool_as_int, EnvKwargError,
             r"terminate_on_success=0 is an int, not a bool: pass terminate_on_success=True or terminate_on_success=False",
             needs="metaworld"),
        Case("env-kwarg-unknown", unknown_keyword, EnvKwargError,
             r"^wam_gym/MetaWorld-reach-v3 takes no keyword 'lazy_pixel': did you mean lazy_pixels\?", needs="metaworld"),
        Case("env-kwarg-world-model-checkpoint", world_model_checkpoint_int, EnvKwargError,
             r"^wam_gym/WorldModel-v0: checkpoint=5 is an int, not a str or None: pass a str or None"),
        Case("env-world-model-zero-steps", world_model_zero_steps, ValueError,
             r"^num_inference_steps must be an int >= 1, got 0", needs="metaworld"),
        Case("env-image-size-huge", huge_image, ValueError,
             r"image_size must be a positive int or \(height, width\), got 100000: give sides in \[1, 4096\] pixels",
             needs="metaworld"),
        # --- vector envs: checked in the calling process
        Case("vector-env-kwarg-string", vector_kwarg_string, EnvKwargError,
             r"lazy_pixels='no' is a str, not a bool: pass lazy_pixels=True or lazy_pixels=False"),
        Case("vector-env-zero-envs", vector_zero_envs, ValueError, r"^num_envs=0: give an int in \[1, 1024\]"),
        Case("vector-env-forked", vector_forked, ValueError,
             r"^context='fork': choose 'forkserver' \(the default\) or 'spawn'; a forked worker inherits its parent's GL"),
        # --- run files, checked where they are read
        Case("protocol-tasks-not-a-dict", protocol_tasks_list, ValueError,
             r"protocol\.json: field protocol\.tasks is \[\] \(list\), not a dict" + fix_protocol),
        Case("protocol-seed-a-string", protocol_seed_string, ValueError,
             r"protocol\.json: field protocol\.EVALUATION\.seed is \"0\" \(str\), not an int" + fix_protocol),
        Case("protocol-observed-a-number", protocol_observed_number, ValueError,
             r"protocol\.json: field observed\[\"pick\"\] is 3 \(int\), not a dict" + fix_protocol),
        Case("results-complete-a-string", results_complete_string, ValueError,
             r"results\.json: field complete is \"yes\" \(str\), not a bool: rerun the evaluation"),
    ]
