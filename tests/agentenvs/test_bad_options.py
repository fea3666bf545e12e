"""Every numeric option of the agent environments goes through hgpo.options: one error shape,
``<field>: must be <what>, got <value>``, and no float, bool or NaN read as a count or a time."""

import math

import pytest

from agentenvs.alfworld.env import AlfWorldEnv
from agentenvs.batched import BatchedEnv
from agentenvs.factories import (
    alfworld_factory,
    alfworld_games,
    observation_key,
    web_agent_site_factory,
    webshop_factory,
)
from agentenvs.memory import BatchMemory, EpisodeMemory
from agentenvs.parser import parse_action
from agentenvs.toytext import ToyTextEnv, parse_toy_spec
from agentenvs.webshop.catalog import generate_goals, split_goals
from agentenvs.webshop.env import WebShopEnv, make_world


class _Never:
    """A factory the checks must refuse before anything is built."""

    def __init__(self):
        raise AssertionError("built an env before checking the options")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs": 0}, r"^num_envs: must be an integer >= 1, got 0$"),
        ({"num_envs": 2.5}, r"^num_envs: must be an integer >= 1, got 2\.5$"),
        ({"num_envs": True}, r"^num_envs: must be an integer >= 1, got True$"),
        ({"num_envs": 2, "num_workers": 0}, r"^num_workers: must be an integer >= 1, got 0$"),
        (
            {"num_envs": 2, "timeout_s": math.nan},
            r"^timeout_s: must be a finite number > 0\.0, got nan$",
        ),
        (
            {"num_envs": 2, "timeout_s": math.inf},
            r"^timeout_s: must be a finite number > 0\.0, got inf$",
        ),
        ({"num_envs": 2, "timeout_s": 0}, r"^timeout_s: must be a finite number > 0\.0, got 0$"),
        (
            {"num_envs": 2, "start_method": "thread"},
            r"^start_method: must be one of .*'fork'.*, got 'thread'$",
        ),
    ],
)
def test_batched_env_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchedEnv(_Never, **kwargs)


def test_text_env_options():
    with pytest.raises(ValueError, match=r"^max_steps: must be an integer >= 1, got nan$"):
        WebShopEnv(max_steps=math.nan)
    with pytest.raises(ValueError, match=r"^max_steps: must be an integer >= 1, got 2\.5$"):
        AlfWorldEnv(["game.tw-pddl"], max_steps=2.5)
    with pytest.raises(
        ValueError, match=r"^split: must be one of 'train', 'eval', 'test', got 'dev'$"
    ):
        WebShopEnv(split="dev")
    with pytest.raises(ValueError, match=r"^n_eval: must be an integer in 1\.\.9, got 10$"):
        make_world(n_products=20, n_goals=10, n_eval=10)
    with pytest.raises(ValueError, match=r"^n_goals: must be an integer >= 1, got 0$"):
        generate_goals([], n_goals=0)
    with pytest.raises(ValueError, match=r"^n_eval: must be an integer in 0\.\.0, got 1$"):
        split_goals([], n_eval=1)
    env = ToyTextEnv(parse_toy_spec("toy:tmaze:length=2"))
    with pytest.raises(ValueError, match=r"^task: must be an integer in 0\.\.\d+, got 1\.0$"):
        env.reset(1.0)


def test_factories_check_before_any_worker_builds():
    with pytest.raises(ValueError, match=r"^max_steps: must be an integer >= 1, got 0$"):
        webshop_factory(max_steps=0)
    with pytest.raises(ValueError, match=r"^n_eval: must be an integer in 1\.\.1999, got 2000$"):
        webshop_factory(n_eval=2000)
    with pytest.raises(
        ValueError, match=r"^split: must be one of 'train', 'eval', 'test', got 'x'$"
    ):
        webshop_factory(split="x")
    with pytest.raises(ValueError, match=r"^goal_indices\[1\]: must be an integer >= 0, got 1\.5$"):
        web_agent_site_factory([0, 1.5])  # (was read as goal 1)
    with pytest.raises(ValueError, match=r"^max_steps: must be an integer >= 1, got 2\.5$"):
        alfworld_factory(["game.tw-pddl"], max_steps=2.5)
    with pytest.raises(ValueError, match=r"^n_games: must be an integer >= 0, got -1$"):
        alfworld_games(n_games=-1)
    with pytest.raises(ValueError, match=r"^benchmark: must be one of 'alfworld', 'webshop'"):
        observation_key("sokoban", "obs")


def test_memory_and_parser_options():
    with pytest.raises(ValueError, match=r"^history_length: must be an integer >= 0, got 1\.5$"):
        EpisodeMemory().fetch(1.5)
    with pytest.raises(ValueError, match=r"^batch_size: must be an integer >= 0, got -1$"):
        BatchMemory(-1)
    with pytest.raises(
        ValueError, match=r"^env: must be one of 'alfworld', 'webshop', got 'sokoban'$"
    ):
        parse_action("<action>go</action>", env="sokoban")


def _batch(n=2):
    from agentenvs.toytext import toy_factory

    return BatchedEnv(toy_factory(parse_toy_spec("toy:tmaze:length=1")), num_envs=n,
                      num_workers=1)  # fmt: skip


def test_batched_env_calls_check_their_arguments_in_this_process():
    """Before: int() read 1.5, True and "0" as tasks or slots, and a non-str action crashed
    its slot's env, losing the episode."""
    env = _batch()
    try:
        for tasks, message in (
            ([1.5, 0], "BatchedEnv.reset: tasks[0]: must be an integer >= 0, got 1.5"),
            ([True, 0], "BatchedEnv.reset: tasks[0]: must be an integer >= 0, got True"),
            ("00", "BatchedEnv.reset: tasks: must be a list (one entry per slot), got '00'"),
        ):
            with pytest.raises(ValueError) as e:
                env.reset(tasks)
            assert str(e.value) == message
        env.reset([0, 0])
        with pytest.raises(ValueError, match=r"^BatchedEnv\.step: actions\[1\]: must be a str"):
            env.step(["left", None])
        with pytest.raises(ValueError, match=r"^BatchedEnv\.step: snapshot: must be true or false"):
            env.step(["left", "left"], snapshot="no")
        with pytest.raises(
            ValueError, match=r"^BatchedEnv\.park: slots\[0\]: must be an integer, got 1\.5"
        ):
            env.park([1.5])
        with pytest.raises(ValueError, match=r"^BatchedEnv\.snapshot: slots: must be a list"):
            env.snapshot(0)
        with pytest.raises(
            ValueError, match=r"^BatchedEnv\.restore: pairs\[0\]: must be a \(slot, Snapshot\) pair"
        ):
            env.restore([5])
    finally:
        env.close()


def test_text_env_helpers_refuse_strings_read_as_sequences_and_coerced_seeds():
    from agentenvs.toytext import toy_factory

    spec = parse_toy_spec("toy:tmaze:length=1")
    with pytest.raises(ValueError, match=r"^seed: must be an integer >= 0, got 1\.5$"):
        toy_factory(spec, seed=1.5)
    with pytest.raises(ValueError, match=r"^toy_factory: spec: must be a ToySpec"):
        toy_factory("toy:tmaze:length=1")
    with pytest.raises(ValueError, match=r"^seed: must be an integer >= 0, got True$"):
        ToyTextEnv(spec, seed=True)
    with pytest.raises(
        ValueError, match=r"^game_files: must be a list of game file paths, got 'abc'$"
    ):
        alfworld_factory("abc")
    with pytest.raises(ValueError, match=r"^admissible: must be a list of actions, not one string"):
        parse_action("<think>x</think><action>a</action>", admissible="abc")
    with pytest.raises(ValueError, match=r"^admissible: must be a list of str actions, got 1$"):
        parse_action("<think>x</think><action>a</action>", admissible=[1, 2])
    with pytest.raises(ValueError, match=r"^require_think: must be true or false, got 'no'$"):
        parse_action("<action>a</action>", require_think="no")


def test_prompts_check_their_history_arguments_before_the_first_step():
    """Before: with an empty memory (step 1) any history_length passed, nan and -1 included."""
    from agentenvs.prompts import alfworld_prompt, webshop_prompt

    for prompt in (alfworld_prompt, webshop_prompt):
        with pytest.raises(ValueError, match=r"^history_length: must be an integer >= 0, got nan$"):
            prompt("task", "obs", ["go"], EpisodeMemory(), math.nan)
        with pytest.raises(ValueError, match=r"^history_length: must be an integer >= 0, got -1$"):
            prompt("task", "obs", ["go"], EpisodeMemory(), -1)
        with pytest.raises(
            ValueError, match=r"^memory: must be an agentenvs\.memory\.EpisodeMemory"
        ):
            prompt("task", "obs", ["go"], None, 2)


def test_a_toy_text_env_names_a_non_str_action_and_render_a_non_env():
    from agentenvs.toytext import render

    env = ToyTextEnv(parse_toy_spec("toy:tmaze:length=1"))
    env.reset(0)
    with pytest.raises(ValueError, match=r"^action: must be a str \(the text action\), got None$"):
        env.step(None)
    with pytest.raises(
        ValueError, match=r"^render: env: must be a toyenvs\.POMDP, got 'NoneType'$"
    ):
        render(None)
