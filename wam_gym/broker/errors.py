"""What the broker raises: in the caller's process (it could not serve) or in an actor's (its request failed)."""

from __future__ import annotations


class BrokerError(RuntimeError):
    """The broker could not serve: workers failed to start, or kept dying."""


class StartCancelled(BrokerError):
    """The broker's start was cancelled (a server told to stop while its model workers loaded)."""


class RemoteInferenceError(RuntimeError):
    """A model worker raised while serving this request (bad input, NaN output, ...)."""


class EpisodeLost(RemoteInferenceError):
    """The model worker that held this episode's state died or was restarted: the episode cannot continue (its
    calls would run on a wrong, empty state). Restart the episode; evaluation reruns it from its start."""
