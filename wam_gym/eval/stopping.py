"""Stop an evaluation when its answer is known (``EVALUATION.target_ci_halfwidth``, ``EVALUATION.compare_to``).

Checking an interval after every episode and stopping once it looks good makes an ordinary
interval lie: re-checked after each of 200 episodes, a 95% Wilson interval excludes the true rate
at some point in far more than 5% of runs (tests/test_stats.py measures it). Both rules here
therefore use anytime-valid statistics, whose guarantee holds at whatever episode the run stops:

- ``target_ci_halfwidth=h``: a task gets no new trials once its 95% (``EVALUATION.stop_level``)
  **confidence sequence** is at most ``h`` wide on each side: Robbins' beta-binomial mixture
  (Jeffreys prior), valid simultaneously over all episode counts by Ville's inequality.
  ``num_trials`` caps it. results.json reports that interval next to the Wilson one.
- ``compare_to=RUN``: pairs this run's episodes with RUN's (same task and trial) and stops the
  whole run once a **sequential paired test** decides: a beta-mixture test martingale on the
  discordant pairs (under "equally good" each is a fair coin) rejects at level 1 - stop_level,
  or can no longer reject within the remaining planned pairs (then: no difference found).

Stopping only ever skips episodes not yet started: episodes in flight finish and are kept, and a
killed run resumed decides again from the records on disk, so no episode is lost or run twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wam_gym.utils.stats import PairedTable, confidence_sequence, paired_e_value, sequential_paired_decision

Key = tuple[str, int]


# The paired test's words (A: the compare_to run, B: this one) as results.json says them.
DECISIONS = {"B better": "this run is better", "A better": "EVALUATION.compare_to is better",
             "no difference": "no difference found within the planned pairs"}
METHODS = {
    "task_interval": "Robbins' beta-binomial mixture confidence sequence, Jeffreys prior (anytime-valid)",
    "comparison": "beta(1/2, 1/2)-mixture test martingale on the discordant pairs (anytime-valid); "
                  "'no difference' once the remaining planned pairs cannot make it reject",
}


@dataclass
class StoppingRule:
    target_halfwidth: float | None = None  # EVALUATION.target_ci_halfwidth
    reference: dict[Key, bool] | None = None  # EVALUATION.compare_to's outcomes, by (task, trial)
    level: float = 0.95  # EVALUATION.stop_level
    stopped_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> at what, once decided
    intervals: dict[str, list[float]] = field(default_factory=dict)  # task -> its confidence sequence now
    comparison: dict[str, Any] | None = None  # the paired test's state (compare_to)
    _counted: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)  # task -> (successes, episodes)

    @property
    def active(self) -> bool:
        return self.target_halfwidth is not None or self.reference is not None

    @property
    def decided(self) -> bool:
        """The comparison is decided: no episode starts any more."""
        return self.comparison is not None and self.comparison["decision"] is not None

    def wanted(self, key: Key) -> bool:
        """Whether the planned episode ``key`` should still start."""
        return not self.decided and key[0] not in self.stopped_tasks

    def update(self, outcomes: dict[Key, bool], planned: list[Key]) -> None:
        """Decide again from this run's outcomes so far, by (task, trial), and the plan."""
        if self.target_halfwidth is not None:
            self._check_tasks(outcomes)
        if self.reference is not None and not self.decided:
            self._check_comparison(outcomes, planned)

    def _check_tasks(self, outcomes: dict[Key, bool]) -> None:
        per_task: dict[str, list[bool]] = {}
        for (task, _), success in outcomes.items():
            per_task.setdefault(task, []).append(success)
        for task, results in per_task.items():
            counts = (sum(results), len(results))
            if self._counted.get(task) == counts:  # no new episode of this task: its interval stands
                continue
            self._counted[task] = counts
            low, high = confidence_sequence(*counts, alpha=1 - self.level)
            self.intervals[task] = [low, high]
            if task not in self.stopped_tasks and (high - low) / 2 <= self.target_halfwidth:
                self.stopped_tasks[task] = {"episodes": len(results), "confidence_sequence": [low, high]}

    def _check_comparison(self, outcomes: dict[Key, bool], planned: list[Key]) -> None:
        pairs = [k for k in outcomes if k in self.reference]
        table = PairedTable.from_outcomes([self.reference[k] for k in pairs], [outcomes[k] for k in pairs])
        remaining = sum(1 for k in planned if k in self.reference and k not in outcomes and self.wanted(k))
        self.comparison = {
            "pairs": table.n, "only_reference_succeeded": table.only_a, "only_this_run_succeeded": table.only_b,
            "e_value": paired_e_value(table.only_a, table.only_b), "remaining_pairs": remaining,
            "decision": DECISIONS.get(decision := sequential_paired_decision(
                table.only_a, table.only_b, remaining, alpha=1 - self.level), decision),
        }

    def report(self) -> dict[str, Any] | None:
        """What results.json says of the rule (None when no rule is set)."""
        if not self.active:
            return None
        return {"target_ci_halfwidth": self.target_halfwidth, "level": self.level, "methods": METHODS,
                "confidence_sequences": self.intervals, "stopped_tasks": self.stopped_tasks,
                "comparison": self.comparison}
