"""Bad datasets and dataset commands (issue 50): nothing written over, metadata typed where it enters, one line and
never a traceback for a damaged file, rows that disagree with their episode, links out of a dataset (a Hugging Face
cache snapshot's stay in), and the repair of an aggregated dataset that starts episodes off the frame grid."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.bad_inputs import Case, Ctx

DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
CORNER = "videos/observation.images.corner/chunk-000/file-000.mp4"


class Refused(Exception):
    """A dataset command's refusal: its exit status and the one stderr line a user sees."""


# ----------------------------------------------------------------------------- helpers
def _copy(ctx: Ctx) -> Path:
    """A copy of the shared dataset (20 fps, episodes of 4 and 5 frames, cameras corner and wrist, one file each)."""
    return Path(shutil.copytree(ctx.shared.dataset, ctx.tmp / "ds"))


def _v21(ctx: Ctx) -> Path:
    from tests.test_dataset_convert import write_v21

    root = ctx.tmp / "v21"
    write_v21(root)
    return root


def _edit_info(root: Path, edit: Callable[[dict], None]) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    edit(info)
    (root / "meta/info.json").write_text(json.dumps(info))


def _edit_table(path: Path, edit: Callable[[dict], None]) -> None:
    """Rewrite a parquet file's columns as Python lists (types inferred anew unless kept by ``edit``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    edit(columns)
    kept = {f.name: f.type for f in table.schema}
    arrays = {}
    for name, values in columns.items():
        try:
            arrays[name] = pa.array(values, kept.get(name))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            arrays[name] = pa.array(values)  # the edit changed its type
    pq.write_table(pa.table(arrays), path)


def _truncate(path: Path) -> None:
    data = path.resolve().read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _datasets_cli(*argv: str, prepare: Callable[[Ctx], dict[str, str]]) -> Callable[[Ctx], object]:
    """``python -m training.datasets ARGV`` in this process, its ``{names}`` filled by ``prepare``; a refusal (exit
    status not 0) is raised as :class:`Refused` with its last stderr line. An exception escaping ``main`` is what a
    user would see as a traceback, and fails the case (it is not a Refused)."""

    def trigger(ctx: Ctx):
        from training.datasets import main

        names = prepare(ctx)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = main([a.format(**names) for a in argv])
            except SystemExit as exc:  # argparse
                status = exc.code
        lines = err.getvalue().strip().splitlines()
        if status:
            assert "Traceback" not in err.getvalue() and [x for x in lines if "error:" in x] == lines[-1:], err.getvalue()
            raise Refused(f"rc {status}: {lines[-1]}")

    return trigger


def _damaged(damage: Callable[[Path], None], command: str = "check") -> Callable[[Ctx], dict[str, str]]:
    def prepare(ctx: Ctx) -> dict[str, str]:
        root = _copy(ctx)
        damage(root)
        return {"ds": str(root), "out": str(ctx.tmp / "out")}

    return prepare


def _named(doc: str, trigger: Callable[[Ctx], object]) -> Callable[[Ctx], object]:
    """``trigger`` with ``doc`` as its docstring: the reference page's "triggered by"."""
    trigger.__doc__ = doc
    return trigger


def _opened(damage: Callable[[Path], None]) -> Callable[[Ctx], object]:
    def trigger(ctx: Ctx):
        from training.data import ClipDataset

        root = _copy(ctx)
        damage(root)
        ClipDataset(root)

    return trigger


# ----------------------------------------------------------------------------- nothing written over
def convert_into_a_folder_of_notes(ctx: Ctx):
    """convert into a directory that holds someone's notes.txt (no --overwrite)."""
    from training.data.lerobot.convert import convert

    (ctx.tmp / "out").mkdir()
    (ctx.tmp / "out/notes.txt").write_text("mine")
    convert(ctx.shared.dataset, ctx.tmp / "out")


def convert_into_a_file(ctx: Ctx) -> dict[str, str]:
    (ctx.tmp / "out").write_text("a file")
    return {"ds": str(ctx.shared.dataset), "out": str(ctx.tmp / "out")}


def convert_over_its_own_parent(ctx: Ctx):
    """convert SRC PARENT --overwrite: the replaced directory holds the source."""
    from training.data.lerobot.convert import convert

    convert(_copy(ctx), ctx.tmp, overwrite=True)


def collect_into_a_used_folder(ctx: Ctx):
    """collect --output into a directory holding a file, with the simulator rigged to fail if it is ever started."""
    import envs
    from training.collect import collect

    def started(*args, **kwargs):
        raise AssertionError("a simulator started before the destination was checked")

    ctx.monkeypatch.setattr(envs, "make", started)
    (ctx.tmp / "out").mkdir()
    (ctx.tmp / "out/results.json").write_text("{}")
    collect(["wam_gym/MetaWorld-reach-v3"], 1, ctx.tmp / "out", log=None)


def writer_onto_a_file(ctx: Ctx):
    """DatasetWriter whose root is an existing file."""
    from training.data import DatasetWriter

    (ctx.tmp / "ds").write_text("a file")
    DatasetWriter(ctx.tmp / "ds", 20, ("corner",))


# ----------------------------------------------------------------------------- types where metadata enters
def v21_with(damage: Callable[[Path], None]) -> Callable[[Ctx], object]:
    """A v2.1 dataset (LeRobot 2.1's layout) damaged so, converted."""

    def trigger(ctx: Ctx):
        from training.data.lerobot.convert import convert

        root = _v21(ctx)
        damage(root)
        convert(root, ctx.tmp / "out", orientation="upright")

    return trigger


def _set_feature(key: str, **fields) -> Callable[[Path], None]:
    return lambda root: _edit_info(root, lambda info: info["features"][key].update(fields))


def _jsonl_line(name: str, line: int, **fields) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        rows = [json.loads(x) for x in (root / name).read_text().splitlines()]
        rows[line].update(fields)
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    return damage


# ----------------------------------------------------------------------------- one line, never a traceback
def _ragged_state(path: Path) -> None:
    """Row 1 of observation.state one value short (a list column of free length)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    rows = table.column("observation.state").to_pylist()
    rows[1] = rows[1][:-1]
    column = pa.array(rows, pa.list_(pa.float32()))
    pq.write_table(table.set_column(table.column_names.index("observation.state"), "observation.state", column), path)


def _random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


# ----------------------------------------------------------------------------- links
def hf_snapshot_with_a_link_out(ctx: Ctx):
    """A Hugging Face cache snapshot whose meta/stats.json links to a file outside its datasets--org--name/."""
    from tests.test_datasets_cli import as_hf_snapshot
    from training.data import LeRobotDataset

    snapshot = as_hf_snapshot(ctx.shared.dataset, ctx.tmp / "hub")
    stats = snapshot / "meta/stats.json"
    (ctx.tmp / "stats.json").write_bytes(stats.read_bytes())
    stats.unlink()
    stats.symlink_to(ctx.tmp / "stats.json")
    LeRobotDataset(snapshot)


def hf_snapshot_linking_another_repository(ctx: Ctx):
    """A snapshot whose data file links (relatively) into another cached dataset's blobs/."""
    from tests.test_datasets_cli import as_hf_snapshot
    from training.datasets import check

    snapshot = as_hf_snapshot(ctx.shared.dataset, ctx.tmp / "hub")
    other = as_hf_snapshot(ctx.shared.dataset, ctx.tmp / "hub", repo="datasets--someone--else")
    data = snapshot / DATA
    data.unlink()
    data.symlink_to(os.path.relpath((other / DATA).resolve(), data.parent))
    check(snapshot)


def link_out_of_a_plain_dataset(ctx: Ctx):
    """A dataset's video file replaced by a link to a file elsewhere (not a Hugging Face cache)."""
    from training.data import LeRobotDataset

    root = _copy(ctx)
    (root / CORNER).rename(ctx.tmp / "elsewhere.mp4")
    (root / CORNER).symlink_to(ctx.tmp / "elsewhere.mp4")
    LeRobotDataset(root)


# ----------------------------------------------------------------------------- aggregated, off the frame grid
def aggregated_then_checked(ctx: Ctx):
    """LeRobot's aggregate_datasets of drifted datasets: episode 1 starts at 0.140234 s (not 0.15 s), checked."""
    from tests.test_datasets_cli import aggregated
    from training.datasets import check

    check(aggregated(ctx.tmp / "joined"))


def aggregated_beyond_repair(ctx: Ctx):
    """The same, its file's frames 9.8 ms late where the record is 9.8 ms early, converted as check says."""
    from tests.test_datasets_cli import aggregated
    from training.data.lerobot.convert import convert

    src = aggregated(ctx.tmp / "joined", video_shift_s=0.009766)
    convert(src, ctx.tmp / "joined-exact")


def aggregated_and_trained(ctx: Ctx):
    """The same, opened for training."""
    from tests.test_datasets_cli import aggregated
    from training.data import ClipDataset

    ClipDataset(aggregated(ctx.tmp / "joined"), cameras=("corner",))


# ----------------------------------------------------------------------------- the triggers, named for the page
convert_cli_onto_a_file = _named('`convert SRC DST` where DST is an existing file.',
    _datasets_cli("convert", "{ds}", "{out}", prepare=convert_into_a_file))
info_fps_string = _named('`check` of a dataset whose meta/info.json has `"fps": "80"` (a traceback before).',
    _datasets_cli("check", "{ds}", prepare=_damaged(lambda r: _edit_info(r, lambda i: i.update(fps="80")))))
info_fps_string_info = _named('`info` of the same dataset (a traceback before).',
    _datasets_cli("info", "{ds}", prepare=_damaged(lambda r: _edit_info(r, lambda i: i.update(fps="80")))))
info_total_episodes_string = _named('`"total_episodes": "2"`, opened for training.',
    _opened(lambda r: _edit_info(r, lambda i: i.update(total_episodes="2"))))
info_shape_of_strings = _named('observation.state\'s shape `["4"]`, opened for training.',
    _opened(_set_feature("observation.state", shape=["4"])))
info_dtype_number = _named("action's dtype `7`, opened for training.",
    _opened(_set_feature("action", dtype=7)))
info_video_fps_string = _named('a camera\'s `info["video.fps"]` of `"20"`, opened for training.',
    _opened(_set_feature("observation.images.corner", info={"video.fps": "20", "orientation": "upright"})))
info_not_an_object = _named('meta/info.json holding a JSON list, opened for training.',
    _opened(lambda r: (r / "meta/info.json").write_text("[1, 2]")))
info_camera_shape = _named("a camera's shape `[24, 24]` (no channels), opened for training.",
    _opened(_set_feature("observation.images.wrist", shape=[24, 24])))
info_suites_string = _named('`"wam_gym": {"suites": "x"}`, opened for training.',
    _opened(lambda r: _edit_info(r, lambda i: i.update(wam_gym={"suites": "x"}))))
stats_string = _named('`check` of a dataset whose meta/stats.json holds means as strings.',
    _datasets_cli("check", "{ds}", prepare=_damaged(lambda r: (r / "meta/stats.json").write_text(
        json.dumps({"action": {"mean": ["0.1", "0.2", "0.3"]}})))))
episodes_length_strings = _named("meta/episodes' `length` column of strings, opened for training.",
    _opened(lambda r: _edit_table(r / EPISODES, lambda c: c.update(length=[str(n) for n in c["length"]]))))
v21_chunks_size_zero = _named('`convert` of a v2.1 dataset with `"chunks_size": 0`.',
    v21_with(lambda r: _edit_info(r, lambda i: i.update(chunks_size=0))))
v21_episode_length_string = _named('`convert` of a v2.1 dataset whose episodes.jsonl gives a length as `"7"`.',
    v21_with(_jsonl_line("meta/episodes.jsonl", 1, length="7")))
v21_task_index_missing = _named('`convert` of a v2.1 dataset whose tasks.jsonl line lacks task_index.',
    v21_with(lambda r: (r / "meta/tasks.jsonl").write_text('{"task": "x"}\n')))
v21_stats_ragged = _named('`convert` of a v2.1 dataset whose episodes_stats.jsonl holds a ragged list.',
    v21_with(lambda r: (r / "meta/episodes_stats.jsonl").write_text(json.dumps(
        {"episode_index": 0, "stats": {"action": {"mean": [[1, 2], [3]]}}}) + "\n")))
v21_ragged_state = _named('`convert` of a v2.1 dataset with one observation.state row a value short (a traceback before).',
    v21_with(lambda r: _ragged_state(r / "data/chunk-000/episode_000001.parquet")))
v21_truncated_parquet = _named("`convert` of a v2.1 dataset with an episode's parquet file cut in half.",
    v21_with(lambda r: _truncate(r / "data/chunk-000/episode_000002.parquet")))
v21_convert_cli_ragged = _named('`python -m training.datasets convert` of the ragged v2.1 dataset.',
    _datasets_cli("convert", "{ds}", "{out}", "--frames", "upright",
                  prepare=lambda ctx: {"ds": str(v21_ragged(ctx)), "out": str(ctx.tmp / "out")}))
truncated_data_check = _named('`check` of a dataset whose data file is cut in half (a traceback before).',
    _datasets_cli("check", "{ds}", prepare=_damaged(lambda r: _truncate(r / DATA))))
truncated_tasks_info = _named('`info` of a dataset whose meta/tasks.parquet is cut in half.',
    _datasets_cli("info", "{ds}", prepare=_damaged(lambda r: _truncate(r / "meta/tasks.parquet"))))
truncated_episodes_open = _named('a dataset whose meta/episodes file is cut in half, opened for training.',
    _opened(lambda r: _truncate(r / EPISODES)))
truncated_convert = _named('`convert` of a v3.0 dataset whose data file is cut in half.',
    _datasets_cli("convert", "{ds}", "{out}", prepare=_damaged(lambda r: _truncate(r / DATA))))
ragged_state_open = _named('a v3.0 data file with one observation.state row a value short, opened for training.',
    _opened(lambda r: _ragged_state(r / DATA)))
stats_not_json = _named('`check` of a dataset whose meta/stats.json is cut off mid-JSON.',
    _datasets_cli("check", "{ds}", prepare=_damaged(lambda r: (r / "meta/stats.json").write_text('{"action": '))))
data_lacks_task_index = _named('a data file without its task_index column, opened for training.',
    _opened(lambda r: _edit_table(r / DATA, lambda c: c.pop("task_index"))))
state_of_strings = _named('a data file whose observation.state holds strings, opened for training.',
    _opened(lambda r: _edit_table(r / DATA, lambda c: c.update(
        {"observation.state": [[str(v) for v in row] for row in c["observation.state"]]}))))
template_unknown_field = _named('a data_path template naming a field v3.0 does not have (`{episode_chunk}`).',
    _opened(lambda r: _edit_info(r, lambda i: i.update(data_path="data/{episode_chunk}/{file_index}.parquet"))))
video_random_bytes = _named('`check` of a dataset whose mp4 is random bytes.',
    _datasets_cli("check", "{ds}", prepare=_damaged(lambda r: _random_bytes(r / CORNER))))
convert_gop_zero = _named('`convert --video-gop 0`.',
    _datasets_cli("convert", "{ds}", "{out}", "--video-gop", "0", prepare=_damaged(lambda r: None)))
convert_size_nan = _named('`convert --data-files-size-in-mb nan` (it was taken).',
    _datasets_cli("convert", "{ds}", "{out}", "--data-files-size-in-mb", "nan", prepare=_damaged(lambda r: None)))
row_in_another_episode = _named("`check` of a dataset whose row 5, in episode 1's span, says episode_index 0 (it passed before).",
    _datasets_cli("check", "{ds}", prepare=_damaged(
        lambda r: _edit_table(r / DATA, lambda c: c["episode_index"].__setitem__(5, 0)))))
frame_index_out_of_order = _named('frame_index 0, 1, 3, 2 in an episode, opened for training.',
    _opened(lambda r: _edit_table(r / DATA, lambda c: c.update(frame_index=[0, 1, 3, 2, 0, 1, 2, 3, 4]))))
episode_span_short = _named("an episode's dataset_to_index one short of its length, opened for training.",
    _opened(lambda r: _edit_table(r / EPISODES, lambda c: c.update(dataset_to_index=[3, 9]))))
episode_spans_overlap = _named("episode 1's span starting inside episode 0's, opened for training.",
    _opened(lambda r: _edit_table(r / EPISODES, lambda c: c.update(dataset_from_index=[0, 3], dataset_to_index=[4, 8]))))


# ----------------------------------------------------------------------------- the cases
def cases() -> list[Case]:
    from training.data import DatasetError
    from wam_gym.utils.publish import DestinationExists

    written_over = r"already exists \(%s\) and nothing is written over it: write to a new path, or pass --overwrite"
    fix_there = r"there, or make the dataset again"
    return [
        # --- datasets: nothing written over
        Case("dataset-convert-into-notes", convert_into_a_folder_of_notes, DestinationExists,
             r"out " + written_over % r"a directory holding 1 entry \(notes\.txt\)"),
        Case("dataset-convert-cli-onto-a-file", convert_cli_onto_a_file,
             Refused, r"^rc 1: error: \S+/out " + written_over % "a file"),
        Case("dataset-convert-over-its-parent", convert_over_its_own_parent, DatasetError,
             r"lie one inside the other: convert into a directory beside the source \(such as \S+/ds-v30\)"),
        Case("dataset-collect-into-a-used-folder", collect_into_a_used_folder, DestinationExists,
             r"out " + written_over % r"a directory holding 1 entry \(results\.json\)", needs="metaworld"),
        Case("dataset-writer-onto-a-file", writer_onto_a_file, DestinationExists, r"ds " + written_over % "a file"),
        # --- datasets: metadata typed where it enters
        Case("dataset-info-fps-string", info_fps_string, Refused,
             r'^rc 1: error: \S+/meta/info\.json: fps is "80" \(a string\), not a positive number \(frames per second, '
             r"such as 20\): write 80 without quotes " + fix_there),
        Case("dataset-info-fps-string-info", info_fps_string_info, Refused,
             r'^rc 1: error: \S+: fps is "80" \(a string\), .*: write 80 without quotes there'),
        Case("dataset-info-total-episodes-string", info_total_episodes_string,
             DatasetError, r'info\.json: total_episodes is "2" \(a string\), not a whole number >= 0: write 2 without quotes'),
        Case("dataset-info-shape-of-strings", info_shape_of_strings, DatasetError,
             r"info\.json: features\['observation\.state'\]\.shape is \[\"4\"\] \(a list\), not a list of whole numbers "
             r">= 1, such as \[7\]"),
        Case("dataset-info-dtype-number", info_dtype_number, DatasetError,
             r"info\.json: features\['action'\]\.dtype is 7 \(an integer\), not a string: correct it " + fix_there),
        Case("dataset-info-video-fps-string", info_video_fps_string, DatasetError,
             r"features\['observation\.images\.corner'\]\.info\['video\.fps'\] is \"20\" \(a string\), not a positive "
             r"number \(frames per second\): write 20 without quotes"),
        Case("dataset-info-not-an-object", info_not_an_object, DatasetError,
             r"info\.json holds a list, not an object of fields; re-collect the dataset with: python -m training\.collect"),
        Case("dataset-info-camera-shape", info_camera_shape, DatasetError,
             r"features\['observation\.images\.wrist'\]\.shape is \[24, 24\], not an image's \[height, width, 3\]"),
        Case("dataset-info-suites-string", info_suites_string,
             DatasetError, r'info\.json: wam_gym\.suites is "x" \(a string\), not a list of suite names'),
        Case("dataset-stats-string", stats_string, Refused,
             r'^rc 1: error: \S+/meta/stats\.json: action mean is \["0\.1", "0\.2", "0\.3"\], not a number or a list of '
             r"numbers of one shape; recompute it with: python -m training\.collect --stats-only"),
        Case("dataset-episodes-length-strings", episodes_length_strings, DatasetError,
             r"file-000\.parquet: column 'length' holds string, not integers; re-collect the dataset with"),
        Case("dataset-v21-chunks-size-zero", v21_chunks_size_zero,
             DatasetError, r"info\.json: chunks_size is 0 \(an integer\), not a whole number >= 1: correct it " + fix_there),
        Case("dataset-v21-episode-length-string", v21_episode_length_string,
             DatasetError, r'episodes\.jsonl line 2: length is "7" \(a string\), not a whole number >= 0: write 7 '
                           r"without quotes"),
        Case("dataset-v21-task-index-missing", v21_task_index_missing,
             DatasetError, r"tasks\.jsonl: line 1 lacks \['task_index'\]; correct it, or make the dataset again"),
        Case("dataset-v21-stats-ragged", v21_stats_ragged, DatasetError,
             r"episodes_stats\.jsonl: episode 0's action mean is \[\[1, 2\], \[3\]\], not a number or a list of numbers"),
        # --- datasets: one line, never a traceback
        Case("dataset-v21-ragged-state", v21_ragged_state,
             DatasetError, r"episode 1: \S+episode_000001\.parquet: column 'observation\.state' row 1 holds 5 values, row 0 "
                           r"6: every frame's observation\.state must have the same length \(1 rows differ\)"),
        Case("dataset-v21-truncated-parquet", v21_truncated_parquet,
             DatasetError, r"episode_000002\.parquet is not a readable parquet file \(Parquet magic bytes not found in "
                           r"footer\..*\); the file is damaged or truncated: fix or drop it where the dataset was made"),
        Case("dataset-v21-convert-cli-ragged", v21_convert_cli_ragged,
             Refused, r"^rc 1: error: episode 0: .*column 'observation\.state' row 1 holds 5 values"),
        Case("dataset-truncated-data-check", truncated_data_check,
             Refused, r"^rc 1: error: \S+/data/chunk-000/file-000\.parquet is not a readable parquet file .*re-collect"),
        Case("dataset-truncated-tasks-info", truncated_tasks_info, Refused,
             r"^rc 1: error: \S+/meta/tasks\.parquet is not a readable parquet file"),
        Case("dataset-truncated-episodes-open", truncated_episodes_open, DatasetError,
             r"meta/episodes/chunk-000/file-000\.parquet is not a readable parquet file .*the file is damaged or truncated"),
        Case("dataset-truncated-convert", truncated_convert, Refused,
             r"^rc 1: error: \S+file-000\.parquet is not a readable parquet file"),
        Case("dataset-ragged-state-open", ragged_state_open, DatasetError,
             r"file-000\.parquet: column 'observation\.state' row 1 holds 3 values, row 0 4: every frame's observation\.state "
             r"must have the same length \(1 rows differ\): fix or drop it where the dataset was made"),
        Case("dataset-stats-not-json", stats_not_json, Refused,
             r"^rc 1: error: \S+/meta/stats\.json is not valid JSON \(.*\); recompute it with: python -m training\.collect "
             r"--stats-only"),
        Case("dataset-data-lacks-task-index", data_lacks_task_index,
             DatasetError, r"file-000\.parquet: lacks the columns \['task_index'\] \(has .*\); re-collect the dataset"),
        Case("dataset-state-of-strings", state_of_strings, DatasetError,
             r"column 'observation\.state' holds list<\w+: string>, not numbers or lists of numbers; fix or drop it where"),
        Case("dataset-template-unknown-field", template_unknown_field, DatasetError,
             r"info\.json's data_path 'data/{episode_chunk}/{file_index}\.parquet' does not format with \['chunk_index', "
             r"'file_index'\] \(KeyError\('episode_chunk'\)\); set it to a template such as 'data/chunk-"),
        Case("dataset-video-random-bytes", video_random_bytes,
             Refused, r"^rc 1: error: \S+: video file \S+file-000\.mp4 is not a readable video .*re-collect the dataset"),
        Case("dataset-convert-gop-zero", convert_gop_zero, Refused, r"^rc 2: .*error: argument --video-gop: must be > 0, got 0$"),
        Case("dataset-convert-size-nan", convert_size_nan, Refused,
             r"^rc 2: .*error: argument --data-files-size-in-mb: must be > 0, got nan$"),
        # --- datasets: rows that disagree with their episode
        Case("dataset-row-in-another-episode", row_in_another_episode, Refused,
             r"^rc 1: error: \S+: the data row of index 5 has episode_index 0, but it lies in episode 1's span "
             r"\(meta/episodes' dataset_from_index\.\.dataset_to_index\), as its frame 1 \(1 such rows\); fix or drop it "
             r"where the dataset was made"),
        Case("dataset-frame-index-out-of-order", frame_index_out_of_order, DatasetError,
             r"the data row of index 2 has frame_index 3, but it lies in episode 0's span .*as its frame 2 \(2 such rows\)"),
        Case("dataset-episode-span-short", episode_span_short, DatasetError,
             r"meta/episodes: episode 0's rows dataset_from_index 0 to dataset_to_index 3 are not its 4 frames starting at 0"),
        Case("dataset-episode-spans-overlap", episode_spans_overlap, DatasetError,
             r"episode 1's rows dataset_from_index 3 to dataset_to_index 8 are not its 5 frames starting at episode 0's "
             r"end \(4\)"),
        # --- datasets: links out of a dataset (a Hugging Face cache snapshot's stay in)
        Case("dataset-hf-snapshot-link-out", hf_snapshot_with_a_link_out, DatasetError,
             r"snapshots/0+/meta/stats\.json is a link to \S+/stats\.json, outside the dataset \(\S+/hub/datasets--lerobot"
             r"--demo\): .*copy the file into the dataset in place of the link"),
        Case("dataset-hf-snapshot-link-to-another-repo", hf_snapshot_linking_another_repository, DatasetError,
             r"file-000\.parquet is a link to \S+/datasets--someone--else/blobs/\w+, outside the dataset"),
        Case("dataset-link-out", link_out_of_a_plain_dataset, DatasetError,
             r"ds/videos/observation\.images\.corner/chunk-000/file-000\.mp4 is a link to \S+/elsewhere\.mp4, outside "
             r"the dataset \(\S+/ds\)"),
        # --- datasets: aggregated datasets that start episodes off the frame grid
        Case("dataset-aggregated-off-grid", aggregated_then_checked, DatasetError,
             r"episode 1's videos/observation\.images\.corner/from_timestamp 0\.140234 s is not a frame's time .*repair "
             r"the dataset with: python -m training\.datasets convert \S+/joined \S+/joined-exact$"),
        Case("dataset-aggregated-open-for-training", aggregated_and_trained, DatasetError,
             r"from_timestamp 0\.140234 s is not a frame's time .*repair the dataset with: python -m training\.datasets "
             r"convert"),
        Case("dataset-aggregated-beyond-repair", aggregated_beyond_repair, DatasetError,
             r"episode 1's from_timestamp 0\.140234 s in meta/episodes is off the frame grid, and the file's frame nearest "
             r"it on the grid \(frame 6, 0\.150000 s\) is at 0\.159\d+ s, .*cannot be repaired here; make the dataset "
             r"again from its sources"),
    ]


def v21_ragged(ctx: Ctx) -> Path:
    """A v2.1 dataset whose episode 0 has a ragged observation.state row."""
    root = _v21(ctx)
    _ragged_state(root / "data/chunk-000/episode_000000.parquet")
    return root
