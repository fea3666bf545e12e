"""The families: registry, validation, aliasing, and each docstring's stated optimum."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from conftest import SMALL, make_small

import toyenvs

G = 0.95


def test_registry_lists_every_family() -> None:
    assert set(toyenvs.FAMILIES) == {"keydoor", "tmaze", "household", "shop", "random"}
    for name in toyenvs.FAMILIES:
        env = toyenvs.make(name)
        assert env.name == name
        assert env.tasks.size >= 1
        assert np.intersect1d(env.train_tasks, env.heldout_tasks).size == 0
        assert set(env.train_tasks) | set(env.heldout_tasks) == set(env.tasks)
        assert not env.terminal[env.tasks].any()


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("nope", {}, "unknown family 'nope'"),
        ("keydoor", {"sise": 6}, "no parameter 'sise'"),
        ("keydoor", {"size": 2}, r"^size: must be an integer in 4\.\.64, got 2$"),
        ("keydoor", {"slip": 1.5}, r"^slip: must be a finite number in \[0\.0, 1\.0\], got 1\.5$"),
        ("keydoor", {"slip": float("nan")}, r"^slip: must be a finite number in .*, got nan$"),
        ("keydoor", {"size": 5.0}, r"^size: must be an integer in 4\.\.64, got 5\.0$"),
        ("keydoor", {"size": True}, r"^size: must be an integer in 4\.\.64, got True$"),
        ("keydoor", {"seed": -1}, r"^seed: must be an integer >= 0, got -1$"),
        ("tmaze", {"length": -1}, r"^length: must be an integer in 0\.\.1000, got -1$"),
        (
            "household",
            {"n_rooms": 1, "receptacles_per_room": 2},
            r"^n_rooms \* receptacles_per_room: must be >= 5 .*, got '1 \* 2'$",
        ),
        (
            "household",
            {"n_tasks": 10**6},
            r"^n_tasks: must be an integer in 1\.\.\d+ for this layout",
        ),
        ("shop", {"items_per_page": 0}, r"^items_per_page: must be an integer in 1\.\.6, got 0$"),
        ("random", {"aliasing": -0.1}, r"^aliasing: must be a finite number in \[0\.0, 1\.0\]"),
        ("random", {"invalid_frac": float("inf")}, r"^invalid_frac: must be a finite number"),
        ("keydoor", {"horizon": 0}, r"^horizon: must be an integer >= 1, got 0$"),
        (
            "keydoor",
            {"heldout_frac": 1.0},
            r"^heldout_frac: must be a finite number in \[0\.0, 0\.99\]",
        ),
    ],
)
def test_bad_parameters_name_field_and_value(name: str, params: dict, match: str) -> None:
    """hgpo.options' one error shape: ``<field>: must be <what>, got <value>``; floats, bools and
    NaN are refused where an integer or a finite number is asked for."""
    with pytest.raises(ValueError, match=match):
        toyenvs.make(name, **params)


@pytest.mark.parametrize("size", [4, 5, 6, 8])
def test_keydoor_optimum(size: int) -> None:
    env = toyenvs.make("keydoor", size=size, horizon=6 * size)
    w = size // 2
    starts = [(r, c) for r in range(size) for c in range(w) if (r, c) != (size - 1, 0)]
    L = np.array([(size - 1 - r) + c + 1 + 2 * (size - 1) for r, c in starts])
    np.testing.assert_allclose(env.optimal_values(G), 10 * G ** (L - 1))


def test_keydoor_aliases_key_status() -> None:
    env = toyenvs.make("keydoor", size=6)
    # states 2i and 2i+1 are the same cell without / with the key
    np.testing.assert_array_equal(env.obs_of_state[0::2], env.obs_of_state[1::2])
    assert env.aliasing() == 1.0


@pytest.mark.parametrize("length", [0, 2, 5])
def test_tmaze_optimum(length: int) -> None:
    env = toyenvs.make("tmaze", length=length)
    np.testing.assert_allclose(env.optimal_values(G), 10 * G ** (length + 1))
    corridor = env.obs_of_state[2 : 2 * (length + 1)]
    assert (corridor == 2).all()


def test_shop_optimum() -> None:
    env = toyenvs.make("shop", n_items=7, items_per_page=2, n_tasks=5, seed=3)
    # Recover the page of each task's target from the results pages' click actions.
    per_task = int(env.tasks[1] - env.tasks[0])
    n_pages = 4
    for k, (target, _) in enumerate(env.params["targets"]):
        base = k * per_task
        page = next(
            p for p in range(n_pages) for j in range(2)
            if not env.invalid[base + 1 + p, 4 + j]
            and env.state_names[env.next_state[base + 1 + p, 4 + j, 0]].startswith(
                f"task{k} item{target} ")
        )  # fmt: skip
        assert env.optimal_values(G)[k] == pytest.approx(10 * G ** (page + 3))


def test_household_optimum_from_graph_distances() -> None:
    env = toyenvs.make("household", n_rooms=3, receptacles_per_room=3, n_tasks=10, horizon=40)
    graph = env.params["graph"]
    dist = dict(nx.all_pairs_shortest_path_length(graph))
    proc = {"heat": "microwave1", "cool": "fridge1", "clean": "sinkbasin1"}
    for k, (ty, obj, target) in enumerate(env.params["task_list"]):
        if ty == "pick":
            L = dist["room0"][obj] + 1 + dist[obj][target] + 1
        else:
            p = proc[ty]
            L = dist["room0"][obj] + 1 + dist[obj][p] + 1 + dist[p][target] + 1
        assert env.optimal_values(G)[k] == pytest.approx(10 * G ** (L - 1)), (ty, obj, target)


def test_household_fridge_reads_the_same_whether_cooled() -> None:
    env = toyenvs.make("household")
    names = env.state_names
    cold = [s for s, n in enumerate(names) if " at fridge1 obj=hand processed=1" in n]
    assert cold
    for s in cold:
        raw = names.index(names[s].replace("processed=1", "processed=0"))
        assert env.obs_of_state[s] == env.obs_of_state[raw]


@pytest.mark.parametrize("aliasing", [0.0, 0.3, 0.6, 1.0])
def test_random_aliasing_dial(aliasing: float) -> None:
    env = toyenvs.make("random", n_states=41, aliasing=aliasing, seed=2)
    assert env.aliasing() == pytest.approx(aliasing, abs=1 / 40)
    assert (env.optimal_values(G) > 0).all()  # the goal is reachable from every task


def test_same_seed_same_instance_and_slip_rows_sum_to_one() -> None:
    for key in SMALL:
        a, b = make_small(key), make_small(key)
        np.testing.assert_array_equal(a.next_state, b.next_state)
        np.testing.assert_array_equal(a.obs_of_state, b.obs_of_state)
        np.testing.assert_allclose(a.next_prob.sum(axis=2), 1.0)


def test_pomdp_validation() -> None:
    env = toyenvs.make("tmaze")
    nan_reward = env.reward_enter.copy()
    nan_reward[3] = np.nan
    for horizon, reward, message in (
        (0, env.reward_enter, r"^POMDP\.horizon: must be an integer >= 1, got 0$"),
        (5.0, env.reward_enter, r"^POMDP\.horizon: must be an integer >= 1, got 5\.0$"),
        (5, nan_reward, r"^POMDP\.reward_enter\[3\] is nan; rewards must be finite$"),
    ):
        with pytest.raises(ValueError, match=message):
            toyenvs.POMDP(
                name="x", obs_of_state=env.obs_of_state, next_state=env.next_state,
                next_prob=env.next_prob, invalid=env.invalid, reward_enter=reward,
                terminal=env.terminal, horizon=horizon, tasks=env.tasks, train_tasks=env.tasks,
                heldout_tasks=np.zeros(0, np.int64), action_names=env.action_names,
            )  # fmt: skip
    with pytest.raises(ValueError, match="terminal"):
        toyenvs.POMDP(
            name="x", obs_of_state=env.obs_of_state, next_state=env.next_state,
            next_prob=env.next_prob, invalid=env.invalid, reward_enter=env.reward_enter,
            terminal=env.terminal, horizon=5, tasks=np.array([env.n_states - 1]),
            train_tasks=env.tasks, heldout_tasks=np.zeros(0, np.int64),
            action_names=env.action_names,
        )  # fmt: skip
    assert env.obs_of_state.flags.writeable is False
