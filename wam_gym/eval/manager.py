"""The evaluation manager: plan episodes, run the missing ones on actors, report.

Its parts, one module each: ``planning`` (:class:`EvalPlan`: what runs, every input checked before
anything starts), ``run_loop`` (:class:`RunLoop`: actors, records, reruns), ``actor_pool`` (the
rollout actor processes) and ``report`` (results.json, the table).

Every finished episode is written at once, atomically, to ``output_dir/episodes/``; a run
started again with the same ``EVALUATION.output_dir`` runs exactly the episodes that have no
record yet. Episodes still running when a run stops on an error or Ctrl-C get ``STOP_GRACE_S`` to
finish (SIGTERM, whose SIGKILL follows soon: ``TERM_GRACE_S``), and are kept; results.json then
says what is missing and how to resume. A manager killed outright leaves no half-written record
(temp files of interrupted writes are never counted and are removed by the next run), and its
actors stop on their own.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from typing import Any

from wam_gym.eval.config import EvalConfig
from wam_gym.eval.errors import EvalError, OutputDirBusy
from wam_gym.eval.planning import EvalPlan
from wam_gym.eval.report import report
from wam_gym.eval.results import EPISODES_DIR, OutOfSpaceError
from wam_gym.eval.run_loop import RunLoop
from wam_gym.eval.run_protocol import episode_seed
from wam_gym.remote import PolicyServerError, PolicyServerLost, RemoteSettings, served_model
from wam_gym.utils import run_dir
from wam_gym.utils.stop_signals import Stopped

logger = logging.getLogger(__name__)

# Temp names of wam_gym.utils.publish.atomic_path (".<name>.<random>.tmp", ".<name>.<random>.tmp.mp4" for videos).
STALE_TEMP_GLOBS = (".*.tmp", f"{EPISODES_DIR}/*/.*.tmp", "videos/*/.*.tmp.mp4")

__all__ = ["EvalError", "EvalManager"]  # EvalError lives in wam_gym.eval.errors


class EvalManager:
    """Plans the episodes and checks every input on construction (:attr:`plan`: nothing starts, nothing
    is written); :meth:`run` takes the output dir's lock and runs what is missing."""

    def __init__(self, config: EvalConfig, composed: dict | None = None):
        self.plan = EvalPlan(config, composed)
        self.on_started = None  # test hook: called with (manager, actor pool, broker) once running
        self.server_model: Any = None  # agent=remote: what the server said it serves when the run began
        self.loop: RunLoop | None = None  # the run's, once run() has started one

    def run(self) -> dict[str, Any]:
        plan = self.plan
        if plan.config.EVALUATION.agent == "remote":  # the model behind the server is part of what acts
            try:  # before the output dir is touched: a server never reached costs nothing
                self.server_model = served_model(RemoteSettings.from_config(plan.config.REMOTE), first=True)
            except (PolicyServerLost, PolicyServerError) as exc:
                raise EvalError(f"{exc}; nothing was run") from None
            plan.protocol.record["agent"]["server_model"] = self.server_model
        with run_dir.locked(plan.output_dir, run_dir.EVAL_LOCK, knob="EVALUATION.output_dir", what="evaluation",
                            error=OutputDirBusy):  # held until the summary is written
            mismatch = plan.protocol.resume(bool(plan.store.done()), plan.config.EVALUATION.allow_resume_mismatch)
            plan.store.seed = episode_seed(plan.protocol.record)  # records must be the trials they say they are
            return self._run(mismatch)

    def _run(self, resume_mismatch: list[dict[str, Any]]) -> dict[str, Any]:
        plan, keys = self.plan, self.plan.keys
        self._remove_stale_temp_files()
        planned = set(keys)
        loop = self.loop = RunLoop(plan, {k: ok for k, ok in plan.store.outcomes().items() if k in planned},
                                   self.server_model)
        loop.on_started, loop.manager = self.on_started, self
        loop.decide()
        todo = deque(job for job in plan.jobs if job.key not in loop.outcomes and plan.stopping.wanted(job.key))
        logger.info("%d episodes planned, %d already done, %d to run -> %s",
                    len(keys), len(keys) - len(todo), len(todo), plan.output_dir)
        start = time.monotonic()
        error = stopped = None
        try:
            if todo:
                self.run_jobs(todo, done=len(keys) - len(todo))
        except OutOfSpaceError as exc:
            error = f"{exc.strerror} with EVALUATION.output_dir={plan.output_dir}"
            raise EvalError(error) from exc
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (wam_gym.utils.stop_signals): say how to resume
            stopped = Stopped.of(exc)
        except BaseException as exc:  # results.json says why the run is incomplete
            error = str(exc) if isinstance(exc, EvalError) else f"{type(exc).__name__}: {exc}"
            raise
        finally:
            run = {"broker": loop.broker_stats, "reruns": loop.reruns, "resume_mismatch": resume_mismatch}
            summary = report(plan, loop.outcomes, run, time.monotonic() - start, error, stopped)
        if stopped is not None:
            raise Stopped(stopped.signum, summary["error"]) from None
        return summary

    def run_jobs(self, todo: deque, done: int) -> None:
        """Run ``todo`` on actors (a seam: tests replace it to look at the run from inside the lock)."""
        self.loop.run(todo, done)

    def _remove_stale_temp_files(self) -> None:
        """Temp files of atomic writes a killed run left (records, results, videos): never counted,
        removed here so they do not pile up (the lock makes this run the only writer)."""
        for path in itertools.chain(*(self.plan.output_dir.glob(p) for p in STALE_TEMP_GLOBS)):
            logger.info("removing %s, left by an interrupted run", path)
            path.unlink(missing_ok=True)
