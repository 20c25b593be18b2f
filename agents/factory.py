"""The one agent factory: an agent by name, for evaluation, collection and benchmarks."""

from __future__ import annotations

from gymnasium import spaces

from agents.base import Agent
from agents.policy import Policy
from agents.predictor import PolicyPredictor, Predictor
from agents.realtime import Latency

AGENTS = ("wam", "python", "remote", "expert", "random")
# Agents that execute a predictor's action chunks (ChunkQueueAgent): a WAM checkpoint, a Policy of the
# user's own (agents/policy.py), or a policy server; they differ only in who answers (agents/predictor.py).
CHUNK_AGENTS = ("wam", "python", "remote")
EXPERT_SUITES = ("metaworld",)  # suites with scripted experts


def make_agent(
    kind: str,
    *,
    action_space: spaces.Box | None = None,
    seed: int | None = None,
    predictor: Predictor | None = None,
    policy: Policy | None = None,
    action_horizon: int | None = None,
    replan_steps: int | None = None,
    latency: Latency | None = None,
    remembers_episodes: bool = False,
    realtime_strategy: str = "hold",
) -> Agent:
    """``wam``, ``python``, ``remote``: chunks from ``predictor`` (the broker's client, a policy
    server's client) or from ``policy`` called in this process (a WAMPolicy, your own Policy);
    ``expert``: Meta-World's scripted policies; ``random``: uniform actions in ``action_space``
    drawn from ``seed``. ``action_space`` also clips a WAM's actions when given. ``latency`` (chunk
    agents, one env): the model's calls take simulated time (agents/realtime.py). ``remembers_episodes``: the
    model keeps each episode's state between calls (LingBot-VA): agents/episode_memory.py's agent drives it.
    ``realtime_strategy`` (with ``latency``): how arriving chunks are merged (agents/realtime_strategies.py)."""
    if kind in CHUNK_AGENTS:
        if (predictor is None) == (policy is None):
            raise ValueError(f"the {kind} agent needs one of predictor= (a broker or remote client) or policy= "
                             "(a Policy called in this process)")
        predictor = predictor or PolicyPredictor(policy)
        if remembers_episodes:
            if latency is not None:
                raise ValueError("EVALUATION.realtime: a model that remembers the episode runs each chunk whole, "
                                 "so it has no real-time mode yet; set EVALUATION.realtime=false")
            from agents.episode_memory import MemoryChunkAgent

            return MemoryChunkAgent(predictor, action_space, replan_steps)
        if latency is not None:
            from agents.realtime import RealtimeChunkAgent

            check_strategy(realtime_strategy, kind, policy)
            return RealtimeChunkAgent(predictor, latency, action_horizon, replan_steps, action_space, realtime_strategy)
        from agents.chunk_queue import ChunkQueueAgent

        return ChunkQueueAgent(predictor, action_horizon, replan_steps, action_space)
    if kind == "expert":
        from agents.scripted import MetaWorldExpertAgent

        return MetaWorldExpertAgent()
    if kind == "random":
        if action_space is None:
            raise ValueError("the random agent needs the env's action_space")
        from agents.random import RandomAgent

        return RandomAgent(action_space, seed=seed)
    raise ValueError(f"unknown agent {kind!r}; choose one of {AGENTS}")


def check_strategy(strategy: str, kind: str, policy: Policy | None = None) -> None:
    """Refuse a real-time strategy the agent's model cannot do: rtc needs a flow-matching WAM's sampler."""
    if strategy != "rtc":
        return
    from agents.wam.policy import WAMPolicy  # a flow-matching sampler that takes a committed prefix (agents/rtc.py)

    if kind != "wam" or (policy is not None and not isinstance(policy, WAMPolicy)):
        who = type(policy).__name__ if policy is not None else f"EVALUATION.agent={kind}"
        raise ValueError(f"EVALUATION.realtime_strategy=rtc guides a flow-matching WAM's sampler with the committed "
                         f"actions; {who} has no such sampler: use agent=wam, or realtime_strategy=hold|naive|ensemble")


def check_agent_fits_env(kind: str, env_id: str) -> None:
    """Refuse, before any simulation, an agent that cannot act in ``env_id``."""
    from envs.registry import suite_of

    if kind not in AGENTS:
        raise ValueError(f"unknown agent {kind!r}; choose one of {AGENTS}")
    suite = suite_of(env_id)  # an unknown id fails here, with suggestions
    if kind == "expert" and suite.name not in EXPERT_SUITES:
        raise ValueError(
            f"the expert agent covers Meta-World only (scripted policies); use --agent random for {env_id}"
        )
