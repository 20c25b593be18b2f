"""RoboCasa and RoboTwin cannot be installed here (not on PyPI; assets on external hosts).

Their ids must still be listed, and making one must fail at construction with an error that
names the install or download step.
"""

import importlib.util

import gymnasium
import pytest

from envs import (
    MissingAssetsError,
    MissingSimulatorError,
    all_env_ids,
    register_envs,
    robocasa,
    robotwin,
)
from envs.robocasa.env import RoboCasaEnv, _check_assets
from envs.robotwin.env import RoboTwinEnv

ROBOCASA_ID = "wam_gym/RoboCasa-PnPCounterToCab-v0"
ROBOTWIN_ID = "wam_gym/RoboTwin-beat_block_hammer-v0"


def test_ids_are_registered():
    register_envs()
    ids = all_env_ids()
    for task in ("PnPCounterToCab", "PnPCabToCounter", "OpenSingleDoor", "CloseDrawer", "TurnOnStove",
                 "CoffeePressButton", "TurnOnMicrowave"):  # fmt: skip
        assert f"wam_gym/RoboCasa-{task}-v0" in ids and f"wam_gym/RoboCasa-{task}-v0" in gymnasium.registry
    for task in ("beat_block_hammer", "handover_block", "pick_dual_bottles", "place_object_scale",
                 "stack_blocks_two"):  # fmt: skip
        assert f"wam_gym/RoboTwin-{task}-v0" in ids and f"wam_gym/RoboTwin-{task}-v0" in gymnasium.registry
    for suite, tasks in (("RoboCasa", robocasa.TASKS), ("RoboTwin", robotwin.TASKS)):
        assert sorted(i for i in ids if i.startswith(f"wam_gym/{suite}-")) == sorted(f"wam_gym/{suite}-{t}-v0" for t in tasks)
    # Each RoboCasa task keeps its own evaluation horizon (they differ: 300 to 1000 steps).
    assert {t: gymnasium.spec(f"wam_gym/RoboCasa-{t}-v0").max_episode_steps for t in robocasa.TASKS} == robocasa.HORIZONS
    assert len(set(robocasa.HORIZONS.values())) > 1
    assert gymnasium.spec(ROBOTWIN_ID).max_episode_steps == robotwin.MAX_EPISODE_STEPS


@pytest.mark.skipif(importlib.util.find_spec("robocasa") is not None, reason="robocasa is installed here")
def test_robocasa_missing_names_the_install():
    register_envs()
    with pytest.raises(MissingSimulatorError) as err:
        gymnasium.make(ROBOCASA_ID)
    message = str(err.value)
    for step in (
        "git clone https://github.com/robocasa/robocasa",
        "pip install -e .",
        "python robocasa/scripts/download_kitchen_assets.py",
        "python robocasa/scripts/setup_macros.py",
    ):
        assert step in message


def test_robocasa_missing_assets_names_the_download(tmp_path):
    (tmp_path / "models" / "assets" / "textures").mkdir(parents=True)  # a checkout before the download
    with pytest.raises(MissingAssetsError) as err:
        _check_assets(tmp_path)
    message = str(err.value)
    assert "models/assets/objects/objaverse" in message and "models/assets/textures" in message
    assert f"python {tmp_path}/scripts/download_kitchen_assets.py" in message and "setup_macros.py" in message


def test_robotwin_without_checkout_names_the_install(monkeypatch):
    monkeypatch.delenv(robotwin.ROOT_ENV, raising=False)
    register_envs()
    with pytest.raises(MissingSimulatorError) as err:
        gymnasium.make(ROBOTWIN_ID)
    message = str(err.value)
    for step in ("ROBOTWIN_ROOT is not set", "git clone https://github.com/RoboTwin-Platform/RoboTwin.git",
                 "bash script/_install.sh", "bash script/_download_assets.sh"):  # fmt: skip
        assert step in message


def test_robotwin_bad_root_and_missing_assets(monkeypatch, tmp_path):
    monkeypatch.setenv(robotwin.ROOT_ENV, str(tmp_path))
    with pytest.raises(MissingSimulatorError, match="is not a RoboTwin checkout"):
        RoboTwinEnv()
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "_base_task.py").write_text("")  # a checkout before the asset download
    deps = all(importlib.util.find_spec(m) for m in ("sapien", "mplib"))
    expected = MissingAssetsError if deps else MissingSimulatorError
    with pytest.raises(expected) as err:
        RoboTwinEnv()
    step = "bash script/_download_assets.sh" if deps else "bash script/_install.sh"
    assert f"cd {tmp_path} && {step}" in str(err.value)


def test_bad_task_names_are_rejected_first():
    with pytest.raises(ValueError, match="known tasks"):
        RoboCasaEnv(task="PnPNowhere")
    with pytest.raises(ValueError, match="known tasks"):
        RoboTwinEnv(task="juggle")
