"""Adapter to the original WebShop (``web_agent_site``) when a user has it installed.

The original package is not on the package registries (its catalog comes from a file host and
its search index needs Java). It exposes the same ``reset(task)`` / ``step(action)`` protocol as
:class:`agentenvs.webshop.env.WebShopEnv`. Tests run it against a stand-in ``web_agent_site``
(and ``gym``) with the real package's names, constructor, signatures and return shapes
(``tests/agentenvs/test_webshop_adapter.py``).

What the real package does, and what the adapter relies on (princeton-nlp/WebShop,
``web_agent_site/envs/web_agent_text_env.py``): ``import web_agent_site.envs`` registers
``WebAgentTextEnv-v0`` with ``gym``; ``WebAgentTextEnv(observation_mode='html',
file_path=..., server=None, **kwargs)`` (kwargs: ``num_products``, ``human_goals``,
``filter_goals``, ``limit_goals``, ``session``, ``session_prefix``, ``show_attrs``, ...);
``reset(session=None, instruction_text=None) -> (obs, None)``, where the goal is
``goals[session]`` only if ``session`` is a Python ``int`` (anything else, numpy integers
included, draws a random goal); ``step(action) -> (obs, reward, done, None)`` with the score
in [0, 1] as reward when "Buy Now" is clicked (done) and 0 otherwise;
``get_available_actions() -> {"has_search_bar": bool, "clickables": [str, ...]}``. The env
defines no ``action_space``, which gym >= 0.24's passive env checker refuses; verl-agent passes
``disable_env_checker=True`` to ``gym.make`` (older gym hands it to the env, whose ``**kwargs``
ignore it).
"""

from __future__ import annotations

from typing import Any

from hgpo.options import check_int

SUCCESS_REWARD = 10.0


def web_agent_site_available() -> bool:
    """True when ``web_agent_site`` can be imported."""
    try:
        import web_agent_site.envs  # noqa: F401
    except Exception:
        return False
    return True


class WebAgentSiteEnv:
    """The real WebShop text environment behind the project's protocol.

    goal_indices: the session indices (goal numbers) this env plays; ``reset(task)`` plays
    ``goal_indices[task]``. The real split: 0-499 test, 500-1499 eval, 1500+ train.
    """

    def __init__(self, goal_indices: list[int], max_steps: int = 15, **env_kwargs: Any) -> None:
        import gym
        import web_agent_site.envs  # noqa: F401 (registers WebAgentTextEnv-v0)

        goal_indices = list(goal_indices)
        if not goal_indices:
            raise ValueError("goal_indices must not be empty")
        goal_indices = [
            check_int(f"goal_indices[{i}]", g, lo=0) for i, g in enumerate(goal_indices)
        ]
        max_steps = check_int("max_steps", max_steps, lo=1)
        kwargs = {
            "observation_mode": "text", "num_products": None, "disable_env_checker": True,
            **env_kwargs,
        }  # fmt: skip
        self._env = gym.make("WebAgentTextEnv-v0", **kwargs)
        # the real env picks goals[session] only for a Python int session
        self.goal_indices = [int(g) for g in goal_indices]
        self.max_steps = max_steps
        self.steps, self.done, self._score = 0, True, 0.0
        self._obs: str | None = None

    @property
    def num_tasks(self) -> int:
        return len(self.goal_indices)

    def _info(self, reward: float) -> dict[str, Any]:
        avail = self._env.get_available_actions()
        acts = (["search[<your query>]"] if avail["has_search_bar"] else []) + [
            f"click[{c}]" for c in avail["clickables"]
        ]
        return {
            "won": reward == 1.0,
            "task_score": reward,
            "task_type": "webshop",
            "admissible_actions": acts,
            "available_actions": avail,
        }

    def reset(self, task: int) -> tuple[str, dict[str, Any]]:
        """Start goal ``goal_indices[task]``; returns the site's first page and info."""
        task = check_int("task", task, lo=0, hi=len(self.goal_indices) - 1)
        obs, _ = self._env.reset(session=self.goal_indices[task])
        self.steps, self.done, self._score = 0, False, 0.0
        self._obs = obs
        return obs, self._info(0.0)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One ``search[...]`` / ``click[...]``; reward 10 when the purchase scores 1, done on
        "Buy Now" or after ``max_steps`` steps. A finished episode is not stepped again."""
        if self._obs is None:
            raise ValueError("step called before reset")
        if self.done:
            return self._obs, 0.0, True, self._info(self._score)
        obs, reward, done, _ = self._env.step(action if isinstance(action, str) else "")
        self._obs = obs
        self.steps += 1
        self.done = bool(done) or self.steps >= self.max_steps
        self._score = float(reward) if done else 0.0
        info = self._info(self._score)
        return obs, SUCCESS_REWARD if info["won"] else 0.0, self.done, info

    def close(self) -> None:
        self._env.close()
