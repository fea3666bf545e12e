"""Memory module and the paper's prompt templates, as exact strings."""

import pytest

from agentenvs.memory import BatchMemory, EpisodeMemory
from agentenvs.prompts import (
    alfworld_prompt,
    alfworld_task,
    format_alfworld_actions,
    format_webshop_actions,
    webshop_prompt,
)

FIRST = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly "
    "around you, you see a cabinet 1, and a fridge 1.\n\nYour task is to: put a cool apple "
    "in cabinet."
)


def test_memory_keeps_last_k_with_global_step_numbers():
    m = EpisodeMemory()
    for i in range(5):
        m.store(f"o{i}", f"a{i}")
    text, n = m.fetch(2)
    assert n == 2
    assert text == "[Observation 4: 'o3', Action 4: 'a3']\n[Observation 5: 'o4', Action 5: 'a4']"
    assert m.fetch(0) == ("", 0)
    assert m.fetch(10)[1] == 5
    with pytest.raises(ValueError, match="history_length"):
        m.fetch(-1)


def test_batch_memory_checks_lengths():
    b = BatchMemory(2)
    b.store(["x", "y"], ["a", "b"])
    assert b.fetch(4) == (
        ["[Observation 1: 'x', Action 1: 'a']", "[Observation 1: 'y', Action 1: 'b']"],
        [1, 1],
    )
    with pytest.raises(ValueError, match="len\\(observations\\)"):
        b.store(["x"], ["a", "b"])


def test_alfworld_task_extraction():
    assert alfworld_task(FIRST) == "put a cool apple in cabinet."
    with pytest.raises(ValueError, match="first_observation"):
        alfworld_task("no task here")


def test_alfworld_prompt_without_history_exact():
    got = alfworld_prompt("t", FIRST, ["go to cabinet 1", "help", "look"], EpisodeMemory(), 2)
    want = (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
        f"Your current observation is: {FIRST}\n"
        "Your admissible actions of the current situation are: ['go to cabinet 1'\n 'look'].\n\n"
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning "
        "process MUST be enclosed within <think> </think> tags. \n"
        "Once you've finished your reasoning, you should choose an admissible action for current "
        "step and present it within <action> </action> tags.\n"
    )
    assert got == want


def test_alfworld_prompt_with_history_exact():
    m = EpisodeMemory()
    m.store(FIRST, "go to fridge 1")
    m.store("You arrive at fridge 1. The fridge 1 is closed.", "open fridge 1")
    m.store("You open the fridge 1. The fridge 1 is open. In it, you see nothing.", "look")
    got = alfworld_prompt("put a cool apple in cabinet.", "obs now", ["look"], m, 2)
    want = (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task is "
        "to: put a cool apple in cabinet.\n"
        "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 "
        "observaitons and the corresponding actions you took: "
        "[Observation 2: 'You arrive at fridge 1. The fridge 1 is closed.', Action 2: 'open "
        "fridge 1']\n[Observation 3: 'You open the fridge 1. The fridge 1 is open. In it, you "
        "see nothing.', Action 3: 'look']\n"
        "You are now at step 4 and your current observation is: obs now\n"
        "Your admissible actions of the current situation are: ['look'].\n\n"
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning "
        "process MUST be enclosed within <think> </think> tags. \n"
        "Once you've finished your reasoning, you should choose an admissible action for current "
        "step and present it within <action> </action> tags.\n"
    )
    assert got == want
    # K = 0 means the no-history template at every step
    assert alfworld_prompt("t", "o", ["look"], m, 0).startswith(
        "\nYou are an expert agent operating in the ALFRED Embodied Environment.\nYour current"
    )


def test_webshop_prompts_exact():
    acts = ["search[<your query>]", "click[search]"]
    assert format_webshop_actions(acts) == "'search[<your query>]',\n'click[search]',"
    assert format_alfworld_actions(["a", "help", "b"]) == "'a'\n 'b'"
    got = webshop_prompt("find a mug", "'Search'", acts, EpisodeMemory(), 2)
    assert got == (
        "\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce "
        "environment. \nYour task is to: find a mug.\nYour current observation is: 'Search'.\n"
        "Your admissible actions of the current situation are: \n[\n'search[<your query>]',\n"
        "'click[search]',\n].\n\nNow it's your turn to take one action for the current step.\n"
        "You should first reason step-by-step about the current situation, then think carefully "
        "which admissible action best advances the shopping goal. This reasoning process MUST be "
        "enclosed within <think> </think> tags. \nOnce you've finished your reasoning, you should "
        "choose an admissible action for current step and present it within <action> </action> "
        "tags.\n"
    )
    m = EpisodeMemory()
    m.store("'Search'", "search[mug]")
    his = webshop_prompt("find a mug", "'Back to Search'", ["click[back to search]"], m, 2)
    assert (
        "Prior to this step, you have already taken 1 step(s). Below are the most recent 1 "
        "observations and the corresponding actions you took: [Observation 1: ''Search'', "
        "Action 1: 'search[mug]']\nYou are now at step 2 and your current observation is: "
        "'Back to Search'.\n"
    ) in his
    m.store("x" * 20000, "click[y]")
    assert "Prior to this step" not in webshop_prompt("g", "o", [], m, 2)


def test_alfworld_score_mode_candidates_are_the_listed_actions():
    """Score mode chooses among the actions the prompt lists: the reference's list drops
    'help', so the candidates do too (before, score mode could choose 'help', never shown)."""
    from agentenvs.registry import benchmark

    admissible = ["go to desk 1", "help", "look", "go to desk 1", "inventory"]
    cands = benchmark("alfworld").candidates(admissible, "")
    assert cands == ["go to desk 1", "look", "inventory"]
    listed = format_alfworld_actions(admissible)
    assert all(f"'{c}'" in listed for c in cands) and "'help'" not in listed
