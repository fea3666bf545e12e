"""WebShop in text mode, offline: the real engine's pages, clickables and reward over a
generated catalog.

Pages and their visible strings (joined by " [SEP] "; every page but the search page starts
with the instruction header "Instruction: [SEP] {goal} [SEP] ", as the real site's HTML does):
- search: "WebShop [SEP] Instruction: [SEP] {goal} [SEP] Search"; clickables ["search"]
  (``click[search]`` is a no-op: searching is ``search[query]``).
- results: "Back to Search [SEP] Page {p} (Total results: {n}) [SEP] < Prev (p > 1) [SEP]
  Next > (more pages) [SEP] {ASIN} [SEP] {title} [SEP] {price} ..." (top 50 by BM25, 10 per page).
- item: "Back to Search [SEP] < Prev [SEP] {option name} [SEP] {value} ... [SEP] {title} [SEP]
  Price: {price} [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now".
- sub-pages (description, features, reviews): "Back to Search [SEP] < Prev [SEP] {text}".
- done: "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {R}".
Clickables are the lower-cased button texts. ``search[q]`` runs whenever q is non-empty, from any
page; ``click[x]`` runs only if x is a clickable of the page; anything else is a no-op.

Optimum: every goal was written from one catalog product, so search[its query] ... click[asin],
choosing the goal's option values, click[buy now] scores R = 1 when the target is retrieved in
the top 50 (the scripted expert in :func:`expert_actions` follows this route).

Snapshots (branching rollouts): :meth:`WebShopEnv.snapshot` is a :class:`WebShopSnapshot` of
the session (goal number, page, result list, chosen options, step count, score), a few hundred
bytes; the catalog and search index are shared by every env of a process and never copied.
The simulator has no randomness.

Same role as ``agentenvs/alfworld/env.py`` in a parallel benchmark package (each
benchmark's ``env.py`` holds its environment class); the shared name is deliberate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from agentenvs.webshop.catalog import (
    Goal,
    Product,
    generate_catalog,
    generate_goals,
    split_goals,
)
from agentenvs.webshop.reward import reward_parts
from hgpo.options import bad, check_int

SEP = " [SEP] "
RESULTS_TOTAL = 50
RESULTS_PER_PAGE = 10
MAX_STEPS = 15
SUCCESS_REWARD = 10.0
_ACTION = re.compile(r"^(search|click)\[(.*)\]$", re.DOTALL)


class SearchIndex:
    """BM25 (bm25s) over the text the real engine indexes (title, description, bullet, options)."""

    def __init__(self, products: list[Product]) -> None:
        import bm25s

        self.products = products
        self._retriever = bm25s.BM25()
        self._retriever.index(
            bm25s.tokenize([p.search_text for p in products], show_progress=False),
            show_progress=False,
        )
        self._cache: dict[str, list[int]] = {}

    def search(self, query: str, k: int = RESULTS_TOTAL) -> list[int]:
        """Indices of the top ``k`` products with a positive score, best first."""
        key = f"{k}\x00{query.lower()}"
        if key in self._cache:
            return self._cache[key]
        import bm25s

        tokens = bm25s.tokenize([query.lower()], show_progress=False)
        if not tokens.vocab or len(self.products) == 0:
            return []
        docs, scores = self._retriever.retrieve(
            tokens, k=min(k, len(self.products)), show_progress=False, n_threads=1
        )
        out = [int(d) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = out
        return out


@dataclass
class WebShopWorld:
    """A catalog, its search index and its goals (shared by every env of a process)."""

    products: list[Product]
    index: SearchIndex
    train_goals: list[Goal]
    eval_goals: list[Goal]
    by_asin: dict[str, int] = field(default_factory=dict)

    def goals(self, split: str) -> list[Goal]:
        """Goals of ``split``: "train" or "eval" (alias "test")."""
        if split == "train":
            return self.train_goals
        if split in ("eval", "test"):
            return self.eval_goals
        raise bad("split", "one of 'train', 'eval', 'test'", split)


@lru_cache(maxsize=4)
def make_world(
    seed: int = 0, n_products: int = 5000, n_goals: int = 2000, n_eval: int = 500
) -> WebShopWorld:
    """Generate (once per process and arguments) the catalog, index and goal split."""
    check_int("seed", seed, lo=0)
    n_products = check_int("n_products", n_products, lo=1)
    n_goals = check_int("n_goals", n_goals, lo=2)
    n_eval = check_int("n_eval", n_eval, lo=1, hi=n_goals - 1)
    products = generate_catalog(seed, n_products)
    train, evals = split_goals(generate_goals(products, seed, n_goals), n_eval)
    return WebShopWorld(
        products, SearchIndex(products), train, evals, {p.asin: i for i, p in enumerate(products)}
    )


@dataclass(frozen=True)
class WebShopSnapshot:
    """One WebShop session, without the world (catalog, index, goals) it is played in.

    task and instruction: the goal (the instruction checks that the restoring env's world
    has the same goal under that number). results: the product indices of the last search.
    item: the open product's index. chosen: option name -> value. valid: whether the last
    action ran (``info["action_executed"]``). parts: the reward's parts once bought.
    """

    task: int
    instruction: str
    page: str
    results: tuple[int, ...]
    result_page: int
    item: int | None
    sub: str
    chosen: tuple[tuple[str, str], ...]
    steps: int
    done: bool
    score: float
    valid: bool
    parts: Any = None


class WebShopEnv:
    """One WebShop session (text mode). ``reset(task)`` then ``step(action)`` until done."""

    task_types = ("beauty", "electronics", "fashion", "food", "furniture")
    supports_snapshot = True

    def __init__(
        self, world: WebShopWorld | None = None, split: str = "train", max_steps: int = MAX_STEPS
    ) -> None:
        max_steps = check_int("max_steps", max_steps, lo=1)
        self.world = world if world is not None else make_world()
        self.goals = self.world.goals(split)
        self.max_steps = max_steps
        self.goal: Goal | None = None

    @property
    def num_tasks(self) -> int:
        return len(self.goals)

    # -- state --------------------------------------------------------------------------------
    def reset(self, task: int) -> tuple[str, dict[str, Any]]:
        """Start goal number ``task`` of the split on the search page."""
        task = check_int("task", task, lo=0, hi=len(self.goals) - 1)
        self.goal = self.goals[task]
        self.task = task
        self.page = "search"
        self.results: list[int] = []
        self.result_page = 1
        self.item: int | None = None
        self.sub = ""
        self.chosen: dict[str, str] = {}
        self.steps = 0
        self.done = False
        self.score = 0.0
        self.parts = None
        self._valid = False
        return self.observation(), self._info(False)

    def snapshot(self) -> WebShopSnapshot:
        """The current session (see :class:`WebShopSnapshot`)."""
        if self.goal is None:
            raise ValueError("snapshot called before reset")
        return WebShopSnapshot(
            self.task, self.goal.instruction, self.page, tuple(self.results), self.result_page,
            self.item, self.sub, tuple(self.chosen.items()), self.steps, self.done, self.score,
            self._valid, self.parts,
        )  # fmt: skip

    def restore(self, snap: WebShopSnapshot) -> tuple[str, dict[str, Any]]:
        """Continue ``snap``'s session here; returns the observation and info current when it
        was taken. The goal must be this env's goal number ``snap.task`` (same world, split)."""
        if not isinstance(snap, WebShopSnapshot):
            raise TypeError(f"restore: expected a WebShopSnapshot, got {type(snap).__name__}")
        if not 0 <= snap.task < len(self.goals) or (
            self.goals[snap.task].instruction != snap.instruction
        ):
            raise ValueError(
                f"restore: goal {snap.task} of the snapshot ({snap.instruction!r}) is not this "
                "env's goal of that number (another catalog seed, size or split)"
            )
        self.goal, self.task = self.goals[snap.task], snap.task
        self.page, self.results, self.result_page = snap.page, list(snap.results), snap.result_page
        self.item, self.sub, self.chosen = snap.item, snap.sub, dict(snap.chosen)
        self.steps, self.done, self.score = snap.steps, snap.done, snap.score
        self.parts, self._valid = snap.parts, snap.valid
        return self.observation(), self._info(snap.valid)

    def clickables(self) -> list[str]:
        """Lower-cased texts of the page's buttons and links."""
        if self.page == "search":
            return ["search"]
        if self.page == "results":
            out = ["back to search"]
            if self.result_page > 1:
                out.append("< prev")
            if self.result_page * RESULTS_PER_PAGE < len(self.results):
                out.append("next >")
            out += [self.world.products[i].asin.lower() for i in self._page_items()]
            return out
        if self.page == "item":
            p = self._product()
            vals = [v.lower() for vs in p.options.values() for v in vs]
            return [
                "back to search",
                "< prev",
                *vals,
                "description",
                "features",
                "reviews",
                "buy now",
            ]
        if self.page == "sub":
            return ["back to search", "< prev"]
        return []

    def available_actions(self) -> dict[str, Any]:
        """The real engine's form: {"has_search_bar": bool, "clickables": [...]}."""
        return {"has_search_bar": self.page == "search", "clickables": self.clickables()}

    def admissible_actions(self) -> list[str]:
        """The prompt's list: 'search[<your query>]' on the search page, 'click[x]' per button."""
        out = ["search[<your query>]"] if self.page == "search" else []
        return out + [f"click[{c}]" for c in self.clickables()]

    def observation(self) -> str:
        """The page's visible strings joined by " [SEP] " (see the module docstring)."""
        assert self.goal is not None
        head = ["Instruction:", self.goal.instruction]
        if self.page == "search":
            return SEP.join(["WebShop", *head, "Search"])
        if self.page == "done":
            return SEP.join(
                [
                    "Thank you for shopping with us!",
                    "Your score (min 0.0, max 1.0)",
                    f"{self.score}",
                ]
            )
        return SEP.join([*head, self.page_text()])

    def page_text(self) -> str:
        """The page without the instruction header (the spec's example strings)."""
        if self.page == "results":
            parts = [
                "Back to Search",
                f"Page {self.result_page} (Total results: {len(self.results)})",
            ]
            if self.result_page > 1:
                parts.append("< Prev")
            if self.result_page * RESULTS_PER_PAGE < len(self.results):
                parts.append("Next >")
            for i in self._page_items():
                p = self.world.products[i]
                parts += [p.asin, p.title, p.price_text]
            return SEP.join(parts)
        p = self._product()
        if self.page == "item":
            parts = ["Back to Search", "< Prev"]
            for name, values in p.options.items():
                parts += [name, *values]
            parts += [
                p.title,
                f"Price: {p.price_text}",
                "Rating: N.A.",
                "Description",
                "Features",
                "Reviews",
                "Buy Now",
            ]
            return SEP.join(parts)
        if self.sub == "description":
            body = [p.description]
        elif self.sub == "features":
            body = list(p.bullet_points)
        else:
            body = ["No reviews yet."]
        return SEP.join(["Back to Search", "< Prev", *body])

    # -- dynamics -----------------------------------------------------------------------------
    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one text action; returns (observation, reward 10/0, done, info)."""
        if self.goal is None:
            raise ValueError("step called before reset")
        if self.done:
            self._valid = False
            return self.observation(), 0.0, True, self._info(False)
        self.steps += 1
        m = _ACTION.match(action.strip()) if isinstance(action, str) else None
        valid = False
        if m is not None:
            kind, arg = m.group(1), m.group(2).strip()
            if kind == "search" and arg:
                self.results = self.world.index.search(arg)
                self.page, self.result_page = "results", 1
                valid = True
            elif kind == "click" and arg.lower() in self.clickables() and arg.lower() != "search":
                self._click(arg.lower())
                valid = True
        if self.page == "done" or self.steps >= self.max_steps:
            self.done = True
        won = self.page == "done" and self.score == 1.0
        reward = SUCCESS_REWARD if won else 0.0
        self._valid = valid
        return self.observation(), reward, self.done, self._info(valid)

    def _click(self, x: str) -> None:
        if x == "back to search":
            self.page, self.item, self.chosen = "search", None, {}
        elif x == "next >":
            self.result_page += 1
        elif x == "< prev":
            if self.page == "results":
                self.result_page -= 1
            elif self.page == "item":
                self.page, self.item, self.chosen = "results", None, {}
            else:
                self.page = "item"
        elif self.page == "results":
            asins = {self.world.products[i].asin.lower(): i for i in self._page_items()}
            self.page, self.item, self.chosen = "item", asins[x], {}
        elif x in ("description", "features", "reviews"):
            self.page, self.sub = "sub", x
        elif x == "buy now":
            assert self.goal is not None
            self.parts = reward_parts(self._product(), self.goal, self.chosen)
            self.score = self.parts.total
            self.page = "done"
        else:
            for name, values in self._product().options.items():
                for v in values:
                    if v.lower() == x:
                        self.chosen[name] = v

    def _page_items(self) -> list[int]:
        lo = (self.result_page - 1) * RESULTS_PER_PAGE
        return self.results[lo : lo + RESULTS_PER_PAGE]

    def _product(self) -> Product:
        assert self.item is not None
        return self.world.products[self.item]

    def _info(self, valid: bool) -> dict[str, Any]:
        assert self.goal is not None
        won = self.page == "done" and self.score == 1.0
        return {
            "won": won,
            "task_score": self.score,
            "task_type": self.goal.task_type,
            "admissible_actions": self.admissible_actions(),
            "available_actions": self.available_actions(),
            "action_executed": valid,
            "task": self.goal.instruction,
        }


def expert_actions(env: WebShopEnv) -> list[str]:
    """A scripted route to the goal's product from the search page (for tests and baselines).

    Searches the product's query, pages to the target, chooses the goal's options and buys.
    Returns the actions taken; the env is left in its final state.
    """
    assert env.goal is not None
    target = env.goal.asin.lower()
    taken: list[str] = []

    def act(a: str) -> None:
        taken.append(a)
        env.step(a)

    product = env.world.products[env.world.by_asin[env.goal.asin]]
    act(f"search[{product.title.lower()}]")
    while not env.done and target not in env.clickables():
        if "next >" not in env.clickables():
            return taken
        act("click[next >]")
    if env.done:
        return taken
    act(f"click[{target}]")
    for value in env.goal.options.values():
        if not env.done:
            act(f"click[{value.lower()}]")
    if not env.done:
        act("click[buy now]")
    return taken


def webshop_anchor(observation: str, task: str) -> str:
    """The reference's formatted observation (also its grouping key): the strings after the
    goal text, each quoted, joined by " [SEP] "; the raw text when the goal is absent."""
    parts = observation.split(SEP)
    try:
        at = parts.index(task)
    except ValueError:
        return observation
    return SEP.join(f"'{p}'" for p in parts[at + 1 :])


def webshop_task(first_observation: str) -> str:
    """The goal text of the search page ("WebShop [SEP] Instruction: [SEP] {goal} [SEP] ...")."""
    parts = first_observation.split(SEP)
    if len(parts) < 3 or parts[1] != "Instruction:":
        raise ValueError(
            f"first_observation is not a WebShop search page: {first_observation[:80]!r}"
        )
    return parts[2]
