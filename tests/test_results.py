import csv
import json
import logging
import re

import pytest

from wam_gym.eval.results import (
    IMAGINATION_SCORES,
    EpisodeRecord,
    ResultStore,
    format_table,
    log_tensorboard,
    summarize,
    task_slug,
    write_summary,
)
from wam_gym.utils.stats import wilson

REACH = "wam_gym/MetaWorld-reach-v3"
SPATIAL3 = "wam_gym/LIBERO-Spatial-v0:3"


def _rec(task=REACH, trial=0, success=True, steps=10, **kw) -> EpisodeRecord:
    return EpisodeRecord(task=task, trial=trial, seed=100 + trial, success=success, steps=steps, reward=1.5, **kw)


def _timed(task, trial, success, steps) -> EpisodeRecord:
    return _rec(task, trial, success, steps, env_s=1.0)


def _no_temp_files(root) -> bool:
    return not [p for p in root.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]


# ---------------------------------------------------------------- records and slugs


def test_record_json_round_trip_and_unknown_keys():
    r = _rec(init_state_id=7, wall_time_s=2.5, attempts=2, video="videos/a.mp4", extra={"k": [1, 2]})
    assert EpisodeRecord.from_json(r.to_json()) == r
    data = json.loads(r.to_json()) | {"from_a_newer_version": 1}
    assert EpisodeRecord.from_json(json.dumps(data)) == r


@pytest.mark.parametrize(("field", "value", "why"), [
    ("success", "false", 'field \'success\' is "false" (str), not bool'),  # truthy: it counted as a success
    ("success", 1, "field 'success' is 1 (int), not bool"),
    ("success", None, "field 'success' is null (NoneType), not bool"),
    ("trial", True, "field 'trial' is true (bool), not int"),
    ("steps", 3.0, "field 'steps' is 3.0 (float), not int"),
    ("task", 7, "field 'task' is 7 (int), not str"),
    ("model_s", "2.5", 'field \'model_s\' is "2.5" (str), not float or null'),
    ("extra", [], "field 'extra' is [] (list), not dict"),
    ("success", ..., "field 'success' is missing"),
])
def test_record_fields_must_have_their_types(field, value, why):
    data = json.loads(_rec().to_json())
    if value is ...:
        del data[field]
    else:
        data[field] = value
    with pytest.raises(ValueError) as info:
        EpisodeRecord.from_json(json.dumps(data))
    assert str(info.value) == why
    if value is not ...:
        with pytest.raises(ValueError, match=re.escape(why)):  # nor is such a record written
            EpisodeRecord(**data).to_json()


def test_a_float_field_takes_an_int_and_an_optional_field_null():
    data = json.loads(_rec(model_s=2.5).to_json()) | {"reward": 2, "model_s": None, "init_state_id": None}
    record = EpisodeRecord.from_json(json.dumps(data))
    assert (record.reward, record.model_s, record.init_state_id) == (2, None, None)


def test_a_record_of_the_wrong_types_is_named_and_never_counted(tmp_path, caplog):
    store = ResultStore(tmp_path)
    for trial in range(4):
        store.write(_rec(trial=trial, success=False))
    bad = store.episode_path(REACH, 1)
    bad.write_text(json.dumps(json.loads(bad.read_text()) | {"success": "false"}))
    with caplog.at_level(logging.WARNING, logger="wam_gym.eval.results"):
        summary = summarize(store.records(), [(REACH, t) for t in range(4)])
    assert f"corrupt episode record {bad} (field 'success' is \"false\" (str), not bool)" in caplog.text
    assert (summary["overall"]["episodes"], summary["overall"]["successes"]) == (3, 0) and not summary["complete"]
    assert store.set_aside == [f"{bad}.corrupt"] and store.missing([(REACH, 1)]) == [(REACH, 1)]  # runs again


def test_task_slug_readable_and_injective():
    assert task_slug(SPATIAL3) == "LIBERO-Spatial-v0_3"
    assert task_slug(REACH) == "MetaWorld-reach-v3"
    ids = [REACH, SPATIAL3, "wam_gym/LIBERO-Spatial-v0:30", "wam_gym/LIBERO-Spatial-v0_3", "LIBERO-Spatial-v0:3",
           "other/LIBERO-Spatial-v0:3", "wam_gym/a b", "wam_gym/a_b", "wam_gym/..", "../../etc"]
    slugs = [task_slug(t) for t in ids]
    assert len(set(slugs)) == len(ids)
    for s in slugs:
        assert "/" not in s and s not in (".", "..") and not s.startswith(".")


# ---------------------------------------------------------------- store


def test_write_is_atomic_and_never_counts_twice(tmp_path):
    store = ResultStore(tmp_path)
    assert store.write(_rec(task=SPATIAL3, trial=3, success=True))
    path = store.episode_path(SPATIAL3, 3)
    assert path == tmp_path / "episodes" / "LIBERO-Spatial-v0_3" / "00003.json"
    before = path.read_bytes()
    assert not store.write(_rec(task=SPATIAL3, trial=3, success=False, steps=99))
    assert path.read_bytes() == before
    assert store.records() == [_rec(task=SPATIAL3, trial=3, success=True)]
    assert _no_temp_files(tmp_path)


def test_done_returns_real_task_names_and_ignores_temp_files(tmp_path):
    store = ResultStore(tmp_path)
    store.write(_rec(task=SPATIAL3, trial=1))
    store.write(_rec(task=REACH, trial=0))
    # A leftover of a write killed before os.replace must not count.
    (store.episode_path(REACH, 1).parent / ".00001.json.abc.tmp").write_text(_rec(task=REACH, trial=1).to_json())
    assert store.done() == {(SPATIAL3, 1), (REACH, 0)}
    assert [r.key for r in store.records()] == [(SPATIAL3, 1), (REACH, 0)]  # sorted by task string


def test_corrupt_file_moved_aside_and_rewritten(tmp_path, caplog):
    store = ResultStore(tmp_path)
    store.write(_rec(trial=0))
    torn = store.episode_path(REACH, 1)
    torn.write_text('{"task": "wam_gym/MetaWorld-re')
    with caplog.at_level(logging.WARNING, logger="wam_gym.eval.results"):
        assert store.done() == {(REACH, 0)}
    assert "corrupt" in caplog.text and str(torn) in caplog.text
    assert not torn.exists()
    assert torn.with_name("00001.json.corrupt").read_text() == '{"task": "wam_gym/MetaWorld-re'
    assert store.missing([(REACH, 0), (REACH, 1)]) == [(REACH, 1)]
    assert store.write(_rec(trial=1))
    assert store.done() == {(REACH, 0), (REACH, 1)}


def test_write_replaces_a_corrupt_record(tmp_path):
    store = ResultStore(tmp_path)
    path = store.episode_path(REACH, 2)
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2]")  # valid JSON, not a record
    assert store.write(_rec(trial=2))
    assert EpisodeRecord.from_json(path.read_text()) == _rec(trial=2)
    assert path.with_name("00002.json.corrupt").exists()


def test_record_under_another_episodes_name_is_set_aside(tmp_path, caplog):
    """A valid record copied to another trial's file would count as its own episode and block that
    file forever (write refuses to replace a valid record): every rerun would stay incomplete."""
    store = ResultStore(tmp_path)
    store.write(_rec(trial=0))
    misplaced = store.episode_path(REACH, 1)
    misplaced.write_bytes(store.episode_path(REACH, 0).read_bytes())
    other_task = store.episode_path(SPATIAL3, 0)
    other_task.parent.mkdir(parents=True)
    other_task.write_bytes(store.episode_path(REACH, 0).read_bytes())  # right trial, another task's folder
    with caplog.at_level(logging.WARNING, logger="wam_gym.eval.results"):
        assert store.done() == {(REACH, 0)}
    assert f"{misplaced} holds the record of {REACH} trial 0, whose file is {store.episode_path(REACH, 0)}" in caplog.text
    assert sorted(store.set_aside) == sorted([f"{misplaced}.mismatched", f"{other_task}.mismatched"])
    assert store.missing([(REACH, 0), (REACH, 1), (SPATIAL3, 0)]) == [(REACH, 1), (SPATIAL3, 0)]
    assert store.write(_rec(trial=1)) and store.write(_rec(task=SPATIAL3, trial=0))
    assert store.done() == {(REACH, 0), (REACH, 1), (SPATIAL3, 0)}


def test_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    import errno
    import os

    import wam_gym.eval.results
    import wam_gym.utils.publish
    from wam_gym.eval.results import OutOfSpaceError

    store = ResultStore(tmp_path)
    store.write(_rec(trial=0))
    real_fsync = os.fsync

    def full(fd):  # the data reached the temp file's buffers; the disk refuses the rest
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(wam_gym.utils.publish.os, "fsync", full)
    with pytest.raises(OutOfSpaceError) as info:
        store.write(_rec(trial=1))
    monkeypatch.setattr(wam_gym.utils.publish.os, "fsync", real_fsync)
    assert re.fullmatch(rf"no space left on device writing {re.escape(str(store.episode_path(REACH, 1)))} \(\d+ MiB "
                        r"free; OSError: No space left on device; every record written before is kept\): free space, "
                        r"then run again to resume", str(info.value))
    assert store.done() == {(REACH, 0)} and _no_temp_files(tmp_path)
    with pytest.raises(OutOfSpaceError, match="writing .*results.json"):
        monkeypatch.setattr(wam_gym.eval.results, "atomic_write_text", lambda path, text: full(0))
        write_summary(tmp_path, summarize(store.records(), [(REACH, 0)]))


def test_missing_is_exact_and_in_plan_order(tmp_path):
    store = ResultStore(tmp_path)
    assert store.done() == set() and store.records() == []
    plan = [(SPATIAL3, t) for t in range(3)] + [(REACH, t) for t in range(3)]
    assert store.missing(plan) == plan
    for key in [(REACH, 1), (SPATIAL3, 0), (SPATIAL3, 2)]:
        store.write(_rec(*key))
    assert store.missing(plan) == [(SPATIAL3, 1), (REACH, 0), (REACH, 2)]
    assert store.missing(reversed(plan)) == [(REACH, 2), (REACH, 0), (SPATIAL3, 1)]
    assert store.missing(plan + [(REACH, 0)]) == [(SPATIAL3, 1), (REACH, 0), (REACH, 2)]


# ---------------------------------------------------------------- summaries

A, B = "wam_gym/A-v0", "wam_gym/B-v0"
PLAN = [(A, 0), (A, 1), (A, 2), (A, 3), (B, 0), (B, 1)]


def _records():
    return [  # env_s: each episode's env time, 1 s
        _timed(A, 0, True, 10), _timed(A, 1, False, 50), _timed(A, 2, True, 20), _timed(A, 3, True, 30),
        _timed(B, 0, False, 40), _timed(B, 1, True, 20),
        _rec(B, 7, True, 1), _rec("wam_gym/C-v0", 0, True, 1),  # outside the plan: ignored
    ]


NO_COST = {"model_calls": None, "model_s": None, "denoise_steps": None, "env_s": None, "successes_per_model_s": None}


def test_summarize_numbers():
    s = summarize(_records(), PLAN)
    assert s["tasks"] == {
        A: {"episodes": 4, "successes": 3, "success_rate": 0.75, "success_rate_ci95": [pytest.approx(0.3006, abs=1e-4),
            pytest.approx(0.9544, abs=1e-4)], "mean_steps": 27.5, "cost": {**NO_COST, "env_s": 4.0}},
        B: {"episodes": 2, "successes": 1, "success_rate": 0.5, "success_rate_ci95": [pytest.approx(0.0945, abs=1e-4),
            pytest.approx(0.9055, abs=1e-4)], "mean_steps": 30.0, "cost": {**NO_COST, "env_s": 2.0}},
    }
    # Overall: the mean of the per-task rates (each task weighs the same), MOVER over the Wilson intervals:
    # 0.625 - sqrt(((0.75 - 0.3006) / 2)^2 + ((0.5 - 0.0945) / 2)^2), and the same upwards.
    low = 0.625 - ((0.75 - 0.300642) ** 2 + (0.5 - 0.094531) ** 2) ** 0.5 / 2
    high = 0.625 + ((0.954413 - 0.75) ** 2 + (0.905469 - 0.5) ** 2) ** 0.5 / 2
    assert s["overall"] == {"episodes": 6, "successes": 4, "tasks": 2, "success_rate": 0.625,
                            "success_rate_ci95": [pytest.approx(low, abs=1e-5), pytest.approx(high, abs=1e-5)],
                            "pooled_success_rate": pytest.approx(4 / 6), "cost": {**NO_COST, "env_s": 6.0}}
    assert s["complete"] is True and s["planned"] == 6
    assert "Wilson" in s["intervals"]["task"] and "MOVER" in s["intervals"]["overall"]


def test_summarize_cost_columns():
    records = [_rec(A, 0, True, model_calls=3, model_s=0.5, denoise_steps=30, env_s=2.0),
               _rec(A, 1, False, model_calls=5, model_s=1.5, denoise_steps=50, env_s=3.0),
               _rec(B, 0, True, env_s=1.0)]  # an agent without a model: env time only
    s = summarize(records, [(A, 0), (A, 1), (B, 0)])
    assert s["tasks"][A]["cost"] == {"model_calls": 8, "model_s": 2.0, "denoise_steps": 80, "env_s": 5.0,
                                     "successes_per_model_s": 0.5}
    assert s["tasks"][B]["cost"] == {**NO_COST, "env_s": 1.0}
    assert s["overall"]["cost"] == {"model_calls": 8, "model_s": 2.0, "denoise_steps": 80, "env_s": 6.0,
                                    "successes_per_model_s": 1.0}
    lines = format_table(s).splitlines()
    assert lines[0].split()[-5:] == ["95%", "CI", "model", "s", "succ/model-s"]
    assert lines[2].split()[-2:] == ["2.0", "0.500"] and lines[3].split()[-2:] == ["-", "-"]


def test_summarize_partial_run():
    s = summarize([r for r in _records() if r.task == A and r.trial < 2], PLAN)
    assert s["complete"] is False and s["planned"] == 6
    assert s["tasks"][A]["episodes"] == 2 and s["tasks"][A]["success_rate"] == 0.5
    assert s["tasks"][B] == {"episodes": 0, "successes": 0, "success_rate": None, "success_rate_ci95": None,
                             "mean_steps": None, "cost": NO_COST}
    assert s["overall"]["success_rate"] == 0.5 and s["overall"]["tasks"] == 2  # tasks without records: not in the mean
    assert s["overall"]["success_rate_ci95"] == list(wilson(1, 2))


def test_write_summary_json_and_csv(tmp_path):
    s = summarize(_records(), PLAN)
    extra = {"wall_time_s": 12.5, "config": {"suite": "x", "trials": 4}}
    paths = write_summary(tmp_path, s, extra)
    assert paths == {"json": tmp_path / "results.json", "csv": tmp_path / "results.csv"}
    assert json.loads(paths["json"].read_text()) == {**s, **extra}
    with paths["csv"].open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["task"] for r in rows] == [A, B, "overall"]
    for row in rows[:2]:
        t = s["tasks"][row["task"]]
        assert int(row["episodes"]) == t["episodes"] and int(row["successes"]) == t["successes"]
        assert float(row["success_rate"]) == t["success_rate"] and float(row["mean_steps"]) == t["mean_steps"]
        assert [float(row["ci95_low"]), float(row["ci95_high"])] == t["success_rate_ci95"]
    assert (rows[2]["episodes"], rows[2]["successes"]) == ("6", "4")
    assert float(rows[2]["success_rate"]) == s["overall"]["success_rate"] == 0.625  # the mean of the tasks' rates
    assert [float(rows[2]["ci95_low"]), float(rows[2]["ci95_high"])] == s["overall"]["success_rate_ci95"]
    assert rows[2]["model_s"] == "" and rows[2]["mean_steps"] == ""
    assert _no_temp_files(tmp_path)
    with pytest.raises(ValueError, match="overall"):
        write_summary(tmp_path, s, {"overall": 1})


def test_format_table():
    lines = format_table(summarize(_records(), PLAN)).splitlines()
    assert lines[0].split() == ["task", "episodes", "success", "rate", "%", "95%", "CI"]
    assert lines[2].split() == [A, "4", "3", "75.0", "30.1-95.4"]
    assert lines[3].split() == [B, "2", "1", "50.0", "9.5-90.5"]
    assert lines[-1].split() == ["overall", "6", "4", "62.5", "32.2-85.2"]
    assert len({len(line) for line in lines}) == 1  # aligned


def test_imagination_scores_are_averaged_over_scored_episodes_and_shown():
    def scored(task, trial, psnr, frames=2):
        return _rec(task, trial, imagine_psnr=psnr, imagine_ssim=0.5, copy_psnr=30.0, copy_ssim=0.9, imagine_frames=frames)

    records = [scored(A, 0, 10.0), scored(A, 1, 20.0, 4), _rec(A, 2, imagine_frames=0), _rec(B, 0, imagine_frames=0)]
    s = summarize(records, [(A, 0), (A, 1), (A, 2), (B, 0)])
    assert s["tasks"][A]["imagination"] == {"imagine_psnr": 15.0, "imagine_ssim": 0.5, "copy_psnr": 30.0,
                                            "copy_ssim": 0.9, "episodes": 2, "frames": 6}
    assert s["tasks"][B]["imagination"] == dict.fromkeys(IMAGINATION_SCORES) | {"episodes": 0, "frames": 0}
    assert s["overall"]["imagination"]["imagine_psnr"] == 15.0 and s["overall"]["imagination"]["episodes"] == 2
    lines = format_table(s).splitlines()
    assert lines[0].split() == ["task", "episodes", "success", "rate", "%", "95%", "CI", "imagine", "PSNR", "SSIM", "copy",
                                "PSNR", "SSIM"]
    assert lines[2].split()[-4:] == ["15.00", "0.500", "30.00", "0.900"] and lines[3].split()[-4:] == ["-"] * 4
    assert len({len(line) for line in lines}) == 1
    assert "imagination" not in summarize(_records(), PLAN)["overall"]  # records without the score: no section
    assert EpisodeRecord.from_json(records[0].to_json()) == records[0]


# ---------------------------------------------------------------- tensorboard


def test_log_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'wam_gym[train]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_tensorboard(tmp_path, summarize(_records(), PLAN), step=3)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {f"eval/{name}/{t}" for name in ("success_rate", "success_rate_ci95_low", "success_rate_ci95_high")
                    for t in (A, B, "overall")} | {f"eval/cost/env_s/{t}" for t in (A, B, "overall")}
    (event,) = acc.Scalars(f"eval/success_rate/{A}")
    assert event.step == 3 and event.value == pytest.approx(0.75)
    assert acc.Scalars(f"eval/success_rate_ci95_low/{A}")[0].value == pytest.approx(0.3006, abs=1e-4)
    assert acc.Scalars("eval/success_rate/overall")[0].value == pytest.approx(0.625)
    assert acc.Scalars("eval/cost/env_s/overall")[0].value == pytest.approx(6.0)


def test_log_tensorboard_missing_dependency(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard", None)
    with pytest.raises(RuntimeError, match=r"pip install 'wam_gym\[train\]'"):
        log_tensorboard(tmp_path, summarize(_records(), PLAN))
