"""Stand-ins for ``gym`` and the original WebShop ``web_agent_site`` package, for the adapter test.

Written from princeton-nlp/WebShop (``web_agent_site/envs/__init__.py``,
``web_agent_site/envs/web_agent_text_env.py``, ``web_agent_site/engine/engine.py``) and gym
0.26 (``gym.make``, ``PassiveEnvChecker``, ``OrderEnforcing``), keeping what the adapter touches:

- ``web_agent_site.envs`` registers ``WebAgentTextEnv-v0`` (entry point
  ``web_agent_site.envs:WebAgentTextEnv``) with ``gym.envs.registration.register``;
- ``WebAgentTextEnv(observation_mode='html', file_path=DEFAULT_FILE_PATH, server=None,
  **kwargs)``, a ``gym.Env`` without ``action_space`` / ``observation_space``;
- ``reset(session=None, instruction_text=None) -> (obs, None)``; the goal is ``goals[session]``
  only when ``session`` is a Python ``int`` (``SimServer.receive``), else a random goal;
- ``step(action) -> (obs, reward, done, None)``: ``search[kw]`` runs for a non-empty argument,
  ``click[x]`` only for a clickable of the page other than "search" (arguments are
  lower-cased), anything else changes nothing; "buy now" ends the episode with the score as
  reward, every other step pays 0;
- ``get_available_actions() -> {"has_search_bar": bool, "clickables": [...]}`` with lower-cased
  button texts, product links (ASINs) and option values;
- text observations: the page's visible strings joined by " [SEP] ";
- ``gym.make`` consumes ``disable_env_checker`` (and the other make options), passes the rest
  to the constructor, wraps the env in ``OrderEnforcing`` (attributes forwarded) and, unless
  ``disable_env_checker``, in ``PassiveEnvChecker``, which asserts an ``action_space``.

The catalog, search and reward are toys (three products, exact-match scoring).
"""

from __future__ import annotations

import importlib
import random
import re
import sys
import types
from typing import Any

# ---------------------------------------------------------------------------------------------
# gym


class Env:
    """gym.Env: the real class annotates, but does not set, action and observation spaces."""

    def close(self) -> None:
        pass


class Wrapper(Env):
    def __init__(self, env: Any) -> None:
        self.env = env

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"accessing private attribute '{name}' is prohibited")
        return getattr(self.env, name)

    def reset(self, **kwargs: Any) -> Any:
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


class OrderEnforcing(Wrapper):
    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self._has_reset = False

    def reset(self, **kwargs: Any) -> Any:
        self._has_reset = True
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        if not self._has_reset:
            raise RuntimeError("Cannot call env.step() before calling env.reset()")
        return self.env.step(action)


class PassiveEnvChecker(Wrapper):
    def __init__(self, env: Any) -> None:
        super().__init__(env)
        assert hasattr(env, "action_space"), (
            "The environment must specify an action space. "
            "https://www.gymlibrary.dev/content/environment_creation/"
        )


REGISTRY: dict[str, str] = {}


def register(id: str, entry_point: str, **kwargs: Any) -> None:
    REGISTRY[id] = entry_point


def make(
    id: str,
    max_episode_steps: int | None = None,
    autoreset: bool = False,
    apply_api_compatibility: bool | None = None,
    disable_env_checker: bool | None = None,
    **kwargs: Any,
) -> Any:
    module, attr = REGISTRY[id].split(":")
    env = getattr(importlib.import_module(module), attr)(**kwargs)
    if not disable_env_checker:
        env = PassiveEnvChecker(env)
    return OrderEnforcing(env)


# ---------------------------------------------------------------------------------------------
# web_agent_site

DEFAULT_FILE_PATH = "data/items_shuffle.json"
END_BUTTON, NEXT_PAGE, PREV_PAGE, BACK_TO_SEARCH = "Buy Now", "Next >", "< Prev", "Back to Search"
PRODUCTS = [
    {"asin": "B0TEA00001", "title": "Green tea, 100 bags", "price": 9.99, "options": {}},
    {
        "asin": "B0MUG00002",
        "title": "Blue ceramic mug",
        "price": 12.5,
        "options": {"color": ["blue", "red"]},
    },
    {"asin": "B0LMP00003", "title": "Desk lamp", "price": 30.0, "options": {}},
]
GOALS = [
    {"asin": "B0TEA00001", "options": {}, "instruction_text": "i want green tea"},
    {"asin": "B0MUG00002", "options": {"color": "red"}, "instruction_text": "i need a red mug"},
    {"asin": "B0LMP00003", "options": {}, "instruction_text": "find me a desk lamp"},
]
_ACTION = re.compile(r"(.+)\[(.+)\]")


def parse_action(action: str) -> tuple[str, str | None]:
    """engine.parse_action: (name, argument) of "name[argument]", or (action, None)."""
    m = re.match(_ACTION, action)
    return (action, None) if m is None else (m.group(1), m.group(2))


class WebAgentTextEnv(Env):
    """Gym environment for Text mode of WebShop environment (toy catalog)."""

    def __init__(
        self,
        observation_mode: str = "html",
        file_path: str = DEFAULT_FILE_PATH,
        server: Any = None,
        **kwargs: Any,
    ) -> None:
        self.observation_mode = observation_mode
        self.file_path = file_path
        self.kwargs = kwargs
        self.session = kwargs.get("session")
        self.goals = GOALS
        self.sessions_started: list[tuple[Any, int]] = []  # (session argument, goal index)
        CONSTRUCTED.append(self)
        self.reset()

    # pages -----------------------------------------------------------------------------
    def _render(self) -> None:
        goal = self.goal["instruction_text"]
        head = ["Instruction:", goal]
        if self.page == "search":
            self.texts, self.buttons = ["WebShop", *head, "Search"], []
            self.search_bar = True
        elif self.page == "results":
            hits = [p for p in PRODUCTS if any(k in p["title"].lower() for k in self.keywords)]
            self.texts = [BACK_TO_SEARCH, *head, f"Page 1 (Total results: {len(hits)})"]
            self.buttons = [BACK_TO_SEARCH]
            for p in hits:
                self.texts += [p["asin"], p["title"], f"${p['price']}"]
                self.buttons.append(p["asin"])
            self.search_bar = False
        elif self.page == "item":
            p = self.product
            self.texts, self.buttons = (
                [BACK_TO_SEARCH, *head, PREV_PAGE],
                [BACK_TO_SEARCH, PREV_PAGE],
            )
            for name, values in p["options"].items():
                self.texts += [name, *values]
            self.texts += [p["title"], f"Price: ${p['price']}", "Rating: N.A.", "Description",
                           "Features", "Reviews", END_BUTTON]  # fmt: skip
            self.buttons += ["Description", "Features", "Reviews", END_BUTTON]
            self.search_bar = False
        else:  # done
            self.texts = ["Thank you for shopping with us!", *head,
                          "Your score (min 0.0, max 1.0)", str(self.score)]  # fmt: skip
            self.buttons, self.search_bar = [], False

    @property
    def observation(self) -> str:
        if self.observation_mode != "text":
            return "<html>" + "".join(f"<p>{t}</p>" for t in self.texts) + "</html>"
        return " [SEP] ".join(self.texts)

    def get_available_actions(self) -> dict[str, Any]:
        """Search bar flag and clickables: lower-cased buttons and product links, option values."""
        self.text_to_clickable = {b.lower(): b for b in self.buttons}
        if self.page == "item":
            for values in self.product["options"].values():
                for v in values:
                    self.text_to_clickable[v] = v
        return {"has_search_bar": self.search_bar, "clickables": list(self.text_to_clickable)}

    def reset(self, session: Any = None, instruction_text: str | None = None) -> tuple[str, None]:
        """Create a new session; goals[session] only for an int session, else a random goal."""
        idx = session if isinstance(session, int) else random.randrange(len(self.goals))
        self.sessions_started.append((session, idx))
        self.goal = self.goals[idx]
        self.page, self.keywords, self.product, self.chosen, self.score = (
            "search",
            [],
            None,
            {},
            0.0,
        )
        self._render()
        self.text_to_clickable = None
        return self.observation, None

    def step(self, action: str) -> tuple[str, float, bool, None]:
        self.get_available_actions()
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        reward, done = 0.0, False
        if name == "search" and arg:
            self.page, self.keywords = "results", arg.split(" ")
        elif name == "click" and arg in self.text_to_clickable and arg != "search":
            if arg == BACK_TO_SEARCH.lower():
                self.page = "search"
            elif arg == PREV_PAGE.lower():
                self.page = "results"
            elif arg == END_BUTTON.lower():
                g = self.goal
                same = self.product["asin"] == g["asin"]
                self.score = 1.0 if same and self.chosen == g["options"] else (0.5 if same else 0.0)
                self.page, reward, done = "done", self.score, True
            elif self.page == "results":
                self.product = next(p for p in PRODUCTS if p["asin"].lower() == arg)
                self.page, self.chosen = "item", {}
            elif self.page == "item":
                for opt, values in self.product["options"].items():
                    if arg in values:
                        self.chosen[opt] = arg
        self._render()
        return self.observation, reward, done, None

    def close(self) -> None:
        pass


CONSTRUCTED: list[WebAgentTextEnv] = []


def install(monkeypatch: Any) -> None:
    """Put the stand-ins in ``sys.modules`` (undone by ``monkeypatch`` after the test)."""
    gym = types.ModuleType("gym")
    gym.Env, gym.Wrapper, gym.make = Env, Wrapper, make
    gym_envs = types.ModuleType("gym.envs")
    gym_reg = types.ModuleType("gym.envs.registration")
    gym_reg.register = register
    gym.envs, gym_envs.registration = gym_envs, gym_reg

    site = types.ModuleType("web_agent_site")
    site_envs = types.ModuleType("web_agent_site.envs")
    text_env = types.ModuleType("web_agent_site.envs.web_agent_text_env")
    text_env.WebAgentTextEnv = text_env_cls = WebAgentTextEnv
    site_envs.WebAgentTextEnv = text_env_cls
    site_envs.web_agent_text_env = text_env
    site.envs = site_envs
    for name, mod in (
        ("gym", gym), ("gym.envs", gym_envs), ("gym.envs.registration", gym_reg),
        ("web_agent_site", site), ("web_agent_site.envs", site_envs),
        ("web_agent_site.envs.web_agent_text_env", text_env),
    ):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)
    REGISTRY.clear()
    # what web_agent_site/envs/__init__.py does on import
    register(id="WebAgentTextEnv-v0", entry_point="web_agent_site.envs:WebAgentTextEnv")
    CONSTRUCTED.clear()
