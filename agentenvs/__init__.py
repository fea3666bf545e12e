"""ALFWorld, WebShop and the toy POMDPs behind one batched interface, with the paper's memory,
prompts and action parser, one adapter per benchmark (``BENCHMARKS``, ``benchmark(env)``; see
docs/agentenvs.md)."""

from agentenvs.batched import BatchedEnv
from agentenvs.factories import (
    alfworld_factory,
    alfworld_games,
    observation_key,
    web_agent_site_factory,
    webshop_factory,
)
from agentenvs.memory import BatchMemory, EpisodeMemory
from agentenvs.parser import INVALID_ACTION_PENALTY, ParsedAction, parse_action, project_actions
from agentenvs.prompts import alfworld_prompt, alfworld_task, webshop_prompt
from agentenvs.registry import BENCHMARKS, Benchmark, benchmark, register

__all__ = [
    "BENCHMARKS",
    "INVALID_ACTION_PENALTY",
    "BatchMemory",
    "BatchedEnv",
    "Benchmark",
    "EpisodeMemory",
    "ParsedAction",
    "alfworld_factory",
    "alfworld_games",
    "alfworld_prompt",
    "alfworld_task",
    "benchmark",
    "observation_key",
    "parse_action",
    "project_actions",
    "register",
    "web_agent_site_factory",
    "webshop_factory",
    "webshop_prompt",
]
