"""What a dataset says of where its frames come from, in ``meta/info.json``: how each camera's frames are
turned, and the benchmark suites its episodes were collected in.

- **Orientation** (an :mod:`envs.orientation` name), in each camera feature's ``info`` dict under
  ``"orientation"``, beside LeRobot's own ``video.*`` entries: LeRobot's reader ignores what it does not know
  there, and the record stays with the feature. Our writer records ``upright`` (wam_gym's envs render
  upright); ``python -m training.datasets convert --frames ORIENTATION`` records the source's and keeps its
  pixels as they are; the reader turns every frame upright where it leaves the dataset
  (``LeRobotDataset.episode_frames``), once. A camera without a record is upright in a dataset we wrote
  (``robot_type`` ``wam_gym``: ours were all upright before the record existed) and unknown in one from
  elsewhere, whose frames training refuses, naming the flag: LIBERO datasets made by openpi's and LeRobot's
  converters store them mirrored, and a model would learn that silently.
- **Suites** (``envs.registry`` names), top level, ``"wam_gym": {"suites": [...]}``: what ``training.collect``
  collected from. Training gives a model trained on one suite that suite (``model.suite``); the policy server
  reads it to know what the field's drivers of that suite send. No record: unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envs.orientation import ORIENTATIONS, UPRIGHT, check_orientation
from training.data.lerobot.layout import DatasetError

ORIENTATION_KEY = "orientation"  # in an image feature's info dict
OURS = "wam_gym"  # the robot_type DatasetWriter records unless told otherwise (training.collect's)
WAM_GYM_KEY = "wam_gym"  # info.json's top-level entry of what only wam_gym records
CHOICES = "|".join(ORIENTATIONS)


def recorded_orientations(info: Mapping[str, Any], keys: Mapping[str, str], where: object) -> dict[str, str | None]:
    """Camera -> how ``info`` says its frames are turned (``keys``: camera -> its feature); None: unknown."""
    fallback = UPRIGHT if info.get("robot_type") == OURS else None
    found: dict[str, str | None] = {}
    for camera, key in keys.items():
        recorded = (info["features"][key].get("info") or {}).get(ORIENTATION_KEY)
        if recorded is not None and recorded not in ORIENTATIONS:
            raise DatasetError(f"{where}: meta/info.json's features['{key}'].info['{ORIENTATION_KEY}'] is {recorded!r}, "
                               f"not a frame orientation: set it to one of {sorted(ORIENTATIONS)}")
        found[camera] = recorded or fallback
    return found


def unknown_orientation(where: object, key: str, fix: str) -> DatasetError:
    """The refusal of frames whose orientation the dataset does not state; ``fix`` names the flag's command."""
    return DatasetError(f"{where}: meta/info.json does not say how {key}'s frames are turned (a dataset from elsewhere; "
                        f"LIBERO datasets made by openpi's or LeRobot's converters store them mirrored), so training "
                        f"could learn from flipped frames: {fix} --frames {CHOICES}")


def known(orientation: str | None, root: object, key: str) -> str:
    """A reader's ``orientation`` of the feature ``key``; an unknown one refused, naming the command that states it."""
    if orientation is None:
        fix = f"state it by converting the dataset: python -m training.datasets convert {root} {root}-declared"
        raise unknown_orientation(root, key, fix)
    return orientation


def writer_orientations(cameras: Sequence[str], orientations: Mapping[str, str] | None) -> dict[str, str]:
    """A writer's ``orientations``, checked: one per camera, each a name (None: all upright, as our envs render)."""
    if orientations is None:
        return dict.fromkeys(cameras, UPRIGHT)
    if set(orientations) != set(cameras):
        raise ValueError(f"orientations names cameras {sorted(orientations)}, the writer records {list(cameras)}")
    return {c: check_orientation(orientations[c], f"orientations[{c!r}]") for c in cameras}


def recorded_suites(info: Mapping[str, Any]) -> tuple[str, ...]:
    """The benchmark suites the dataset's episodes were collected in; empty: unknown."""
    return tuple((info.get(WAM_GYM_KEY) or {}).get("suites") or ())


def suites_entry(suites: Sequence[str]) -> dict[str, Any]:
    """info.json's top-level entry recording ``suites`` (none when unknown)."""
    return {WAM_GYM_KEY: {"suites": sorted(set(suites))}} if suites else {}
