"""Command line over the env registry.

    python -m wam_gym.envs list [--suite NAME] [--installed]
    python -m wam_gym.envs check ID [--steps N] [--kwarg KEY=VALUE ...]    # gymnasium's checker and the contract

``list`` shows every registered id: the built-in suites' and those of installed plugins (envs/plugins.py).
``check`` builds one env, runs gymnasium's env checker on it, then holds its spaces and the observations of a
seeded reset and ``--steps`` random steps to the observation contract (envs/conformance.py).

``--kwarg`` passes a constructor keyword (repeatable); a value that parses as JSON is passed
parsed (``--kwarg image_size=64``, ``--kwarg 'cameras=["corner"]'``), any other as a string
(``--kwarg checkpoint=outputs/demo/train/checkpoint``).
"""

from __future__ import annotations

import argparse
import json
import sys


def _list(args) -> int:
    from envs.registry import suite_named, suites

    if args.suite is not None:
        suite_named(args.suite, "--suite")  # a misspelt suite listed nothing, with rc 0
    rows = [("id", "suite", "installed", "max steps", "how to install")]
    for suite in suites():
        if args.suite and suite.name != args.suite:
            continue
        installed = suite.installed()
        if args.installed and not installed:
            continue
        how = "-" if installed else suite.install + (f"; {suite.assets}" if suite.assets else "")
        for id_ in suite.env_kwargs:
            rows.append((id_, suite.title, "yes" if installed else "no", str(suite.episode_steps(id_)), how))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])
    print(f"\n{len(rows) - 1} env ids", file=sys.stderr)
    return 0


def _check(args) -> int:
    import gymnasium

    from envs.conformance import check_contract
    from envs.protocol import INSTRUCTION, PIXELS, STATE

    env = _make(args.id, args.kwarg)
    try:
        _gymnasium_checker(env, args.id)
        obs = check_contract(env, args.steps)
    finally:
        env.close()
    cams = {k: v.shape for k, v in obs[PIXELS].items()}
    print(f"{args.id}: ok (gymnasium {gymnasium.__version__} checker passed; observation contract kept over "
          f"{args.steps} steps; cameras {cams}; state {obs[STATE].shape}; instruction {obs[INSTRUCTION]!r})")
    return 0


def _gymnasium_checker(env, env_id: str) -> None:
    from gymnasium.utils.env_checker import check_env

    try:
        check_env(env.unwrapped)
    except AssertionError as exc:  # the checker's verdict on the env, not a crash of this command: one line
        raise ValueError(f"{env_id} fails gymnasium's env checker: {' '.join(str(exc).split())}") from None


def _make(env_id: str, kwargs: dict):
    """``envs.make``; an error about its keywords also says how this command line passes them."""
    import envs
    from envs.errors import MissingAssetsError
    from envs.kwargs import EnvKwargError
    from envs.registry import suite_of

    try:
        return envs.make(env_id, **kwargs)
    except (TypeError, EnvKwargError, MissingAssetsError) as exc:
        # a keyword the constructor lacks, needs or takes of another type; the world model's own error asks for two.
        if isinstance(exc, MissingAssetsError) and suite_of(env_id).name != "world_model":
            raise
        raise ValueError(f"{exc}; here pass them as: python -m wam_gym.envs check {env_id} --kwarg KEY=VALUE "
                         "(repeatable; a JSON value is parsed: true, 64, '[\"corner\"]')") from None


MAX_STEPS = 10_000  # random steps: more is a typo, and minutes of simulation before the verdict


def _steps(text: str) -> int:
    try:
        steps = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= steps <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"{steps}: give an integer in [0, {MAX_STEPS}]")
    return steps


def _kwarg(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--kwarg {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # a path, a name: the string itself


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wam_gym.envs", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="every registered env id, its suite and install state")
    p_list.add_argument("--suite", help="only this suite (e.g. metaworld)")
    p_list.add_argument("--installed", action="store_true", help="only suites whose simulator is installed")
    p_check = sub.add_parser("check", help="make one env, run gymnasium's env checker and hold a few steps to the "
                                           "observation contract")
    p_check.add_argument("id")
    p_check.add_argument("--steps", type=_steps, default=10, help=f"random steps after the checker (0..{MAX_STEPS})")
    p_check.add_argument("--kwarg", type=_kwarg, action="append", default=[], metavar="KEY=VALUE",
                         help="a constructor keyword for envs.make (repeatable; JSON values are parsed)")
    args = parser.parse_args(argv)
    if args.command == "check":
        args.kwarg = dict(args.kwarg)
    try:
        return {"list": _list, "check": _check}[args.command](args)
    except (ValueError, ImportError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
