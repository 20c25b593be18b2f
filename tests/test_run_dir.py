"""wam_gym/utils/run_dir.py, the output dir mechanics training and evaluation share: the lock, the
writable check, the identity record and resume check, and the one disk-full error. A holder killed
outright frees the lock: tests/test_eval_guards.py SIGKILLs one."""

from __future__ import annotations

import errno
import json
import os
import pickle
from pathlib import Path

import pytest

from wam_gym.utils import run_dir
from wam_gym.utils.run_dir import DiskFullError, OutputDirBusy, ResumeMismatchError

# ---------------------------------------------------------------------------------------------- the lock


def test_a_second_writer_is_refused_in_one_line_naming_the_dir_the_holder_and_the_fix(tmp_path):
    out = tmp_path / "run"
    with run_dir.locked(out, run_dir.TRAIN_LOCK, knob="output_dir", what="training run"):
        assert (out / "train.lock").read_text().startswith(f"pid {os.getpid()} on ")
        with pytest.raises(OutputDirBusy) as info:
            with run_dir.locked(out, run_dir.TRAIN_LOCK, knob="output_dir", what="training run"):
                pass
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"output_dir={out} is in use by another training run (pid {os.getpid()} on ")
    assert message.endswith("): wait for it to finish, or use another output_dir")
    assert (out / "train.lock").read_text() == ""  # released: names nobody, and stays visible (not a temp file)


def test_training_and_evaluation_each_have_their_own_lock(tmp_path):
    from training import run_dir as training_run_dir

    with training_run_dir.locked(tmp_path), run_dir.locked(tmp_path, run_dir.EVAL_LOCK):
        with pytest.raises(OutputDirBusy, match=rf"^output_dir={tmp_path} is in use by another training run \(pid "):
            with training_run_dir.locked(tmp_path):
                pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.lock", "train.lock"]


def test_the_caller_chooses_the_error_class(tmp_path):
    from wam_gym.eval.errors import EvalError
    from wam_gym.eval.errors import OutputDirBusy as EvalBusy

    with run_dir.locked(tmp_path, run_dir.EVAL_LOCK):
        with pytest.raises(EvalBusy, match=r"EVALUATION\.output_dir=\S+ is in use by another evaluation") as info:
            with run_dir.locked(tmp_path, run_dir.EVAL_LOCK, knob="EVALUATION.output_dir", what="evaluation",
                                error=EvalBusy):
                pass
    assert isinstance(info.value, EvalError) and isinstance(info.value, OutputDirBusy)


# ---------------------------------------------------------------------------------------------- writable


def test_check_writable_names_the_knob(tmp_path, monkeypatch):
    run_dir.check_writable(tmp_path / "new" / "deeper", "output_dir")  # creatable: fine
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"^output_dir=\S+/file is a file, not a directory: pass a directory path$"):
        run_dir.check_writable(tmp_path / "file", "output_dir")
    with pytest.raises(ValueError, match=r"^EVALUATION\.output_dir=\S+/file/out is a file, not a directory \(\S+/file "
                                         r"is a file\)"):
        run_dir.check_writable(tmp_path / "file" / "out", "EVALUATION.output_dir")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and Path(p) != tmp_path)
    with pytest.raises(ValueError, match=r"^output_dir=\S+ is not writable \(\S+: permission denied\): pass a "
                                         r"directory you can write to$"):
        run_dir.check_writable(tmp_path / "out", "output_dir")


# ---------------------------------------------------------------------------------------------- the identity record


def test_a_record_reads_back_or_fails_in_one_line(tmp_path):
    path = run_dir.write_record(tmp_path / "r.json", {"b": 1, "a": {"c": [1, 2]}}, sort_keys=True)
    assert run_dir.read_record(path, "fix") == {"a": {"c": [1, 2]}, "b": 1}
    assert path.read_text().endswith("}\n") and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    path.write_text("{")
    with pytest.raises(ValueError, match=r"r\.json is not readable JSON \(.*\): do this$"):
        run_dir.read_record(path, "do this")
    path.write_text("[1]")
    with pytest.raises(ValueError, match=r"r\.json holds a JSON list, not an object: do this$"):
        run_dir.read_record(path, "do this")


def test_differences_compare_the_keys_both_records_have_less_the_ignored(tmp_path):
    saved = {"lr": 1e-4, "model": {"dim": 8, "heads": 2}, "max_steps": 10}
    now = {"lr": 1e-3, "model": {"dim": 16, "heads": 2}, "max_steps": 99, "new_knob": 1}
    assert run_dir.differences(saved, now, lambda key: key == "max_steps") == [
        ("lr", 1e-4, 1e-3), ("model.dim", 8, 16)]


def test_resume_is_refused_unless_allowed_and_an_allowed_one_is_recorded_beside(tmp_path):
    def refusal(saved, diffs):
        return f"{saved.name}: {diffs[0][0]}{run_dir.and_more([d[0] for d in diffs[1:]])}"

    def check(record, allow=False):
        return run_dir.check_resume(tmp_path, "cfg.json", record, allow=allow, ignore=lambda k: False, refusal=refusal)

    assert check({"a": 1}) == []  # nothing saved: nothing to compare
    assert run_dir.record_settings(tmp_path, "cfg.json", {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, resuming=False,
                                   mismatched=False) == tmp_path / "cfg.json"
    with pytest.raises(ResumeMismatchError, match=r"^cfg\.json: a \(and 4 more: b, c, d, \.\.\.\)$"):
        check({"a": 2, "b": 2, "c": 2, "d": 2, "e": 2})
    with pytest.raises(ResumeMismatchError, match=r"^cfg\.json: a$"):
        check({"a": 2, "b": 1})
    assert check({"a": 2}, allow=True) == [("a", 1, 2)]
    assert run_dir.record_settings(tmp_path, "cfg.json", {"a": 2}, resuming=True, mismatched=True) == \
        tmp_path / "cfg.resumed-1.json"
    assert check({"a": 2}) == []  # compared with the newest record
    assert run_dir.record_settings(tmp_path, "cfg.json", {"a": 2}, resuming=True, mismatched=False) is None
    assert run_dir.record_settings(tmp_path, "cfg.json", {"a": 3}, resuming=True, mismatched=True) == \
        tmp_path / "cfg.resumed-2.json"
    assert [p.name for p in run_dir.saved_records(tmp_path, "cfg.json")] == [
        "cfg.json", "cfg.resumed-1.json", "cfg.resumed-2.json"]
    assert json.loads((tmp_path / "cfg.json").read_text())["a"] == 1  # the original, never overwritten
    run_dir.record_settings(tmp_path, "cfg.json", {"a": 4}, resuming=False, mismatched=False)  # a new run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.json"]


# ---------------------------------------------------------------------------------------------- a full disk


def test_a_full_disk_is_one_oserror_line_with_the_path_free_space_what_is_kept_and_the_fix(tmp_path):
    target = tmp_path / "x" / "file.json"
    with pytest.raises(DiskFullError) as info:
        with run_dir.disk_full_reported(target, tmp_path, kept="the old one is kept", fix="free space"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
    message = str(info.value)
    assert message == (f"no space left on device writing {target} ({run_dir.free_space(tmp_path)} free; OSError: "
                       f"{os.strerror(errno.ENOSPC)}; the old one is kept): free space")
    error = info.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.strerror == message
    assert str(pickle.loads(pickle.dumps(error))) == message  # crosses process boundaries intact
    with pytest.raises(DiskFullError) as outer:  # reported once, by the innermost writer
        with run_dir.disk_full_reported(tmp_path / "outer", tmp_path, kept="k", fix="f"):
            raise error
    assert outer.value is error


@pytest.mark.parametrize("exc,full", [
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1472 vs 1366"), True),
    (RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left" })'), True),
    (PermissionError(errno.EACCES, "denied"), False),
    (ValueError("bad"), False),
])
def test_what_counts_as_a_full_disk(exc, full, tmp_path):
    assert run_dir.is_disk_full(exc) is full
    with pytest.raises(DiskFullError if full else type(exc)):
        with run_dir.disk_full_reported(tmp_path / "f", tmp_path, kept="k", fix="f"):
            raise exc


def test_a_full_disk_anywhere_in_the_chain_counts():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        assert run_dir.is_disk_full(outer)
