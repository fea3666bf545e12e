"""Environment factories for :class:`agentenvs.batched.BatchedEnv`, and the grouping key."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

from agentenvs.batched import TextEnv
from hgpo.options import bad, check_choice, check_int


def _webshop(
    split: str, seed: int, n_products: int, n_goals: int, n_eval: int, max_steps: int
) -> TextEnv:
    from agentenvs.webshop.env import WebShopEnv, make_world

    world = make_world(seed, n_products, n_goals, n_eval)
    return WebShopEnv(world, split=split, max_steps=max_steps)


def webshop_factory(
    split: str = "train",
    seed: int = 0,
    n_products: int = 5000,
    n_goals: int = 2000,
    n_eval: int | None = None,
    max_steps: int = 15,
) -> Callable[[], TextEnv]:
    """Factory of the offline WebShop simulator (catalog built once per worker process).

    n_eval: goals held out for evaluation (default min(500, n_goals // 4)).
    """
    check_choice("split", split, ("train", "eval", "test"))
    check_int("seed", seed, lo=0)
    check_int("n_products", n_products, lo=1)
    check_int("n_goals", n_goals, lo=2)
    n_eval = min(500, n_goals // 4) if n_eval is None else n_eval
    check_int("n_eval", n_eval, lo=1, hi=n_goals - 1)
    check_int("max_steps", max_steps, lo=1)
    return functools.partial(_webshop, split, seed, n_products, n_goals, n_eval, max_steps)


def _web_agent_site(goal_indices: tuple[int, ...], max_steps: int, env_kwargs: dict) -> TextEnv:
    from agentenvs.webshop.adapter import WebAgentSiteEnv

    return WebAgentSiteEnv(list(goal_indices), max_steps=max_steps, **env_kwargs)


def web_agent_site_factory(
    goal_indices: list[int], max_steps: int = 15, **env_kwargs: object
) -> Callable[[], TextEnv]:
    """Factory of the original WebShop (``web_agent_site``, when installed) over goal numbers.

    ``reset(task)`` plays goal ``goal_indices[task]`` (the real split: 0-499 test, 500-1499
    eval, 1500+ train); ``env_kwargs`` go to ``WebAgentTextEnv`` (e.g. ``num_products``,
    ``human_goals``). See :class:`agentenvs.webshop.adapter.WebAgentSiteEnv`.
    """
    if not goal_indices:
        raise ValueError("goal_indices must not be empty")
    goals = tuple(check_int(f"goal_indices[{i}]", g, lo=0) for i, g in enumerate(goal_indices))
    check_int("max_steps", max_steps, lo=1)
    return functools.partial(_web_agent_site, goals, max_steps, dict(env_kwargs))


def _alfworld(game_files: tuple[str, ...], max_steps: int) -> TextEnv:
    # (the alfworld modules load on use: agentenvs/__init__ imports this module, and
    # ``python -m agentenvs.alfworld.generator`` must not find itself imported already)
    from agentenvs.alfworld.env import AlfWorldEnv

    return AlfWorldEnv(list(game_files), max_steps=max_steps)


def alfworld_games(
    split: str = "train",
    n_games: int = 200,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Game files of ``split``: the official ones under $ALFWORLD_DATA when present, else
    ``n_games`` generated games written under ``root`` (default ``~/.cache/agentenvs``)."""
    from agentenvs.alfworld.env import find_games, official_games
    from agentenvs.alfworld.generator import generate_split

    check_int("n_games", n_games, lo=0)
    check_int("seed", seed, lo=0)
    official = official_games(split)
    if official:
        return official
    base = Path(root) if root is not None else Path.home() / ".cache" / "agentenvs" / "alfworld"
    folder = base / f"seed{seed}_n{n_games}"
    games = find_games(folder / split) if (folder / split).exists() else []
    if len(games) != n_games:
        games = [str(p) for p in generate_split(folder, split, n_games, seed)]
    return games


def alfworld_factory(game_files: list[str], max_steps: int = 50) -> Callable[[], TextEnv]:
    """Factory of ALFWorld envs (the real engine) over ``game_files``."""
    if isinstance(game_files, str) or not all(isinstance(g, str) for g in game_files):
        raise bad("game_files", "a list of game file paths", game_files)
    if not game_files:
        raise ValueError("game_files must not be empty")
    check_int("max_steps", max_steps, lo=1)
    return functools.partial(_alfworld, tuple(game_files), max_steps)


def observation_key(benchmark: str, observation: str, task: str = "") -> str:
    """The key HGPO groups states by, as the reference anchors them.

    alfworld: the raw observation text. webshop: the formatted page (strings after the goal,
    quoted, joined by " [SEP] "), which is also what the prompt shows.
    """
    if benchmark == "alfworld":
        return observation
    if benchmark == "webshop":
        from agentenvs.webshop.env import webshop_anchor

        return webshop_anchor(observation, task)
    raise bad("benchmark", "one of 'alfworld', 'webshop'", benchmark)
