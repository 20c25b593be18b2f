"""Which way up a policy server's clients send their frames (envs/orientation.py).

The field's drivers turn a simulator's frames before they send them: openpi's ``examples/libero/main.py``
and vla-eval's LIBERO benchmarks send LIBERO's frames mirrored (robosuite's raw frame turned 180 degrees),
and every suite says what its drivers send (``envs.suite.Suite.driver_frames``). A served model is fed
upright frames, the observation contract, and turns them to its own convention in its processor; so the
server turns each client's frames upright as they arrive (``wam_gym.remote.keymap.to_contract``), once. Whose
frames are which, first rule that applies:

1. the observation says so (``image_orientation``; wam_gym's own client, ``EVALUATION.agent=remote``, does);
2. ``SERVE.client_frames`` names an orientation: every client's frames are that;
3. a vla-eval client names its benchmark in its HELLO: that benchmark's drivers' frames;
4. the served model's suite (its checkpoint's, or ``SERVE.suite``): its drivers' frames;
5. upright.

The greeting tells clients which orientation the server takes when they say nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envs.orientation import UPRIGHT
from envs.registry import suite_named
from wam_gym.remote.keymap import ORIENTATION_KEY

AUTO = "auto"  # SERVE.client_frames: by the rules above
# vla-eval 0.8's benchmark packages (vla_eval.benchmarks.<package>, the class its runner's HELLO names) -> our suite
VLA_EVAL_SUITES = {"libero": "libero", "libero_pro": "libero", "libero_plus": "libero", "libero_mem": "libero",
                   "robocasa": "robocasa", "robotwin": "robotwin"}


@dataclass(frozen=True)
class FrameSource:
    """The orientation a client's frames are taken to have, and why (for the log and the greeting)."""

    orientation: str
    because: str


def vla_eval_suite(benchmark: Any) -> str | None:
    """Our suite for a vla-eval benchmark import string (``vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark``:
    libero), None for a benchmark we have no suite for."""
    if not isinstance(benchmark, str):
        return None
    parts = benchmark.split(":")[0].split(".")
    return VLA_EVAL_SUITES.get(parts[2]) if parts[:2] == ["vla_eval", "benchmarks"] and len(parts) > 2 else None


class ClientFrames:
    """The server's rules 2 to 5, for ``SERVE.client_frames`` and the served model's suite."""

    def __init__(self, setting: str, model_suite: str | None):
        self.setting, self.model_suite = setting, model_suite  # as ServeSettings checked them

    def default(self) -> FrameSource:
        """A client that names nothing (openpi's): rules 2, 4 and 5."""
        if self.setting != AUTO:
            return FrameSource(self.setting, "SERVE.client_frames")
        if self.model_suite is not None:
            return self._drivers_of(self.model_suite, "the served model's suite")
        return FrameSource(UPRIGHT, "the served model's suite is unknown (set SERVE.suite or SERVE.client_frames)")

    def for_benchmark(self, benchmark: Any) -> FrameSource:
        """A vla-eval client whose HELLO names ``benchmark``: rules 2 to 5."""
        suite = vla_eval_suite(benchmark)
        if self.setting != AUTO or suite is None:
            return self.default()
        return self._drivers_of(suite, f"vla-eval's benchmark {benchmark}")

    @staticmethod
    def _drivers_of(suite: str, whose: str) -> FrameSource:
        return FrameSource(suite_named(suite).driver_frames, f"{whose} is {suite}, whose drivers send them so")

    def greeting(self) -> dict[str, Any]:
        """What the greeting says of frames: what a client that says nothing is taken to send, and how to say."""
        default = self.default()
        return {"expected": default.orientation, "because": default.because, "declare_with": ORIENTATION_KEY,
                "vla_eval": "by the benchmark your HELLO names" if self.setting == AUTO else default.orientation,
                "orientations": "envs/orientation.py: upright, mirrored, upside_down, rotated_180"}
