"""ALFWorld as a :class:`~agentenvs.adapters.Benchmark` (``--env alfworld``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentenvs import prompts
from agentenvs.adapters import Benchmark, unique_actions
from agentenvs.batched import TextEnv
from agentenvs.factories import alfworld_factory, alfworld_games
from agentenvs.memory import EpisodeMemory
from agentenvs.parser import ParsedAction, parse_action

TRAIN_SPLIT = "train"
VAL_SPLITS = ("valid_seen", "valid_unseen")
"""Held-out games in (valid_seen) and out of distribution (valid_unseen)."""


class AlfWorldSettings(Protocol):
    """What the ALFWorld adapter reads of a run's config."""

    alfworld_games_dir: str
    alfworld_train_games: int
    val_tasks: int
    seed: int
    max_steps: int


def game_files(settings: AlfWorldSettings, split: str) -> list[str]:
    """The game files of ``split``: those under ``alfworld_games_dir/<split>``, else the official
    or generated ones (:func:`agentenvs.alfworld_games`)."""
    if settings.alfworld_games_dir:
        from agentenvs.alfworld.env import find_games

        folder = Path(settings.alfworld_games_dir) / split
        games = find_games(folder)
        if not games:
            raise ValueError(f"TrainConfig.alfworld_games_dir: no games under {str(folder)!r}")
        return games
    n = settings.alfworld_train_games if split == TRAIN_SPLIT else settings.val_tasks
    return alfworld_games(split, n_games=n, seed=settings.seed)


def _split_size(settings: AlfWorldSettings, split: str) -> int:
    return len(game_files(settings, split))


def _factory(settings: AlfWorldSettings, split: str) -> Callable[[], TextEnv]:
    return alfworld_factory(game_files(settings, split), max_steps=settings.max_steps)


def _task(first_obs: str, info: dict[str, Any]) -> str:
    return prompts.alfworld_task(first_obs) if first_obs else ""


def _same(obs: str, task: str) -> str:
    return obs  # the raw observation text (the reference's key; the prompt shows it too)


def _prompt(
    env: str, task: str, obs: str, admissible: Sequence[str], memory: EpisodeMemory, k: int
) -> str:
    return prompts.alfworld_prompt(task, obs, admissible, memory, k)


def _candidates(admissible: Sequence[str], task: str = "") -> list[str]:
    """Score mode's candidates: the admissible actions the prompt lists, each once. The
    reference's list leaves out 'help' (:func:`agentenvs.prompts.format_alfworld_actions`), so
    score mode must not choose it: an action the prompt never showed, whose long help text would
    then sit in the memory."""
    return [a for a in unique_actions(admissible, task) if a != "help"]


def _parse(text: str, info: dict[str, Any]) -> ParsedAction:
    return parse_action(text, "alfworld", info.get("admissible_actions"))


def expert_plans(settings: AlfWorldSettings, tasks: list[int]) -> list[list[str]]:
    """The handcoded expert's actions of each training game of ``tasks``."""
    from agentenvs.alfworld.env import AlfWorldEnv, run_expert

    env = AlfWorldEnv(game_files(settings, TRAIN_SPLIT), max_steps=settings.max_steps)
    plans = [run_expert(env, t)[1] for t in tasks]
    env.close()
    return plans


def _preflight(settings: AlfWorldSettings) -> str | None:
    """``alfworld_games_dir`` holds a folder per split."""
    if not settings.alfworld_games_dir:
        return None
    for split in (TRAIN_SPLIT, *VAL_SPLITS):
        if not (Path(settings.alfworld_games_dir) / split).is_dir():
            return (
                f"TrainConfig.alfworld_games_dir: {settings.alfworld_games_dir!r} has no "
                f"{split}/ folder"
            )
    return None


ALFWORLD = Benchmark(
    name="alfworld",
    defaults={"max_steps": 50, "max_prompt_tokens": 2048, "mini_batch_size": 256, "val_tasks": 128},
    val_splits=VAL_SPLITS,
    split_size=_split_size,
    factory=_factory,
    task_text=_task,
    shown=_same,
    key=_same,
    prompt=_prompt,
    parse=_parse,
    candidates=_candidates,
    templates=(prompts.ALFWORLD_TEMPLATE, prompts.ALFWORLD_TEMPLATE_NO_HIS),
    sample_text=(
        "You arrive at fridge 1. The fridge 1 is closed. You open the fridge 1. In it, you see "
        "a apple 1, a egg 2, and a tomato 1. Nothing happens. You pick up the apple 1 from the "
        "countertop 1. You heat the apple 1 using the microwave 1. You move the apple 1 to the "
        "diningtable 1. go to cabinet 1, open drawer 2, take mug 1 from shelf 3, use desklamp 1",
    ),
    extras=("alfworld",),
    modules=("textworld", "fast_downward"),
    paper=True,
    reference_profile="alfworld",
    expert_plans=expert_plans,
    preflight=_preflight,
)
"""ALFWorld (the real TextWorld engine): 50 steps, the raw observation as the grouping key."""
