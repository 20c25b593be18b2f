"""Agents: anything with ``reset()``, ``act(obs)`` and ``replan(obs)``."""

from agents.base import Agent
from agents.episode import Episode, run_episode
from agents.factory import AGENTS, check_agent_fits_env, make_agent
from agents.random import RandomAgent
from agents.scripted import MetaWorldExpertAgent

__all__ = [
    "AGENTS",
    "Agent",
    "Episode",
    "MetaWorldExpertAgent",
    "RandomAgent",
    "check_agent_fits_env",
    "make_agent",
    "run_episode",
]
