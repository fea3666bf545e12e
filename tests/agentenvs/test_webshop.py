"""WebShop simulator: reward test vectors, page strings, search/click semantics, goals."""

import re

import pytest

pytest.importorskip("bm25s", reason="WebShop search needs bm25s (extra [webshop])")

from agentenvs.webshop.catalog import Goal, Product, generate_catalog, generate_goals
from agentenvs.webshop.env import (
    RESULTS_PER_PAGE,
    SEP,
    WebShopEnv,
    expert_actions,
    make_world,
    webshop_anchor,
    webshop_task,
)
from agentenvs.webshop.reward import normalize_color, type_reward, webshop_reward

PRODUCT = Product(
    asin="B0TEST0001",
    title="Acme Deluxe Travel Mug",
    description="A mug for coffee.",
    bullet_points=("Keeps drinks warm",),
    category="Home & Kitchen › Kitchen › Mug",
    query="travel mug",
    name="travel mug",
    title_nouns=("mug",),
    attributes=("dishwasher safe",),
    options={"color": ("navy blue", "red"), "size": ("12 oz", "16 oz"), "style": ("lid",)},
    price=15.0,
)


def goal(attrs, opts, price=20.0, **kw):
    base = dict(
        asin="B0TEST0001",
        instruction="i need a mug",
        attributes=tuple(attrs),
        options=dict(opts),
        price_upper=price,
        query="travel mug",
        category=PRODUCT.category,
        name="travel mug",
        title_nouns=("mug",),
    )
    base.update(kw)
    return Goal(**base)


# Test vectors of agentenvs-spec.md
def test_exact_match_is_one():
    g = goal(["dishwasher safe"], {"color": "navy blue", "size": "16 oz"})
    assert webshop_reward(PRODUCT, g, {"color": "navy blue", "size": "16 oz"}) == 1.0
    # colour words are normalised: a goal "blue" is met by the option "navy blue"
    g = goal(["dishwasher safe"], {"color": "blue", "size": "16 oz"})
    assert webshop_reward(PRODUCT, g, {"color": "navy blue", "size": "16 oz"}) == 1.0


def test_one_of_three_attributes_two_options_price_is_four_sixths():
    g = goal(["dishwasher safe", "bpa free", "leak proof"], {"color": "red", "size": "12 oz"})
    assert webshop_reward(PRODUCT, g, {"color": "red", "size": "12 oz"}) == pytest.approx(4 / 6)


def test_three_options_two_matched_is_four_sevenths():
    g = goal(
        ["dishwasher safe", "bpa free", "leak proof"],
        {"color": "red", "size": "12 oz", "style": "straw"},
    )
    chosen = {"color": "red", "size": "12 oz", "style": "lid"}
    assert webshop_reward(PRODUCT, g, chosen) == pytest.approx(4 / 7)


def test_same_with_type_half_is_two_sevenths():
    g = goal(
        ["dishwasher safe", "bpa free", "leak proof"],
        {"color": "red", "size": "12 oz", "style": "straw"},
        query="other",
        category="A › B › C",
        title_nouns=("mug", "lid", "cup", "straw", "handle"),
    )
    # title-noun overlap 1/5 = 0.2 is not > 0.2, query and category differ: r_type 0.5
    assert type_reward(PRODUCT, g) == 0.5
    chosen = {"color": "red", "size": "12 oz", "style": "lid"}
    assert webshop_reward(PRODUCT, g, chosen) == pytest.approx(2 / 7)


def test_type_reward_levels_and_price():
    assert type_reward(PRODUCT, goal([], {}, title_nouns=("bottle",))) == 0.0
    many = (*tuple(f"n{i}" for i in range(11)), "mug")
    assert type_reward(PRODUCT, goal([], {}, query="x", category="X › Y", title_nouns=many)) == 0.1
    assert webshop_reward(PRODUCT, goal([], {}, price=10.0), {}) == 0.0
    assert normalize_color("navy blue") == "blue"


def test_attribute_matched_by_substring_of_texts():
    assert webshop_reward(PRODUCT, goal(["keeps drinks warm"], {}), {}) == 1.0


@pytest.fixture(scope="module")
def world():
    return make_world(seed=3, n_products=1500, n_goals=400, n_eval=100)


def test_catalog_and_goals(world):
    prods = generate_catalog(0, 3000)
    assert len({p.asin for p in prods}) == 3000
    assert len({p.category.split(" › ")[1] for p in prods}) == 5
    assert all(" › " in p.category and p.options is not None for p in prods)
    goals = generate_goals(prods, 0, 500)
    pat = re.compile(
        r"^.+( with [a-z ]+: [^,]+(, and [a-z ]+: [^,]+)*)?, and price lower than "
        r"\d+\.\d\d dollars$"
    )
    assert all(pat.match(g.instruction) for g in goals)
    assert {g.instruction for g in world.train_goals}.isdisjoint(
        {g.instruction for g in world.eval_goals}
    )
    assert generate_catalog(0, 50) == generate_catalog(0, 50)
    with pytest.raises(ValueError, match="n_products"):
        generate_catalog(0, 0)


def test_pages_and_clicks(world):
    env = WebShopEnv(world)
    obs, info = env.reset(0)
    g = env.goal.instruction
    assert obs == f"WebShop [SEP] Instruction: [SEP] {g} [SEP] Search"
    assert webshop_task(obs) == g
    assert info["admissible_actions"] == ["search[<your query>]", "click[search]"]
    # not an action, and a click on something absent: no-ops
    for a in ["jump", "click[buy now]", "search[]", "click[search]"]:
        o, r, d, i = env.step(a)
        assert (o, r, d) == (obs, 0.0, False) and not i["action_executed"]
    o, r, d, i = env.step("search[travel mug]")
    assert r == 0.0 and not d
    n = len(env.results)
    assert 0 < n <= 50
    items = env.results[:RESULTS_PER_PAGE]
    expect = ["Back to Search", f"Page 1 (Total results: {n})"]
    if n > RESULTS_PER_PAGE:
        expect.append("Next >")
    for k in items:
        p = world.products[k]
        expect += [p.asin, p.title, p.price_text]
    assert env.page_text() == SEP.join(expect)
    assert o == f"Instruction: [SEP] {g} [SEP] " + SEP.join(expect)
    assert webshop_anchor(o, g) == SEP.join(f"'{x}'" for x in expect)
    if n > RESULTS_PER_PAGE:
        env.step("click[next >]")
        assert env.page_text().startswith(
            f"Back to Search [SEP] Page 2 (Total results: {n}) [SEP] < Prev"
        )
        env.step("click[< prev]")
    asin = world.products[items[0]].asin
    o, _, _, i = env.step(f"click[{asin.lower()}]")
    p = world.products[items[0]]
    assert env.page_text().startswith("Back to Search [SEP] < Prev")
    assert env.page_text().endswith(
        f"{p.title} [SEP] Price: {p.price_text} [SEP] Rating: N.A. "
        "[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert "click[buy now]" in i["admissible_actions"]
    env.step("click[description]")
    assert env.page_text() == f"Back to Search [SEP] < Prev [SEP] {p.description}"
    env.step("click[< prev]")
    assert env.page == "item"
    o, r, d, i = env.step("click[buy now]")
    assert d and o.startswith("Thank you for shopping with us!")
    assert r == (10.0 if i["task_score"] == 1.0 else 0.0)
    assert i["won"] == (i["task_score"] == 1.0)


def test_search_runs_from_any_page(world):
    env = WebShopEnv(world)
    env.reset(1)
    env.step("search[shampoo]")
    env.step(f"click[{env.clickables()[-1]}]")
    assert env.page == "item"
    env.step("search[coffee beans]")
    assert env.page == "results" and env.result_page == 1


def test_expert_wins_and_fifteen_step_limit(world):
    env = WebShopEnv(world, split="eval")
    wins = 0
    for t in range(50):
        env.reset(t)
        expert_actions(env)
        wins += env.score == 1.0
    assert wins >= 48
    env.reset(0)
    for _k in range(15):
        _, _, d, _ = env.step("click[nothing]")
    assert d and env.steps == 15
