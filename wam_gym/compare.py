"""``python -m wam_gym.compare RUN_A RUN_B``: is B better than A, on the same episodes?

Trial ``k`` of a task is the same episode in every run with the same protocol (seed ``seed + k``,
LIBERO's init state ``k``, the same env), so two runs pair episode by episode and their
difference is measured far more tightly than two independent success rates allow. Per task and
overall it prints B's success rate minus A's with a paired 95% interval, the exact McNemar
p-value, the trials where the two disagree, and a verdict::

    python -m wam_gym.compare evaluate_results/metaworld/baseline evaluate_results/metaworld/lora
    python -m wam_gym.compare RUN_A RUN_B --json > comparison.json

Statistics (wam_gym/utils/stats.py): per task, Newcombe's (1998) hybrid-score interval for a
difference of paired proportions and the exact conditional McNemar test; overall, the mean of
the per-task differences (each task weighs the same, like the overall success rate) with MOVER
over the tasks' intervals (Zou & Donner 2008) and the exact McNemar test on all discordant pairs.
The verdict follows the test at 1 - ``--level``. Runs whose protocols differ (protocol.json: suite,
simulator version, env kwargs, spaces, seeds, limits) are refused, naming the first field that
differs; only the agents may differ, and the report says how.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from wam_gym.eval.results import ResultStore
from wam_gym.eval.run_protocol import (
    MIXED,
    check_comparable,
    describe,
    differences,
    episode_seed,
    load,
    protocol_hash,
)
from wam_gym.utils.stats import PairedTable, mcnemar_exact, mean_difference_interval, paired_difference_interval

Key = tuple[str, int]


def compare(run_a: str | Path, run_b: str | Path, level: float = 0.95) -> dict[str, Any]:
    """The paired comparison of two evaluation output dirs (B minus A)."""
    a, b = Path(run_a), Path(run_b)
    protocols = {name: load(path) for name, path in (("A", a), ("B", b))}
    check_comparable(protocols["A"], protocols["B"], f"A ({a})", f"B ({b})")
    stores = {name: ResultStore(path, read_only=True, seed=episode_seed(protocols[name]))
              for name, path in (("A", a), ("B", b))}
    outcomes = {name: _outcomes(store) for name, store in stores.items()}
    pairs = sorted(outcomes["A"].keys() & outcomes["B"].keys())
    if not pairs:
        raise ValueError(f"{a} and {b} share no episode (the same task and trial): run both on the same tasks and "
                         "trials (EVALUATION.num_trials, MULTIRUN.task_sets)")
    by_task = {task: [k for k in pairs if k[0] == task] for task in dict.fromkeys(t for t, _ in pairs)}
    tables = {task: PairedTable.from_outcomes(*_columns(keys, outcomes)) for task, keys in by_task.items()}
    tasks = {task: _paired(keys, tables[task], outcomes, level) for task, keys in by_task.items()}
    pooled = sum(list(tables.values())[1:], next(iter(tables.values())))
    overall = {
        "tasks": len(tasks),
        "pairs": pooled.n,
        "a_success_rate": sum(t["a_success_rate"] for t in tasks.values()) / len(tasks),
        "b_success_rate": sum(t["b_success_rate"] for t in tasks.values()) / len(tasks),
        "difference": sum(t["difference"] for t in tasks.values()) / len(tasks),
        "ci": list(mean_difference_interval(list(tables.values()), level)),
        "mcnemar_p": mcnemar_exact(pooled.only_a, pooled.only_b),
        "only_a": pooled.only_a,
        "only_b": pooled.only_b,
    }
    return {
        "a": {"run": str(a), "agent": protocols["A"].get("agent"), "protocol_hash": protocol_hash(protocols["A"])},
        "b": {"run": str(b), "agent": protocols["B"].get("agent"), "protocol_hash": protocol_hash(protocols["B"])},
        "agent_differences": differences(protocols["A"], protocols["B"], ("agent",)),
        "level": level,
        "tasks": tasks,
        "overall": overall,
        "unpaired": {"only_in_a": len(outcomes["A"]) - len(pairs), "only_in_b": len(outcomes["B"]) - len(pairs)},
        # what each run's own records cannot vouch for: settings a resume was allowed to mix, records left out
        "mixed": {name: p.get(MIXED, []) for name, p in protocols.items() if p.get(MIXED)},
        "records_skipped": {name: store.skipped for name, store in stores.items() if store.skipped},
        "verdict": _verdict(overall, level),
    }


def _outcomes(store: ResultStore) -> dict[Key, bool]:
    outcomes = store.outcomes()
    if not outcomes:
        raise ValueError(f"{store.output_dir} has no episode records (episodes/): point at an evaluation's "
                         "EVALUATION.output_dir")
    return outcomes


def _columns(keys: list[Key], outcomes: dict[str, dict[Key, bool]]) -> tuple[list[bool], list[bool]]:
    return [outcomes["A"][k] for k in keys], [outcomes["B"][k] for k in keys]


def _paired(keys: list[Key], table: PairedTable, outcomes: dict[str, dict[Key, bool]], level: float) -> dict[str, Any]:
    a, b = _columns(keys, outcomes)
    return {
        "pairs": table.n,
        "a_success_rate": sum(a) / table.n,
        "b_success_rate": sum(b) / table.n,
        "difference": table.difference,
        "ci": list(paired_difference_interval(table, level)),
        "mcnemar_p": mcnemar_exact(table.only_a, table.only_b),
        "only_a": [trial for (_, trial), x, y in zip(keys, a, b) if x and not y],  # trials only A solved
        "only_b": [trial for (_, trial), x, y in zip(keys, a, b) if y and not x],
    }


def _verdict(overall: dict[str, Any], level: float) -> str:
    d, (low, high), p = overall["difference"], overall["ci"], overall["mcnemar_p"]
    numbers = (f"{100 * d:+.1f} points, {100 * level:g}% CI {100 * low:+.1f} to {100 * high:+.1f}, McNemar p = "
               f"{p:.3g}, {overall['only_a'] + overall['only_b']} of {overall['pairs']} pairs disagree")
    if p < 1 - level:
        better = "B is better than A" if overall["only_b"] > overall["only_a"] else "A is better than B"
        return f"{better} ({numbers})"
    return f"no significant difference between A and B at the {100 * level:g}% level ({numbers})"


def format_report(result: dict[str, Any]) -> str:
    level = f"{100 * result['level']:g}% CI"
    header = ("task", "pairs", "A %", "B %", "B - A", level, "McNemar p", "only A solved", "only B solved")
    rows = [(name, str(t["pairs"]), f"{100 * t['a_success_rate']:.1f}", f"{100 * t['b_success_rate']:.1f}",
             f"{100 * t['difference']:+.1f}", f"{100 * t['ci'][0]:+.1f} to {100 * t['ci'][1]:+.1f}",
             f"{t['mcnemar_p']:.3g}", _trials(t["only_a"]), _trials(t["only_b"]))
            for name, t in result["tasks"].items()]
    o = result["overall"]
    rows.append(("overall (mean of tasks)", str(o["pairs"]), f"{100 * o['a_success_rate']:.1f}",
                 f"{100 * o['b_success_rate']:.1f}", f"{100 * o['difference']:+.1f}",
                 f"{100 * o['ci'][0]:+.1f} to {100 * o['ci'][1]:+.1f}", f"{o['mcnemar_p']:.3g}", str(o["only_a"]),
                 str(o["only_b"])))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join([r[0].ljust(widths[0]), *(x.rjust(w) for x, w in zip(r[1:], widths[1:]))])

    rule = "-" * len(line(header))
    lines = [f"A: {result['a']['run']}", f"B: {result['b']['run']}"]
    if result["agent_differences"]:
        lines.append(f"agents differ: {describe(result['agent_differences'], was='A', now='B')}")
    for name, diffs in result.get("mixed", {}).items():
        lines.append(f"{name} mixes episodes of other settings (resumed with EVALUATION.allow_resume_mismatch=true: "
                     f"{describe(diffs)}): its outcomes are not one agent's")
    for name, reasons in result.get("records_skipped", {}).items():
        lines.append(f"{name}: {len(reasons)} record(s) left out: {reasons[0]}")
    unpaired = result["unpaired"]
    if unpaired["only_in_a"] or unpaired["only_in_b"]:
        lines.append(f"unpaired episodes left out: {unpaired['only_in_a']} only in A, {unpaired['only_in_b']} only in B")
    lines += ["", line(header), rule, *map(line, rows[:-1]), rule, line(rows[-1]), "", f"verdict: {result['verdict']}"]
    return "\n".join(lines)


def _trials(trials: list[int]) -> str:
    shown = ",".join(map(str, trials[:8]))
    return (shown + (f",... ({len(trials)})" if len(trials) > 8 else "")) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wam_gym.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", help="an evaluation's output dir (the baseline)")
    parser.add_argument("run_b", help="another evaluation's output dir, same protocol (the candidate)")
    parser.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals and the test")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = parser.parse_args(argv)
    if not 0.5 <= args.level < 1:
        parser.error(f"--level must be in [0.5, 1), got {args.level}")
    try:
        result = compare(args.run_a, args.run_b, args.level)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
