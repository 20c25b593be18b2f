"""Find the evaluation manager's fastest concurrency settings by running it over a grid.

    python scripts/tune_eval_concurrency.py \\
      --benchmark robocasa --env-counts 4,8 --batch-sizes 2,4,8 --wait-ms 0,10 --repeats 1 \\
      --timeout-seconds 3600 --monitor-gpu-ids 2,3,5 -- \\
      task=... ckpt=... EVALUATION.num_trials=2 'MULTIRUN.task_sets=[atomic_seen]' MULTIRUN.num_gpus=3
    # LIBERO-Pro's 16 perturbed sets (benchmark=libero_pro), or one of them, with a checkpoint:
    python scripts/tune_eval_concurrency.py --benchmark libero_pro --env-counts 4,8 --batch-sizes 4,8 -- \
      ckpt=... EVALUATION.num_trials=2 'MULTIRUN.task_sets=[libero_pro_spatial_swap]' MULTIRUN.num_gpus=1

Each configuration (envs per worker x inference batch size x batch wait ms, repeated
--repeats times) is one run of `python -m wam_gym.eval benchmark=<name> <overrides after -->
<the tuner's own overrides>`, in its own output directory under
evaluate_results/concurrency_tuning/<benchmark>/<timestamp>/runs/<run_name>/. Combinations
whose batch size exceeds the env count (the actor count) are skipped: a batch could never fill.

Every run is classified ok / failed / timeout / oom. The recommendation is the smallest
configuration (fewest envs, then smallest batch, then smallest wait) whose median wall time is
within 3% of the fastest fully successful configuration: smaller settings use less memory and
leave headroom, and a difference under 3% is within run-to-run noise. Exit status 1 when no
configuration succeeded on every repeat.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

# The overrides this tuner sets on every run; user copies of them are dropped (ours win).
OWNED_KEYS = (
    "EVALUATION.output_dir",
    "MULTIRUN.env_num_per_worker",
    "MULTIRUN.inference_batch_size",
    "MULTIRUN.inference_batch_wait_ms",
)
RECOMMEND_TOLERANCE = 0.03
OOM_PATTERNS = (
    "CUDA out of memory",
    "OutOfMemoryError",
    "torch.OutOfMemoryError",
    "Killed",
    "MemoryError",
    "cannot allocate memory",
)
_OOM_RE = re.compile("|".join(re.escape(p) for p in OOM_PATTERNS), re.IGNORECASE)
NVIDIA_SMI_QUERY = ["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
GPU_SAMPLE_INTERVAL_S = 1.0
KILL_GRACE_S = 10.0  # SIGTERM first so the manager can stop its workers, then SIGKILL


# ------------------------------------------------------------------ data


@dataclasses.dataclass(frozen=True, order=True)
class Config:
    """One point of the grid; the field order is the 'smallest first' order."""

    env_count: int
    batch_size: int
    wait_ms: float

    @property
    def name(self) -> str:
        return f"env{self.env_count}_bs{self.batch_size}_wait{format_number(self.wait_ms)}"

    def overrides(self) -> list[str]:
        return [
            f"MULTIRUN.env_num_per_worker={self.env_count}",
            f"MULTIRUN.inference_batch_size={self.batch_size}",
            f"MULTIRUN.inference_batch_wait_ms={format_number(self.wait_ms)}",
        ]


@dataclasses.dataclass
class RunRecord:
    """One launch of the manager, as stored in results.json."""

    name: str
    env_count: int
    batch_size: int
    wait_ms: float
    repeat: int
    command: list[str]
    output_dir: str
    exit_code: int | None = None
    wall_s: float | None = None
    status: str = "pending"  # ok / failed / timeout / oom
    error_kind: str | None = None  # why it is not ok: timeout, oom_message, sigkill, exit_code, ...
    error: str | None = None
    oom_line: str | None = None  # first log line matching an OOM pattern, even on an ok run
    peak_gpu_memory_mib: dict[str, int | None] | None = None  # None: not sampled (no nvidia-smi)
    manager_summary: dict | None = None

    @property
    def config(self) -> Config:
        return Config(self.env_count, self.batch_size, self.wait_ms)


@dataclasses.dataclass
class ConfigSummary:
    """One row of summary.csv: every repeat of one configuration."""

    env_count: int
    batch_size: int
    wait_ms: float
    runs: int = 0
    ok_runs: int = 0
    episodes: int = 0
    successes: int = 0
    median_wall_s: float | None = None  # over the ok runs
    status: str = "ok"  # ok (every repeat ok), skipped, or the run statuses seen

    @property
    def config(self) -> Config:
        return Config(self.env_count, self.batch_size, self.wait_ms)


# ------------------------------------------------------------------ pure helpers


def format_number(value: float) -> str:
    """10.0 -> '10', 2.5 -> '2.5': the form a user would type in an override."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_list(text: str, kind: type, minimum: float, what: str) -> list:
    """'4,8' -> [4, 8]; duplicates dropped, order kept. Raises ValueError with a readable message."""
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in items):
        raise ValueError(f"{what}: expected a comma-separated list such as 4,8, got {text!r}")
    values = []
    for part in items:
        try:
            value = kind(part)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise ValueError(f"{what}: {part!r} is not {noun} (in {text!r})") from None
        if value < minimum:
            bound = "positive" if minimum > 0 else "non-negative"
            raise ValueError(f"{what}: {part!r} must be {bound}")
        if value not in values:
            values.append(value)
    return values


def override_key(override: str) -> str:
    """'++MULTIRUN.x=3' -> 'MULTIRUN.x'; also handles Hydra's '+' and '~' prefixes."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def split_forwarded(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split the user's overrides into (kept, dropped): the tuner owns OWNED_KEYS."""
    kept, dropped = [], []
    for override in overrides:
        (dropped if override_key(override) in OWNED_KEYS else kept).append(override)
    return kept, dropped


def build_grid(
    env_counts: Sequence[int], batch_sizes: Sequence[int], wait_ms: Sequence[float]
) -> tuple[list[Config], list[Config]]:
    """All (env, batch, wait) combinations as (to_run, skipped); a batch larger than the actor count never fills."""
    to_run, skipped = [], []
    for env_count in env_counts:
        for batch_size in batch_sizes:
            for wait in wait_ms:
                config = Config(env_count, batch_size, wait)
                (skipped if batch_size > env_count else to_run).append(config)
    return to_run, skipped


def build_command(module: str, benchmark: str, forwarded: Sequence[str], config: Config, output_dir: Path | str) -> list[str]:
    # Owned overrides go last so that, were one to slip through, Hydra's last value would still be ours.
    return [
        sys.executable,
        "-m",
        module,
        f"benchmark={benchmark}",
        *forwarded,
        f"EVALUATION.output_dir={output_dir}",
        *config.overrides(),
    ]


def find_oom_line(log_text: str) -> str | None:
    for line in log_text.splitlines():
        if _OOM_RE.search(line):
            return line.strip()
    return None


def read_manager_summary(output_dir: Path) -> tuple[dict | None, str | None]:
    """(summary, error_kind): the fields of the manager's results.json this tuner reports."""
    path = output_dir / "results.json"
    if not path.is_file():
        return None, "missing_results"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, "bad_results"
    if not isinstance(data, dict):
        return None, "bad_results"
    return {key: data.get(key) for key in ("complete", "overall", "wall_time_s")}, None


def classify(
    exit_code: int | None, timed_out: bool, oom_line: str | None, summary: dict | None, summary_error: str | None
) -> tuple[str, str | None, str | None]:
    """(status, error_kind, error) of one run.

    OOM messages only explain a failed run: a manager that exits 0 with complete results did its
    job, and a bare "killed" in an ordinary log line must not disqualify a configuration.
    A SIGKILL we did not send is the kernel's OOM killer in practice (what shells print as "Killed").
    """
    if timed_out:
        return "timeout", "timeout", "ran past --timeout-seconds; process group killed"
    if exit_code == 0 and summary_error is None and summary.get("complete") is True:
        return "ok", None, None
    if exit_code == 0 and summary_error is not None:
        why = "results.json missing" if summary_error == "missing_results" else "results.json unreadable"
        failure = ("failed", summary_error, f"exit code 0 but {why}")
    elif exit_code == 0:
        failure = ("failed", "incomplete", f"manager results.json says complete={summary.get('complete')!r}")
    else:
        failure = ("failed", "exit_code", f"exit code {exit_code}")
    if oom_line is not None:
        return "oom", "oom_message", oom_line
    if exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "oom", "sigkill", f"killed by SIGKILL (exit code {exit_code}), likely the OOM killer"
    return failure


def parse_gpu_memory(text: str) -> dict[int, int]:
    """nvidia-smi's 'index, memory.used' CSV lines -> {index: MiB}; malformed lines are ignored."""
    used = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            used[int(parts[0])] = int(parts[1])
    return used


def summarize(runs: Sequence[RunRecord], grid: Sequence[Config], skipped: Sequence[Config]) -> list[ConfigSummary]:
    """One ConfigSummary per grid point (skipped ones included), smallest configuration first."""
    rows = []
    for config in grid:
        mine = [run for run in runs if run.config == config]
        ok = [run for run in mine if run.status == "ok"]
        row = ConfigSummary(config.env_count, config.batch_size, config.wait_ms, runs=len(mine), ok_runs=len(ok))
        for run in mine:
            overall = (run.manager_summary or {}).get("overall") or {}
            row.episodes += int(overall.get("episodes") or 0)
            row.successes += int(overall.get("successes") or 0)
        row.median_wall_s = statistics.median(run.wall_s for run in ok) if ok else None
        statuses = sorted({run.status for run in mine})
        row.status = "ok" if mine and statuses == ["ok"] else "+".join(statuses) or "not_run"
        rows.append(row)
    rows += [ConfigSummary(c.env_count, c.batch_size, c.wait_ms, status="skipped") for c in skipped]
    return sorted(rows, key=lambda row: row.config)


def recommend(rows: Sequence[ConfigSummary], tolerance: float = RECOMMEND_TOLERANCE) -> ConfigSummary | None:
    """The smallest fully successful configuration whose median is within `tolerance` of the fastest one's."""
    good = [
        row for row in rows if row.status == "ok" and row.runs > 0 and row.ok_runs == row.runs and row.median_wall_s is not None
    ]
    if not good:
        return None
    fastest = min(row.median_wall_s for row in good)
    close = [row for row in good if row.median_wall_s <= fastest * (1 + tolerance)]
    return min(close, key=lambda row: row.config)


# ------------------------------------------------------------------ running


class GpuMonitor:
    """Samples nvidia-smi every second on a thread while one run is going; keeps each GPU's peak."""

    def __init__(self, nvidia_smi: str, gpu_ids: Sequence[int] | None):
        self.nvidia_smi = nvidia_smi
        self.gpu_ids = list(gpu_ids) if gpu_ids else None
        self.peaks: dict[int, int | None] = dict.fromkeys(self.gpu_ids or [])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> GpuMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        # Sample before waiting, so even a run shorter than the interval gets one sample.
        while True:
            self._sample()
            if self._stop.wait(GPU_SAMPLE_INTERVAL_S):
                return

    def _sample(self) -> None:
        try:
            out = subprocess.run([self.nvidia_smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return  # a missed sample is not worth failing the run for
        for index, mib in parse_gpu_memory(out).items():
            if self.gpu_ids is None or index in self.gpu_ids:
                previous = self.peaks.get(index)
                self.peaks[index] = mib if previous is None else max(previous, mib)

    def result(self) -> dict[str, int | None]:
        return {str(index): self.peaks[index] for index in sorted(self.peaks)}


def kill_group(process: subprocess.Popen) -> None:
    """Stop the manager and everything it started (its workers share its process group)."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        if grace is not None:
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
    process.wait()


def launch(command: list[str], log_path: Path, timeout_s: float) -> tuple[int | None, bool, float]:
    """Run command with its stdout+stderr in log_path; (exit_code, timed_out, wall_s)."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        # A new session makes the manager a process-group leader, so a timeout can kill its workers too.
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            exit_code = process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(process)
            exit_code, timed_out = process.returncode, True
        except BaseException:  # Ctrl-C: leave no manager behind
            kill_group(process)
            raise
    return exit_code, timed_out, time.monotonic() - start


def execute(run: RunRecord, run_dir: Path, timeout_s: float, nvidia_smi: str | None, gpu_ids: Sequence[int] | None) -> None:
    """Launch one run and fill in its outcome fields."""
    output_dir = Path(run.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "command.txt").write_text(shlex.join(run.command) + "\n")
    log_path = run_dir / "manager.log"
    if nvidia_smi is None:
        run.exit_code, timed_out, run.wall_s = launch(run.command, log_path, timeout_s)
    else:
        with GpuMonitor(nvidia_smi, gpu_ids) as monitor:
            run.exit_code, timed_out, run.wall_s = launch(run.command, log_path, timeout_s)
        run.peak_gpu_memory_mib = monitor.result()
    run.oom_line = find_oom_line(log_path.read_text(errors="replace"))
    run.manager_summary, summary_error = read_manager_summary(output_dir)
    run.status, run.error_kind, run.error = classify(run.exit_code, timed_out, run.oom_line, run.manager_summary, summary_error)


# ------------------------------------------------------------------ output


def new_session_dir(root: Path, benchmark: str) -> Path:
    base = root / benchmark / datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():  # two tunings started within the same second
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def recommendation_dict(best: ConfigSummary, rows: Sequence[ConfigSummary], manager_cmd: list[str]) -> dict:
    fastest = min(row.median_wall_s for row in rows if row.status == "ok" and row.median_wall_s is not None)
    return {
        "env_num_per_worker": best.env_count,
        "inference_batch_size": best.batch_size,
        "inference_batch_wait_ms": best.wait_ms,
        "median_wall_s": best.median_wall_s,
        "fastest_median_wall_s": fastest,
        "tolerance": RECOMMEND_TOLERANCE,
        "overrides": best.config.overrides(),
        "command": shlex.join([*manager_cmd, *best.config.overrides()]),
    }


def write_results(
    path: Path, header: dict, runs: Sequence[RunRecord], rows: Sequence[ConfigSummary] | None, recommendation: dict | None
) -> None:
    data = {
        **header,
        "runs": [dataclasses.asdict(run) for run in runs],
        "configurations": [dataclasses.asdict(row) for row in rows] if rows is not None else None,
        "recommendation": recommendation,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)  # atomic: an interrupted tuning leaves the previous complete file


SUMMARY_COLUMNS = (
    "env_num_per_worker",
    "inference_batch_size",
    "inference_batch_wait_ms",
    "runs",
    "ok_runs",
    "episodes",
    "successes",
    "median_wall_s",
    "status",
)


def write_summary_csv(path: Path, rows: Sequence[ConfigSummary]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(SUMMARY_COLUMNS)
        for row in rows:
            median = "" if row.median_wall_s is None else f"{row.median_wall_s:.3f}"
            writer.writerow(
                [
                    row.env_count,
                    row.batch_size,
                    format_number(row.wait_ms),
                    row.runs,
                    row.ok_runs,
                    row.episodes,
                    row.successes,
                    median,
                    row.status,
                ]
            )


def print_table(rows: Sequence[ConfigSummary]) -> None:
    print(f"\n{'envs':>5} {'batch':>5} {'wait_ms':>7} {'runs':>4} {'ok':>3} {'succ/eps':>9} {'median_s':>9}  status")
    for row in rows:
        median = "-" if row.median_wall_s is None else f"{row.median_wall_s:.1f}"
        score, wait = f"{row.successes}/{row.episodes}", format_number(row.wait_ms)
        counts = f"{row.runs:>4} {row.ok_runs:>3} {score:>9}"
        print(f"{row.env_count:>5} {row.batch_size:>5} {wait:>7} {counts} {median:>9}  {row.status}")


# ------------------------------------------------------------------ CLI


def _list_type(kind: type, minimum: float, what: str):
    def parse(text: str) -> list:
        try:
            return parse_list(text, kind, minimum, what)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def _positive(kind: type, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: {text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what}: must be positive, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run the evaluation manager over a grid of concurrency settings and recommend the fastest small one.",
        usage="%(prog)s --benchmark NAME [options] [-- MANAGER_OVERRIDE ...]",
        epilog=f"Everything after '--' is passed to the manager as Hydra overrides, except {', '.join(OWNED_KEYS)}, "
        "which the tuner sets itself (user copies are dropped with a note).",
    )
    parser.add_argument("--benchmark", required=True, help="benchmark name, passed to the manager as benchmark=NAME")
    parser.add_argument(
        "--env-counts",
        type=_list_type(int, 1, "--env-counts"),
        default=[4, 8],
        help="comma-separated MULTIRUN.env_num_per_worker values (default: 4,8)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=_list_type(int, 1, "--batch-sizes"),
        default=[2, 4, 8],
        help="comma-separated MULTIRUN.inference_batch_size values (default: 2,4,8)",
    )
    parser.add_argument(
        "--wait-ms",
        type=_list_type(float, 0, "--wait-ms"),
        default=[0.0, 10.0],
        help="comma-separated MULTIRUN.inference_batch_wait_ms values, >= 0 (default: 0,10)",
    )
    parser.add_argument(
        "--repeats",
        type=_positive(int, "--repeats"),
        default=1,
        help="runs per configuration; the median wall time is compared (default: 1)",
    )
    parser.add_argument(
        "--timeout-seconds",
        type=_positive(float, "--timeout-seconds"),
        default=3600.0,
        help="kill a run (its whole process group) after this many seconds (default: 3600)",
    )
    parser.add_argument(
        "--monitor-gpu-ids",
        type=_list_type(int, 0, "--monitor-gpu-ids"),
        default=None,
        help="comma-separated GPU indices whose peak memory is recorded (default: all GPUs nvidia-smi lists)",
    )
    parser.add_argument(
        "--output-root",
        type=Path,
        default=Path("evaluate_results/concurrency_tuning"),
        help="base directory; results go to ROOT/<benchmark>/<timestamp>/ (default: %(default)s)",
    )
    parser.add_argument(
        "--manager-module", default="wam_gym.eval", help="module run as 'python -m MODULE' (default: %(default)s)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the commands and skipped combinations; launch and write nothing"
    )
    return parser


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split at the first '--': before it the tuner's options, after it the manager's overrides."""
    argv = list(argv)
    own, forwarded = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = build_parser()
    args = parser.parse_args(own)
    if any(override_key(o) == "benchmark" for o in forwarded):
        parser.error("pass the benchmark with --benchmark, not as benchmark=... after '--'")
    return args, forwarded


def main(argv: Sequence[str] | None = None) -> int:
    args, user_overrides = parse_args(sys.argv[1:] if argv is None else argv)
    forwarded, dropped = split_forwarded(user_overrides)
    for override in dropped:
        print(f"note: dropping forwarded override {override!r}: the tuner sets {override_key(override)} itself")
    grid, skipped = build_grid(args.env_counts, args.batch_sizes, args.wait_ms)
    # Absolute, so the manager writes to the right place even if Hydra changes its working directory.
    session_dir = new_session_dir(args.output_root.absolute(), args.benchmark)

    # Repeats form the outer loop: each pass visits every configuration once, so slow drift
    # (thermals, other jobs on the node) spreads over all configurations instead of biasing one.
    runs = []
    for repeat in range(1, args.repeats + 1):
        for config in grid:
            name = f"{config.name}_r{repeat}"
            output_dir = session_dir / "runs" / name / "output"
            command = build_command(args.manager_module, args.benchmark, forwarded, config, output_dir)
            runs.append(RunRecord(name, config.env_count, config.batch_size, config.wait_ms, repeat, command, str(output_dir)))

    for config in skipped:
        print(f"skip {config.name}: batch size {config.batch_size} > env count {config.env_count}")
    if args.dry_run:
        print(f"dry run: {len(runs)} run(s) would write under {session_dir}")
        for run in runs:
            print(f"[{run.name}] output: {run.output_dir}\n  {shlex.join(run.command)}")
        return 0
    if not runs:
        print("error: every combination was skipped (batch size > env count); nothing to run", file=sys.stderr)
        return 1

    nvidia_smi = shutil.which("nvidia-smi")
    gpu_note = None if nvidia_smi else "nvidia-smi not found: peak GPU memory is not sampled (recorded as null)"
    if gpu_note:
        print(f"note: {gpu_note}")
    session_dir.mkdir(parents=True)
    manager_cmd = [sys.executable, "-m", args.manager_module, f"benchmark={args.benchmark}", *forwarded]
    header = {
        "benchmark": args.benchmark,
        "created": datetime.now().isoformat(timespec="seconds"),
        "tuner_argv": list(sys.argv[1:] if argv is None else argv),
        "manager_module": args.manager_module,
        "forwarded_overrides": forwarded,
        "dropped_overrides": dropped,
        "env_counts": args.env_counts,
        "batch_sizes": args.batch_sizes,
        "wait_ms": args.wait_ms,
        "repeats": args.repeats,
        "timeout_seconds": args.timeout_seconds,
        "monitor_gpu_ids": args.monitor_gpu_ids,
        "gpu_monitoring": gpu_note or f"sampled with {nvidia_smi} every {GPU_SAMPLE_INTERVAL_S:g} s",
        "skipped": [{**dataclasses.asdict(c), "reason": "batch size > env count"} for c in skipped],
    }
    results_path = session_dir / "results.json"
    print(f"tuning {args.benchmark}: {len(runs)} run(s), results in {session_dir}")
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.name} ...", flush=True)
        execute(run, session_dir / "runs" / run.name, args.timeout_seconds, nvidia_smi, args.monitor_gpu_ids)
        detail = f" ({run.error})" if run.error else ""
        memory = f", peak GPU MiB {run.peak_gpu_memory_mib}" if run.peak_gpu_memory_mib else ""
        print(f"[{i}/{len(runs)}] {run.name}: {run.status} in {run.wall_s:.1f} s{detail}{memory}", flush=True)
        if run.status == "ok" and run.oom_line:
            print(f"  note: the log mentions memory trouble although the run succeeded: {run.oom_line}")
        write_results(results_path, header, runs, None, None)  # keep what is done if the tuning is interrupted

    rows = summarize(runs, grid, skipped)
    best = recommend(rows)
    recommendation = recommendation_dict(best, rows, manager_cmd) if best else None
    write_results(results_path, header, runs, rows, recommendation)
    write_summary_csv(session_dir / "summary.csv", rows)
    print_table(rows)
    print(f"\nresults: {results_path}\nsummary: {session_dir / 'summary.csv'}")
    if recommendation is None:
        print("no configuration succeeded on every repeat: no recommendation")
        return 1
    fastest = recommendation["fastest_median_wall_s"]
    print(
        f"\nrecommended: {best.env_count} env(s) per worker, inference batch {best.batch_size}, "
        f"wait {format_number(best.wait_ms)} ms (median {best.median_wall_s:.1f} s; fastest {fastest:.1f} s; "
        f"the smallest within {RECOMMEND_TOLERANCE:.0%})"
    )
    print("overrides: " + " ".join(recommendation["overrides"]))
    print("command:   " + recommendation["command"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
