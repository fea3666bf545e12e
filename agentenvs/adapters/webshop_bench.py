"""WebShop (the offline simulator) as a :class:`~agentenvs.adapters.Benchmark` (``--env webshop``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agentenvs import prompts
from agentenvs.adapters import Benchmark
from agentenvs.batched import TextEnv
from agentenvs.factories import observation_key, webshop_factory
from agentenvs.memory import EpisodeMemory
from agentenvs.parser import ParsedAction, parse_action

TRAIN_SPLIT = "train"


class WebShopSettings(Protocol):
    """What the WebShop adapter reads of a run's config."""

    webshop_goals: int
    webshop_eval_goals: int
    webshop_products: int
    seed: int
    max_steps: int


def _split_size(settings: WebShopSettings, split: str) -> int:
    n_eval = settings.webshop_eval_goals
    return settings.webshop_goals - n_eval if split == TRAIN_SPLIT else n_eval


def _factory(settings: WebShopSettings, split: str) -> Callable[[], TextEnv]:
    return webshop_factory(
        "train" if split == TRAIN_SPLIT else "eval",
        seed=settings.seed,
        n_products=settings.webshop_products,
        n_goals=settings.webshop_goals,
        n_eval=settings.webshop_eval_goals,
        max_steps=settings.max_steps,
    )


def _task(first_obs: str, info: dict[str, Any]) -> str:
    return info.get("task", "")


def _anchor(obs: str, task: str) -> str:
    return observation_key("webshop", obs, task)  # the formatted page: key and prompt text


def _prompt(
    env: str, task: str, obs: str, admissible: Sequence[str], memory: EpisodeMemory, k: int
) -> str:
    return prompts.webshop_prompt(task, obs, admissible, memory, k)


def _parse(text: str, info: dict[str, Any]) -> ParsedAction:
    return parse_action(text, "webshop", None)  # free text: any search query is an action


def candidates(admissible: Sequence[str], task: str) -> list[str]:
    """The admissible actions, with the ``search[<your query>]`` placeholder filled with the
    task text."""
    out: list[str] = []
    for a in admissible:
        if a.startswith("search[") and "<" in a:
            a = f"search[{task}]"
        if a not in out:
            out.append(a)
    return out


def expert_plans(settings: WebShopSettings, tasks: list[int]) -> list[list[str]]:
    """The scripted expert's actions of each training goal of ``tasks``."""
    from agentenvs.webshop.env import WebShopEnv, expert_actions, make_world

    world = make_world(
        settings.seed, settings.webshop_products, settings.webshop_goals,
        settings.webshop_eval_goals,
    )  # fmt: skip
    env = WebShopEnv(world, split="train", max_steps=settings.max_steps)
    plans = []
    for t in tasks:
        env.reset(t)
        plans.append(expert_actions(env))
    return plans


WEBSHOP = Benchmark(
    name="webshop",
    defaults={"max_steps": 15, "max_prompt_tokens": 4096, "mini_batch_size": 64, "val_tasks": 256},
    val_splits=("eval",),
    split_size=_split_size,
    factory=_factory,
    task_text=_task,
    shown=_anchor,
    key=_anchor,
    prompt=_prompt,
    parse=_parse,
    candidates=candidates,
    templates=(prompts.WEBSHOP_TEMPLATE, prompts.WEBSHOP_TEMPLATE_NO_HIS),
    sample_text=(
        "Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B09XYZ [SEP] $19.99 "
        "Buy Now Description Features Reviews size color price lower than 40.00 dollars",
    ),
    extras=("webshop",),
    modules=("bm25s",),
    paper=True,
    reference_profile="webshop",
    expert_plans=expert_plans,
)
"""WebShop: 15 steps, the formatted page (strings after the goal) as key and prompt text."""
