"""What a run's episodes are: ``protocol.json``, written by every evaluation.

Trial ``k`` of a task is the same episode in two runs (the same env, kwargs, seed, init state,
limits and spaces) exactly when their protocols agree; then their outcomes can be paired
(``python -m wam_gym.compare``) and a later run may resume an earlier one. The file has three parts:

- ``protocol``: the benchmark side, known before any env is built: the seed, the episode-length
  knob, the env kwargs; per task its env id, constructor kwargs, step limit and init-state rule;
  per suite the simulator's distribution and version, image orientation, settle steps (as its envs
  run them) and the termination rule; under a named protocol (``protocol=NAME``), its name and
  every setting it fixes.
- ``observed``: per task, what its env turned out to be when an actor first built it: the action
  space (dtype, shape, bounds), each camera's image shape, the state's shape.
- ``agent``: what acted: the agent kind and, for a WAM, its checkpoint's and statistics' content
  hashes (every byte, wam_gym/eval/fingerprint.py) and the inference settings that change actions;
  for a Python policy its import string and its code's content hash; for a server, its protocol.

A resumed run must match all three (``EVALUATION.allow_resume_mismatch=true`` resumes anyway and
results.json records the differences); ``compare`` requires ``protocol`` and ``observed`` to match
and shows how the ``agent`` parts differ. Tasks are compared where both sides have them, so adding
tasks or trials is no mismatch. results.json carries ``protocol_hash``: a SHA-256 of the canonical
JSON of ``protocol`` and ``observed``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import json
import logging
from pathlib import Path
from typing import Any

from agents.realtime import HOLD_RULE
from envs.protocol import PIXELS, STATE
from envs.registry import suite_of
from wam_gym.eval import protocols
from wam_gym.eval.errors import EvalError, ResumeMismatch
from wam_gym.eval.fingerprint import checkpoint_fingerprint, file_sha256, python_fingerprint
from wam_gym.eval.results import space_checked
from wam_gym.eval.run_files import PROTOCOL_FIELDS, check_fields
from wam_gym.utils.run_dir import and_more, read_record, write_record

logger = logging.getLogger(__name__)

PROTOCOL_FILE = "protocol.json"
LEGACY_IDENTITY_FILE = "run_identity.json"  # written before protocol.json: a flat dict of this module's keys
SECTIONS = ("protocol", "observed", "agent")
COMPARED = ("protocol", "observed")  # what two runs must share for their episodes to pair
PER_NAME = ("suites", "tasks")  # compared per task (suite), where both records have it
TERMINATION = ("an episode ends at its first success (terminated; success counts at any step) or after "
               "max_episode_steps steps (truncated)")
SEED_RULE = ("trial k resets its env with seed EVALUATION.seed + k (and, where a task pins init states, init state k); "
             "its sampling noise derives from that seed")
# Inference knobs that change actions (cross-KV reuse, compile, video decoding do not).
INFERENCE_FIELDS = ("sampler", "num_inference_steps", "shift", "action_horizon", "replan_steps", "video_mode")


# ----------------------------------------------------------------- the parts
def benchmark_protocol(config, tasks, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The benchmark side of a run: everything but the agent that decides what an episode is."""
    ev = config.EVALUATION
    suites, entries = {}, {}
    for task in tasks:
        suite = suite_of(task.env_id)
        kwargs = {**suite.env_kwargs[task.env_id], **task.kwargs, **env_kwargs}
        suites[suite.name] = {
            "simulator": _versions(suite.simulator_module),
            "image_orientation": suite.image_orientation,
            "settle_steps": kwargs.get("settle_steps", suite.settle_steps),  # the env's, where its kwargs set them
            "termination": TERMINATION,
        }
        entries[task.name] = {
            "env_id": task.env_id,
            "kwargs": kwargs,
            "max_episode_steps": protocols.episode_steps(ev, protocols.named(config.protocol), task.env_id),
            "init_state": "init state k for trial k" if task.pins_init_state else None,
        }
    protocol = {
        "EVALUATION.seed": ev.seed,
        "seed_rule": SEED_RULE,
        "EVALUATION.max_episode_steps": ev.max_episode_steps,
        "env_kwargs": env_kwargs,
        "timing": timing(ev),
        "suites": suites,
        "tasks": entries,
        **protocols.record(protocols.named(config.protocol)),  # the protocol and what it fixes (null: nothing)
    }
    return _as_stored(protocol)


def timing(ev) -> dict[str, Any]:
    """Whether the world waits for the model (synchronous) or not (EVALUATION.realtime), and how long it waits."""
    latency = ev.latency()
    if latency is None:
        return {"mode": "synchronous"}
    record = {"mode": "realtime", "latency": latency.describe(), "hold": HOLD_RULE,
              "control_rate": "each suite's simulator's (env.unwrapped.control_hz)"}
    if ev.realtime_strategy != "hold":  # hold's record is the one runs before strategies wrote: they stay comparable
        record["strategy"] = ev.realtime_strategy
    return record


def agent_identity(config, ckpt: Path | None, stats: Path | None) -> dict[str, Any]:
    """What acts, keyed by the names users type: content hashes, not paths (a moved checkpoint is the same)."""
    ev = config.EVALUATION
    identity: dict[str, Any] = {"EVALUATION.agent": ev.agent}
    if ev.agent == "wam":
        identity["ckpt"] = {"path": str(ckpt), "fingerprint": checkpoint_fingerprint(ckpt)}
        if stats is not None:  # a LingBot-VA release has none: its convention's statistics are in protocol.json
            identity["EVALUATION.dataset_stats_path"] = {"path": str(stats), "fingerprint": file_sha256(stats)}
        identity.update({f"EVALUATION.{name}": getattr(ev, name) for name in INFERENCE_FIELDS})
    elif ev.agent == "python":
        identity["EVALUATION.policy"] = {"spec": ev.policy, "fingerprint": python_fingerprint(ev.policy)}
    elif ev.agent == "remote":  # not the url: a server moves, and the url never said which model it serves
        remote = config.REMOTE
        identity.update({"REMOTE.protocol": remote.protocol, "REMOTE.keys": remote.keys, "REMOTE.frames": remote.frames})
    return _as_stored(identity)


def observed_env(env) -> dict[str, Any]:
    """What an env built for a task is (called in the actor that built it)."""
    action, spaces = env.action_space, env.observation_space.spaces
    state = spaces.get(STATE)
    return _as_stored({
        "action_space": {"dtype": str(action.dtype), "shape": list(action.shape),
                         "low": action.low.tolist(), "high": action.high.tolist()},
        "cameras": {camera: list(space.shape) for camera, space in spaces[PIXELS].spaces.items()},
        "state_shape": None if state is None else list(state.shape),
    })


def protocol_hash(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({k: record.get(k) for k in COMPARED}, sort_keys=True).encode()).hexdigest()


@functools.cache
def _versions(module: str) -> dict[str, str]:
    """The installed distributions providing ``module``, with their versions ({} when it is not installed)."""
    names = importlib.metadata.packages_distributions().get(module, [])
    return {name: importlib.metadata.version(name) for name in sorted(set(names))}


def _as_stored(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))  # as it reads back from the file


MIXED = "resumed_despite"  # protocol.json: differences EVALUATION.allow_resume_mismatch let a resume pass


def episode_seed(record: dict[str, Any]) -> int | None:
    """The seed trial k's record must carry, minus k: the record's EVALUATION.seed; None (no check) once a resume
    was allowed to mix settings, whose episodes may carry another."""
    return None if record.get(MIXED) else record.get("protocol", {}).get("EVALUATION.seed")


# ----------------------------------------------------------------- comparing two records
def _fields(record: dict[str, Any], sections: tuple[str, ...]) -> dict[str, Any]:
    """A record as flat, named fields: top-level keys as they are, tasks and suites one field per name and key."""
    flat: dict[str, Any] = {}
    for section in sections:
        part = record.get(section) or {}
        if section == "observed":
            flat.update({f"observed[{t}].{k}": v for t, facts in part.items() for k, v in facts.items()})
            continue
        for key, value in part.items():
            if key in PER_NAME:  # one field per task (suite) and key
                flat.update({f"{key}[{n}].{k}": v for n, entry in value.items() for k, v in entry.items()})
            else:
                flat[key] = value
    return flat


def _task_of(field: str) -> str | None:
    """``"tasks[T]"``, ``"suites[S]"`` or ``"observed[T]"`` for a task's (suite's) field, else None."""
    return field[: field.index("]") + 1] if "[" in field else None


def differences(recorded: dict[str, Any], now: dict[str, Any], sections: tuple[str, ...] = SECTIONS) -> list[dict]:
    """Fields that differ, in ``now``'s order; a task's (suite's) fields only where both records have it."""
    old, new = _fields(recorded, sections), _fields(now, sections)
    both = {_task_of(f) for f in old} & {_task_of(f) for f in new}
    names = list(new) + [f for f in old if f not in new]
    return [{"field": f, "recorded": old.get(f), "now": new.get(f)} for f in names
            if _task_of(f) in both | {None} and _key(old.get(f)) != _key(new.get(f))]


def _legacy_differences(legacy: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
    """An older wam_gym's flat run_identity.json against this run: its keys are still field names here."""
    fields = _fields(now, ("protocol", "agent"))
    return [{"field": k, "recorded": v, "now": fields.get(k)} for k, v in legacy.items() if _key(v) != _key(fields.get(k))]


def _key(value: Any) -> Any:
    """What is compared: content fingerprints, not paths (a policy's import string is in its fingerprint)."""
    return value["fingerprint"] if isinstance(value, dict) and "fingerprint" in value else value


def show(value: Any) -> str:
    if isinstance(value, dict) and "fingerprint" in value:
        content = f"content {value['fingerprint'][:12]}"
        named = value.get("path") or value.get("spec")  # a file's path, a policy's import string
        return f"{named} ({content})" if named else f"({content})"
    return json.dumps(value)


def describe(diffs: list[dict[str, Any]], was: str = "was", now: str = "now") -> str:
    """The first difference in words, and the names of the others: one line."""
    first = diffs[0]
    more = and_more([d["field"] for d in diffs[1:]])
    return f"{first['field']} {was} {show(first['recorded'])}, {now} {show(first['now'])}{more}"


def load(run_dir: Path) -> dict[str, Any]:
    """A run's protocol.json, or an error naming what to do."""
    path = Path(run_dir) / PROTOCOL_FILE
    if not path.is_file():
        raise ValueError(f"{run_dir} has no {PROTOCOL_FILE} (not an evaluation output dir, or written by an older "
                         "wam_gym): rerun its evaluation with EVALUATION.output_dir pointing at it to record one")
    record = read_record(path, "rerun the evaluation into a new output dir")
    if any(not isinstance(record.get(s, {}), dict) for s in SECTIONS):
        raise ValueError(f"{path} is not a protocol record (an object with {', '.join(SECTIONS)}): rerun the "
                         "evaluation into a new output dir")
    check_fields(path, record, PROTOCOL_FIELDS, "restore the field as the evaluation wrote it, or rerun the evaluation "
                 "into a new output dir")
    return record


def check_comparable(a: dict[str, Any], b: dict[str, Any], a_name: str, b_name: str) -> None:
    """Refuse to pair the episodes of two runs whose protocols differ, naming the first field."""
    diffs = differences(a, b, COMPARED)
    if diffs:
        raise ValueError(f"{a_name} and {b_name} ran under different protocols, so their episodes are not the same "
                         f"episodes: {describe(diffs, was=f'is in {a_name}', now=f'in {b_name}')}. Compare runs "
                         "evaluated with the same suite, simulator, env settings and seed")


def reference_outcomes(run_dir: str, record: dict[str, Any], output_dir: Path) -> tuple[dict, dict[tuple[str, int], bool]]:
    """EVALUATION.compare_to's protocol record and episode outcomes by (task, trial), once its protocol
    is known to be this run's (its envs' observed facts are checked as this run's actors build theirs)."""
    from wam_gym.eval.results import ResultStore

    path = Path(run_dir).expanduser()
    if path.resolve() == Path(output_dir).resolve():
        raise ValueError(f"EVALUATION.compare_to={run_dir} is this run's own output_dir: name another run's")
    try:
        reference = load(path)
    except ValueError as exc:
        raise ValueError(f"EVALUATION.compare_to: {exc}") from None
    check_comparable(reference, {"protocol": record["protocol"]}, f"EVALUATION.compare_to={run_dir}", "this run")
    outcomes = ResultStore(path, read_only=True, seed=episode_seed(reference)).outcomes()
    if not outcomes:
        raise ValueError(f"EVALUATION.compare_to={run_dir} has no episode records to compare with: finish that run first")
    return reference, outcomes


# ----------------------------------------------------------------- one run's record
class RunProtocol:
    """This run's protocol.json: checked against the one on disk when resuming, kept up to date as
    actors report what their envs are."""

    def __init__(self, output_dir: Path, protocol: dict[str, Any], agent: dict[str, Any]):
        self.path = Path(output_dir) / PROTOCOL_FILE
        self.record: dict[str, Any] = {"protocol": protocol, "observed": {}, "agent": agent}
        self.allow_mismatch = False
        self.reference: dict[str, Any] | None = None  # EVALUATION.compare_to's record: its envs must be ours

    @property
    def hash(self) -> str:
        return protocol_hash(self.record)

    def resume(self, has_episodes: bool, allow: bool) -> list[dict[str, Any]]:
        """Compare with the record on disk and adopt it (plus this run's new tasks); write it when there
        is none. Returns the differences ``allow`` (EVALUATION.allow_resume_mismatch) lets pass."""
        self.allow_mismatch = allow
        recorded, legacy = self._recorded(has_episodes)
        if recorded is None:
            self._write()
            return self.record.get(MIXED, [])
        diffs = _legacy_differences(recorded, self.record) if legacy else differences(recorded, self.record)
        if diffs and not allow:
            raise ResumeMismatch(
                f"EVALUATION.output_dir={self.path.parent} holds episodes run with other settings: {describe(diffs)}. "
                "Resuming would count them as this run's: use a new EVALUATION.output_dir, or set "
                "EVALUATION.allow_resume_mismatch=true to resume anyway (recorded in results.json)")
        for d in diffs:
            logger.warning("resuming despite %s: was %s, now %s (EVALUATION.allow_resume_mismatch=true)",
                           d["field"], show(d["recorded"]), show(d["now"]))
        if not legacy:  # the episodes on disk keep their own record; tasks new to this run join it
            merged = copy.deepcopy(recorded)
            for key in PER_NAME:
                for name, entry in self.record["protocol"][key].items():
                    merged["protocol"].setdefault(key, {}).setdefault(name, entry)
            if diffs:  # kept for good: the dir now mixes episodes of two settings (compare says so)
                merged[MIXED] = [*recorded.get(MIXED, []), *diffs]
            self.record = merged
        self._write()
        return diffs

    def _recorded(self, has_episodes: bool) -> tuple[dict[str, Any] | None, bool]:
        """(the record the episodes on disk ran under, whether it is an older wam_gym's flat one)."""
        if not has_episodes:  # nothing on disk to credit to the wrong run
            return None, False
        if self.path.is_file():
            try:
                return load(self.path.parent), False
            except ValueError as exc:
                raise ValueError(f"{exc}; or delete {self.path} if its episodes are this run's") from None
        legacy = self.path.with_name(LEGACY_IDENTITY_FILE)
        if legacy.is_file():
            return read_record(legacy, "use a new EVALUATION.output_dir"), True
        # Their settings are unknown (the file was deleted, or an older wam_gym wrote them): crediting them to this
        # run's settings is a guess, made only when asked and then recorded for good.
        if not self.allow_mismatch:
            raise ResumeMismatch(
                f"EVALUATION.output_dir={self.path.parent} holds episodes but no {PROTOCOL_FILE}: the settings they ran "
                "with are unknown, and resuming would count them as this run's. Use a new EVALUATION.output_dir, or "
                "set EVALUATION.allow_resume_mismatch=true to take this run's settings as theirs (recorded)")
        logger.warning("%s has episodes but no %s: taking this run's settings as theirs "
                       "(EVALUATION.allow_resume_mismatch=true, recorded)", self.path.parent, PROTOCOL_FILE)
        self.record[MIXED] = [{"field": PROTOCOL_FILE, "recorded": None, "now": "this run's settings"}]
        return None, False

    def observe(self, task: str, facts: dict[str, Any]) -> None:
        """An actor built ``task``'s env and found ``facts``: recorded, or refused when the episodes
        on disk ran in an env that was different."""
        theirs = (self.reference or {}).get("observed", {}).get(task)
        if theirs is not None and theirs != facts:
            diffs = differences({"observed": {task: theirs}}, {"observed": {task: facts}}, ("observed",))
            raise EvalError(f"the env of {task} is not the one EVALUATION.compare_to's episodes ran in: "
                            f"{describe(diffs)}; compare with a run evaluated in the same env")
        known = self.record["observed"].get(task)
        if known == facts:
            return
        if known is not None:
            diffs = differences({"observed": {task: known}}, {"observed": {task: facts}}, ("observed",))
            message = (f"the env of {task} is not the one this output dir's episodes ran in: {describe(diffs)}; "
                       "use a new EVALUATION.output_dir")
            if not self.allow_mismatch:
                raise EvalError(message)
            logger.warning("%s (EVALUATION.allow_resume_mismatch=true)", message)
            return
        self.record["observed"][task] = facts
        self._write()

    def _write(self) -> None:
        with space_checked(self.path):
            write_record(self.path, self.record, sort_keys=True)
