"""Registration through the installed wheel, the listing command and side-effect-free imports."""

import pytest

import envs
from envs.errors import MissingSimulatorError, import_simulator
from envs.registry import all_env_ids, suites
from wam_gym.envs import main as envs_cli


def test_gymnasium_make_needs_no_import(fresh_python):
    proc = fresh_python(
        "import gymnasium, sys\n"
        "assert 'wam_gym/MetaWorld-pick-place-v3' in gymnasium.registry\n"
        "assert 'mujoco' not in sys.modules and 'metaworld' not in sys.modules\n"
        "print(sum(i.startswith('wam_gym/') for i in gymnasium.registry))\n"
    )
    assert proc.returncode == 0, proc.stderr
    # Our namespace only: a plugin suite (the cluster tests' stand-in) may have joined this process's registry.
    assert int(proc.stdout) == sum(i.startswith("wam_gym/") for i in all_env_ids())


def test_importing_the_packages_has_no_side_effects(fresh_python):
    proc = fresh_python(
        "import sys, wam_gym, envs, envs.registry\n"
        "envs.registry.suites()\n"
        "heavy = [m for m in ('gymnasium', 'mujoco', 'metaworld', 'torch', 'robosuite') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    assert proc.returncode == 0, proc.stderr


def test_registration_is_idempotent():
    import gymnasium

    before = len(gymnasium.registry)
    envs.register_envs()
    envs.register_envs()
    assert len(gymnasium.registry) == before


def test_every_suite_lists_its_ids(capsys):
    assert envs_cli(["list"]) == 0
    out = capsys.readouterr().out
    for suite in suites():
        assert suite.title in out
        for id_ in suite.env_kwargs:
            assert id_ in out
    assert "wam_gym/MetaWorld-pick-place-v3" in out


def test_list_names_the_extra_for_missing_simulators(capsys):
    envs_cli(["list"])
    out = capsys.readouterr().out
    for suite in suites():
        if not suite.installed():
            assert f"pip install 'wam_gym[{suite.name}]'" in out


def test_unknown_id_suggests_near_names(capsys):
    with pytest.raises(envs.UnknownEnvError, match="Did you mean"):
        envs.suite_of("wam_gym/MetaWorld-door-opn-v3")
    assert envs_cli(["check", "wam_gym/Nope-v0"]) == 2
    assert "unknown env id" in capsys.readouterr().err


def test_missing_simulator_names_the_extra():
    with pytest.raises(MissingSimulatorError, match=r"pip install 'wam_gym\[robocasa\]'"):
        import_simulator("no_such_simulator_pkg", "RoboCasa", "robocasa")


def test_importing_an_env_module_first_still_registers(fresh_python):
    """An env module imports gymnasium mid-import; the hook must not trip over it."""
    proc = fresh_python(
        "import warnings; warnings.simplefilter('error')\n"
        "import envs.metaworld.env, envs.robotwin.env\n"
        "import gymnasium\n"
        "assert 'wam_gym/RoboTwin-beat_block_hammer-v0' in gymnasium.registry\n"
    )
    assert proc.returncode == 0, proc.stderr
