"""Command lines that refuse before the work (issue 50): every argument, path and port checked before an episode
runs, a model loads or a file is written; counts with an upper bound where a huge one is a typo.
(tests/test_cli_walk.py walks every entry point as a real process; these name each message's fix.)"""

from __future__ import annotations

import json

from tests.bad_inputs import Case, Ctx

TWO_POLICIES = ("--policy", "expert", "--policy", "random")


# ----------------------------------------------------------------------------- triggers
def _world_model_eval(ctx: Ctx, *argv: str):
    """Parse and check a world_model_eval command line (what main does before any episode)."""
    from wam_gym.world_model.evaluate import build_parser, check_args

    (ctx.tmp / "ckpt").mkdir(exist_ok=True)
    (ctx.tmp / "ckpt" / "wam_config.json").write_text("{}")
    base = ["--world-model", str(ctx.tmp / "ckpt"), "--detector", str(ctx.tmp / "det"), "--output", str(ctx.tmp / "out")]
    return check_args(build_parser().parse_args([*base, *argv]))


def wm_eval_zero_trials(ctx: Ctx):
    """``world_model_eval --trials 0``: it used to train the detector first."""
    _world_model_eval(ctx, *TWO_POLICIES, "--trials", "0")


def wm_eval_huge_steps(ctx: Ctx):
    """``world_model_eval --steps 100000000``."""
    _world_model_eval(ctx, *TWO_POLICIES, "--steps", "100000000")


def wm_eval_unimportable_policy(ctx: Ctx):
    """``--policy python=no_such_module:make``: it used to fail after the detector's episodes."""
    _world_model_eval(ctx, "--policy", "expert", "--policy", "python=no_such_module:make")


def wm_eval_empty_detector(ctx: Ctx):
    """``--detector ''``: the working directory, where a detector would be trained."""
    from wam_gym.world_model.evaluate import build_parser, check_args

    check_args(build_parser().parse_args(["--world-model", "ckpt", "--detector", "", "--output", "o", *TWO_POLICIES]))


def wm_eval_detector_is_a_file(ctx: Ctx):
    """``--detector`` names a file."""
    (ctx.tmp / "det").write_text("not a folder")
    _world_model_eval(ctx, *TWO_POLICIES)


def wm_eval_missing_wam_policy(ctx: Ctx):
    """``--policy wam=DIR`` where DIR holds no checkpoint."""
    _world_model_eval(ctx, "--policy", "expert", "--policy", f"wam={ctx.tmp / 'nowhere'}")


def wm_eval_results_exist(ctx: Ctx):
    """``--output`` holds an earlier run's results.json (it was replaced in silence)."""
    (ctx.tmp / "out").mkdir()
    (ctx.tmp / "out" / "results.json").write_text("{}")
    _world_model_eval(ctx, *TWO_POLICIES)


def wm_eval_task_not_installed(ctx: Ctx):
    """``--task`` of a suite whose simulator is not installed."""
    _world_model_eval(ctx, *TWO_POLICIES, "--task", "wam_gym/LIBERO-Spatial-v0")


def _demo(*argv: str):
    from wam_gym.demo import build_parser, check_args

    check_args(build_parser().parse_args(list(argv)))


def demo_zero_trials(ctx: Ctx):
    """``python -m wam_gym.demo --trials 0``: it used to collect, fit and train first."""
    _demo("--trials", "0")


def demo_output_is_a_file(ctx: Ctx):
    """``python -m wam_gym.demo --output FILE``."""
    (ctx.tmp / "notes.txt").write_text("mine")
    _demo("--output", str(ctx.tmp / "notes.txt"))


def demo_replan_beyond_the_chunk(ctx: Ctx):
    """``python -m wam_gym.demo --replan-steps 33`` (the chunk is 32)."""
    _demo("--replan-steps", "33")


def train_empty_output_dir(ctx: Ctx):
    """``python -m training output_dir=`` (it would write into the working directory)."""
    from training.config import TrainConfig

    TrainConfig(output_dir="")


def train_too_many_workers(ctx: Ctx):
    """``python -m training num_workers=100000``."""
    from training.config import TrainConfig

    TrainConfig(num_workers=100_000)


def eval_huge_trials(ctx: Ctx):
    """``EVALUATION.num_trials=1000000000`` (it started the first of them)."""
    from wam_gym.eval.config import EvaluationConfig

    EvaluationConfig(num_trials=10**9)


def huge_inference_steps(ctx: Ctx):
    """``EVALUATION.num_inference_steps=1000000``."""
    from wam_gym.model_call import ModelCallConfig

    ModelCallConfig(num_inference_steps=10**6)


def compare_protocol_not_an_object(ctx: Ctx):
    """``python -m wam_gym.compare`` on a run whose protocol.json holds a list."""
    from wam_gym.compare import compare

    for run in ("a", "b"):
        (ctx.tmp / run).mkdir()
        (ctx.tmp / run / "protocol.json").write_text(json.dumps([1, 2]))
    compare(ctx.tmp / "a", ctx.tmp / "b")


def cases() -> list[Case]:
    from envs.errors import MissingSimulatorError

    two = r"give an integer in \[1, %s\]"
    return [
        # --- world_model_eval: every argument before the first episode
        Case("wm-eval-zero-trials", wm_eval_zero_trials, ValueError, r"^--trials 0: " + two % 10000),
        Case("wm-eval-huge-steps", wm_eval_huge_steps, ValueError, r"^--steps 100000000: " + two % 100000),
        Case("wm-eval-unimportable-policy", wm_eval_unimportable_policy, ValueError,
             r"^--policy python=no_such_module:make: cannot import no_such_module .*install it or put its folder on "
             r"PYTHONPATH"),
        Case("wm-eval-empty-detector", wm_eval_empty_detector, ValueError, r"^--detector '': give a path"),
        Case("wm-eval-detector-is-a-file", wm_eval_detector_is_a_file, ValueError,
             r"--detector \S+ is a file: pass a folder"),
        Case("wm-eval-missing-wam-policy", wm_eval_missing_wam_policy, FileNotFoundError,
             r"^--policy wam=\S+: \S+ is not a WAM checkpoint directory \(no wam_config\.json\); pass the directory "
             r"python -m training saved"),
        Case("wm-eval-results-exist", wm_eval_results_exist, ValueError,
             r"--output \S+ already holds results\.json: pass a new --output, or --overwrite to replace them"),
        Case("wm-eval-task-not-installed", wm_eval_task_not_installed, MissingSimulatorError,
             r"^--task wam_gym/LIBERO-Spatial-v0: LIBERO is not installed; pip install 'wam_gym\[libero\]'",
             absent="libero"),
        # --- demo: its flags before the first stage
        Case("demo-zero-trials", demo_zero_trials, ValueError, r"^--trials 0: " + two % 10000),
        Case("demo-output-is-a-file", demo_output_is_a_file, ValueError,
             r"--output \S+notes\.txt is a file: give a folder"),
        Case("demo-replan-beyond-the-chunk", demo_replan_beyond_the_chunk, ValueError,
             r"^--replan-steps 33: give an integer in \[0, 32\] \(0: the whole chunk\)"),
        # --- envs: a misspelt suite listed nothing
        Case("envs-list-unknown-suite", ("wam_gym.envs", "list", "--suite", "metawrld"), 2,
             r"^error: --suite='metawrld' is not a suite: choose one of \[.*'metaworld'"),
        # --- knobs: upper bounds and empty paths
        Case("train-empty-output-dir", train_empty_output_dir, ValueError,
             r"^output_dir='' is empty: give a path"),
        Case("train-too-many-workers", train_too_many_workers, ValueError,
             r"^num_workers=100000 is more than 256, which no run needs: set num_workers=<at most 256>"),
        Case("eval-huge-trials", eval_huge_trials, ValueError,
             r"^EVALUATION\.num_trials must be in \[1, 100000\] \(episodes per task\), got 1000000000"),
        Case("eval-huge-inference-steps", huge_inference_steps, ValueError,
             r"^EVALUATION\.num_inference_steps must be in \[1, 1000\]"),
        Case("compare-protocol-not-an-object", compare_protocol_not_an_object, ValueError,
             r"protocol\.json holds a JSON list, not an object: rerun the evaluation into a new output dir"),
    ]
