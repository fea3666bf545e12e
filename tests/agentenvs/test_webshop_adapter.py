"""The ``web_agent_site`` adapter against stand-ins with the real package's API (see
``fake_web_agent_site.py`` for what they reproduce and where it comes from)."""

from __future__ import annotations

import numpy as np
import pytest

from agentenvs.webshop.adapter import SUCCESS_REWARD, WebAgentSiteEnv, web_agent_site_available

from . import fake_web_agent_site as fake


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch):
    fake.install(monkeypatch)
    return fake


def test_available_only_when_the_package_imports(site, monkeypatch):
    assert web_agent_site_available()
    monkeypatch.setitem(__import__("sys").modules, "web_agent_site", None)
    assert not web_agent_site_available()


def test_constructor_arguments_reach_the_real_class(site):
    env = WebAgentSiteEnv([0], human_goals=True)
    (inner,) = site.CONSTRUCTED
    assert inner.observation_mode == "text"
    assert inner.kwargs == {"num_products": None, "human_goals": True}
    assert inner.file_path == site.DEFAULT_FILE_PATH
    env.close()


def test_gym_env_checker_would_refuse_the_real_env(site):
    # the reason the adapter passes disable_env_checker=True (WebAgentTextEnv has no spaces)
    with pytest.raises(AssertionError, match="action space"):
        site.make("WebAgentTextEnv-v0", observation_mode="text")


def test_numpy_goal_indices_select_the_goal_not_a_random_one(site):
    env = WebAgentSiteEnv(np.array([2, 1]))
    obs, info = env.reset(0)
    inner = site.CONSTRUCTED[-1]
    assert inner.sessions_started[-1] == (2, 2) and type(inner.sessions_started[-1][0]) is int
    assert obs == "WebShop [SEP] Instruction: [SEP] find me a desk lamp [SEP] Search"
    assert info["admissible_actions"] == ["search[<your query>]"]
    assert info["available_actions"] == {"has_search_bar": True, "clickables": []}
    assert info["won"] is False and info["task_score"] == 0.0 and info["task_type"] == "webshop"
    env.reset(1)
    assert inner.sessions_started[-1] == (1, 1)


def test_successful_purchase_pays_10_and_ends(site):
    env = WebAgentSiteEnv([1])
    env.reset(0)
    obs, r, done, info = env.step("search[mug]")
    assert (r, done) == (0.0, False)
    assert obs.startswith("Back to Search [SEP] Instruction: [SEP] i need a red mug")
    assert info["admissible_actions"] == ["click[back to search]", "click[b0mug00002]"]
    _, r, done, info = env.step("click[b0mug00002]")
    assert (
        "click[red]" in info["admissible_actions"]
        and "click[buy now]" in info["admissible_actions"]
    )
    _, r, done, _ = env.step("click[red]")
    obs, r, done, info = env.step("click[buy now]")
    assert (r, done) == (SUCCESS_REWARD, True)
    assert info["won"] is True and info["task_score"] == 1.0
    assert obs.endswith("Your score (min 0.0, max 1.0) [SEP] 1.0")
    # a finished episode is not stepped again
    assert env.step("search[tea]") == (obs, 0.0, True, info)


def test_partial_purchase_keeps_the_score_but_pays_nothing(site):
    env = WebAgentSiteEnv([1])
    env.reset(0)
    env.step("search[mug]")
    env.step("click[b0mug00002]")
    _, r, done, info = env.step("click[buy now]")  # colour not chosen
    assert (r, done) == (0.0, True)
    assert info["won"] is False and info["task_score"] == 0.5


def test_invalid_actions_change_nothing_and_the_step_limit_ends_the_episode(site):
    env = WebAgentSiteEnv([0], max_steps=3)
    first, _ = env.reset(0)
    for action in ("click[buy now]", "jump", "search[]"):
        obs, r, done, info = env.step(action)
        assert obs == first and r == 0.0
    assert done and not info["won"]
    with pytest.raises(ValueError, match="task"):
        env.reset(1)


def test_bad_arguments(site):
    with pytest.raises(ValueError, match="goal_indices"):
        WebAgentSiteEnv([])
    with pytest.raises(ValueError, match="goal_indices"):
        WebAgentSiteEnv([-1])
    with pytest.raises(ValueError, match="reset"):
        WebAgentSiteEnv([0]).step("search[tea]")


def test_batched_groups_start_identical(site):
    from agentenvs.batched import BatchedEnv
    from agentenvs.factories import web_agent_site_factory

    with BatchedEnv(web_agent_site_factory([0, 1, 2]), num_envs=4, num_workers=2) as env:
        obs, infos = env.reset([2, 0], group_n=2)
        assert obs[0] == obs[1] and obs[2] == obs[3] and obs[0] != obs[2]
        assert "desk lamp" in obs[0] and "green tea" in obs[2]
        obs, _, _, infos = env.step(["search[lamp]", "search[tea]", "search[tea]", "jump"])
        assert not any(i["crashed"] for i in infos)
        assert "B0LMP00003" in obs[0] and "B0LMP00003" not in obs[1]
