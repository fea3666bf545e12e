"""The toy POMDPs of :mod:`toyenvs` as text (:mod:`agentenvs.toytext`) as a
:class:`~agentenvs.adapters.Benchmark` (``--env toy:FAMILY:param=value,...``)."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agentenvs.adapters import Benchmark
from agentenvs.batched import TextEnv
from agentenvs.memory import EpisodeMemory
from agentenvs.parser import ParsedAction, parse_action
from agentenvs.toytext import (
    SPLITS,
    TOY_PREFIX,
    ToyText,
    parse_toy_spec,
    render,
    split_tasks,
    toy_corpus,
    toy_factory,
    toy_prompt,
)
from hgpo.options import bad


class ToySettings(Protocol):
    """What the toy adapter reads of a run's config."""

    env: str
    seed: int


def is_toy(env: str) -> bool:
    """True for a toy POMDP spec "toy:FAMILY:param=value,..." (agentenvs.toytext)."""
    return isinstance(env, str) and env.startswith(TOY_PREFIX)


@functools.lru_cache(maxsize=16)
def rendered(env: str) -> ToyText:
    """The text rendering of toy spec ``env`` (built once per spec and process)."""
    return render(parse_toy_spec(env).build())


def _split_size(settings: ToySettings, split: str) -> int:
    return int(split_tasks(parse_toy_spec(settings.env).build(), split).size)


def _factory(settings: ToySettings, split: str) -> Callable[[], TextEnv]:
    return toy_factory(parse_toy_spec(settings.env), split, seed=settings.seed)


def _task(first_obs: str, info: dict[str, Any]) -> str:
    return info.get("task", "")


def _same(obs: str, task: str) -> str:
    return obs  # a function of the observation id only: aliases what the POMDP aliases


def _prompt(
    env: str, task: str, obs: str, admissible: Sequence[str], memory: EpisodeMemory, k: int
) -> str:
    return toy_prompt(rendered(env).family, task, obs, admissible, memory, k)


def _parse(text: str, info: dict[str, Any]) -> ParsedAction:
    # parsed like ALFWorld (issue 14 hook): an unlisted action is invalid
    return parse_action(text, "alfworld", info.get("admissible_actions"))


def shortest_plan(env: Any, start: int) -> list[int]:
    """The fewest valid actions that take deterministic POMDP ``env`` from hidden state
    ``start`` into a rewarding terminal state (breadth-first search; ties: the lowest action
    ids first). Raises ValueError when no such path exists."""
    prev: dict[int, tuple[int, int]] = {start: (-1, -1)}
    todo = deque([start])
    while todo:
        s = todo.popleft()
        if env.terminal[s]:
            if env.reward_enter[s] <= 0:
                continue
            plan = []
            while prev[s][0] >= 0:
                s, a = prev[s]
                plan.append(a)
            return plan[::-1]
        for a in range(env.n_actions):
            s2 = int(env.next_state[s, a, 0])
            if not env.invalid[s, a] and s2 not in prev:
                prev[s2] = (s, a)
                todo.append(s2)
    raise ValueError(f"{env.name}: no path from state {start} reaches a goal")


def expert_plans(settings: ToySettings, tasks: list[int]) -> list[list[str]]:
    """The shortest plan to the goal of each training task (start state) of ``tasks``: the
    optimum when the spec has no slip. A spec with slip is refused (an open-loop plan is no
    expert there)."""
    env = parse_toy_spec(settings.env).build()
    if not env.deterministic:
        raise bad(
            "--env",
            "a toy spec without slip (the warm start replays open-loop plans)",
            settings.env,
        )
    starts = split_tasks(env, SPLITS[0])
    return [[env.action_names[a] for a in shortest_plan(env, int(starts[t]))] for t in tasks]


def _check(env: str, where: str) -> None:
    parse_toy_spec(env, where=where)


TOY = Benchmark(
    name="toy",
    own_horizon=True,
    # the toy env's own horizon ends its episodes; max_steps only caps it
    defaults={"max_steps": 100, "max_prompt_tokens": 2048, "mini_batch_size": 64, "val_tasks": 128},
    val_splits=("heldout",),
    split_size=_split_size,
    factory=_factory,
    task_text=_task,
    shown=_same,
    key=_same,
    prompt=_prompt,
    parse=_parse,
    spec=True,
    usage="toy:FAMILY:param=value,...",
    check=_check,
    corpus=toy_corpus,
    exact_truth=True,
    expert_plans=expert_plans,
)
"""A toy POMDP (issue 14 hook): held-out start states, known hidden states (exact truth)."""
