"""results.json, results.csv, tensorboard and the printed table of a run, written whatever way it ends."""

from __future__ import annotations

import logging
from typing import Any

from wam_gym.eval.errors import EvalError
from wam_gym.eval.planning import EvalPlan
from wam_gym.eval.results import OutOfSpaceError, format_table, log_tensorboard, summarize, write_summary
from wam_gym.utils.stop_signals import Stopped

logger = logging.getLogger(__name__)


def report(plan: EvalPlan, outcomes: dict, run: dict[str, Any], wall_time_s: float, error: str | None,
           stopped: Stopped | None = None) -> dict[str, Any]:
    """Write and print the summary of ``plan``'s run; ``outcomes`` are the episodes on disk, ``run`` what this
    invocation adds (broker statistics, reruns, resume mismatches)."""
    # A stopping rule's skipped episodes are not missing: the plan is what ran plus what is still wanted.
    keys = [job.key for job in plan.jobs if job.key in outcomes or plan.stopping.wanted(job.key)]
    summary = summarize(plan.store.records(), keys)
    if stopped is not None:  # Ctrl-C, SIGTERM: what is missing, and how to resume
        error = f"stopped by {stopped.name}: {incomplete(plan, keys) or 'every planned episode has a record'}"
    ev = plan.config.EVALUATION
    extra = {
        "benchmark": plan.config.benchmark,
        "wall_time_s": wall_time_s,
        "error": error if error or summary["complete"] else incomplete(plan, keys),
        "broker": run.get("broker", {}),
        "reruns": run.get("reruns", {}),  # this invocation's: an actor died or was killed, a server or worker was lost
        "init_state_pinned_to_trial": any(t.pins_init_state for t in plan.tasks),
        "protocol_hash": plan.protocol.hash,  # of protocol.json's protocol and observed parts
        "protocol": plan.protocol.record,  # protocol.json: what the episodes are, and the agent that ran them
        "allow_resume_mismatch": ev.allow_resume_mismatch,
        "resume_mismatch": run.get("resume_mismatch", []),  # the differences a resume was allowed to ignore
        "image_resized": plan.image_resized,  # env frames resized to the model's (allow_image_resize)
        # how predicted frames were scored (null: not scored): cameras, size, the env steps between frames
        "imagination": None if plan.imagination is None else plan.imagination.record,
        "stopping": plan.stopping.report(),  # EVALUATION.target_ci_halfwidth / compare_to: what they decided
        "records_set_aside": plan.store.set_aside,  # corrupt or misplaced record files moved aside
        "config": plan.composed,
    }
    _write(plan, summary, extra, error)
    print(format_table(summary))
    if extra["broker"]:
        print(_broker_line(extra["broker"]))
    print(f"results: {plan.output_dir / 'results.json'} (+ results.csv, episodes/)")
    return {**summary, **extra}


def _write(plan: EvalPlan, summary: dict, extra: dict, error: str | None) -> None:
    try:
        write_summary(plan.output_dir, summary, extra)
    except OutOfSpaceError as exc:
        if error is None:  # else the run's own error is the one to report; the records are on disk
            raise EvalError(f"{exc.strerror} with EVALUATION.output_dir={plan.output_dir}") from exc
        logger.error("%s", exc.strerror)
    if plan.config.EVALUATION.tensorboard:
        try:
            log_tensorboard(plan.output_dir / "tensorboard", summary)
        except (RuntimeError, OSError) as exc:  # scalars are a convenience: never lose the run over them
            logger.warning("tensorboard: %s", exc)


def _broker_line(s: dict[str, Any]) -> str:
    return (f"broker: mean batch {s['mean_batch_size']:.2f}, queue wait p50/p95 {s['queue_wait_ms_p50']:.1f}/"
            f"{s['queue_wait_ms_p95']:.1f} ms (filling a batch p50 {s['batch_fill_ms_p50']:.1f} ms), "
            f"model p50/p95 {s['model_ms_p50']:.1f}/{s['model_ms_p95']:.1f} ms, "
            f"stacking a batch p50/p95 {s['stack_ms_p50']:.1f}/{s['stack_ms_p95']:.1f} ms")


def incomplete(plan: EvalPlan, keys: list[tuple[str, int]]) -> str | None:
    """Why a run that raised nothing still lacks episodes (results.json's error is never null then)."""
    missing = plan.store.missing(keys)
    if not missing:
        return None
    task, trial = missing[0]
    return (f"{len(missing)} of {len(keys)} planned episodes have no record (first: {task} trial {trial}); "
            f"run again with EVALUATION.output_dir={plan.output_dir} to run them")
