"""BatchedEnv(backend="ray"): env workers as Ray actors give what worker processes give, and
recover the same way from an exception, a killed actor and a hung actor."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

from agentenvs.batched import BatchedEnv
from tests.agentenvs.test_batched import ToyEnv

pytest.importorskip("ray", reason="needs Ray (the [ray] extra)")


def _play(env: BatchedEnv, rounds: list[tuple[list[int], int, list[list[str]]]]) -> list:
    """Everything the batch returns over resets and steps, for comparing two backends."""
    seen = []
    for tasks, group_n, steps in rounds:
        seen.append(env.reset(tasks, group_n))
        for actions in steps:
            obs, r, d, infos = env.step(actions)
            seen.append((obs, r.tolist(), d.tolist(), infos))
    return seen


def test_ray_actors_give_what_worker_processes_give(ray_cluster):
    rounds = [
        ([4, 9, 2], 2, [["inc", "win", "inc", "raise", "inc", "inc"], ["inc"] * 6, ["win"] * 6]),
        ([7, 1, 5], 2, [["win", "inc", "inc", "inc", "inc", "inc"]]),
    ]
    with BatchedEnv(ToyEnv, 6, num_workers=2) as env:
        want = _play(env, rounds)
    with BatchedEnv(ToyEnv, 6, num_workers=2, backend="ray") as env:
        assert env.num_workers == 2 and len(set(env.worker_pids())) == 2
        # one actor per node: the cluster's 2 nodes (SPREAD)
        assert set(env.worker_nodes()) == {n.node_id for n in ray_cluster.list_all_nodes()}
        got = _play(env, rounds)
    assert repr(got) == repr(want)  # same slots, order, rewards, crash reports


def test_webshop_on_ray_equals_processes(ray_cluster):
    pytest.importorskip("bm25s", reason="WebShop search needs bm25s (extra [webshop])")
    from agentenvs.factories import webshop_factory

    factory = webshop_factory(n_products=200, n_goals=40, seed=3)
    rounds = [([3, 17], 2, [["search[tea]"] * 4, ["click[back to search]"] * 4])]
    with BatchedEnv(factory, 4, num_workers=2) as env:
        want = _play(env, rounds)
    with BatchedEnv(factory, 4, num_workers=2, backend="ray") as env:
        got = _play(env, rounds)
    assert repr(got) == repr(want)


def test_a_killed_actor_is_restarted_and_one_that_exits_or_raises_is_handled_likewise(ray_cluster):
    """One batch (its 2 actors started once: each start costs seconds) for both cases."""
    with BatchedEnv(ToyEnv, 4, num_workers=2, backend="ray") as env:
        assert not env.supports_snapshot  # ToyEnv has no snapshot, on Ray as in processes
        env.reset([0, 1], group_n=2)
        os.kill(env.worker_pids()[0], signal.SIGKILL)  # actor 0 hosts slots 0 and 1
        obs, _r, d, infos = env.step(["inc"] * 4)
        assert [i["crashed"] for i in infos] == [True, True, False, False] and d[:2].all()
        assert "worker 0 died or timed out during step" in infos[0]["error"]
        assert obs[2:] == ["task 1 t 1"] * 2 and env.restarts == 1
        # the new actor's environments are fresh: the next reset plays every slot again
        obs, _ = env.reset([5, 6], group_n=2)
        assert obs == ["start 5", "start 5", "start 6", "start 6"] and not env.done.any()
        _, r, _, _ = env.step(["win"] * 4)
        assert np.all(r == 10.0)
        # an actor that exits, and a slot that raises, are handled as with worker processes
        env.reset([0, 1], group_n=2)
        _, _, d, infos = env.step(["inc", "inc", "die", "raise"])
        assert [i["crashed"] for i in infos] == [False, False, True, True] and d[2:].all()
        assert env.restarts == 2  # "raise" is a slot crash inside a live actor, not a restart


def test_a_hung_actor_times_out_and_is_replaced(ray_cluster):
    with BatchedEnv(ToyEnv, 2, num_workers=2, timeout_s=1.0, backend="ray") as env:
        env.reset([0], group_n=2)
        old = env.worker_pids()[0]
        _, _, _, infos = env.step(["hang", "inc"])
        assert infos[0]["crashed"] and not infos[1]["crashed"]
        assert env.worker_pids()[0] != old and env.restarts == 1
        assert env.reset([3], group_n=2)[0] == ["start 3"] * 2


def test_snapshots_travel_between_actors(ray_cluster):
    """A snapshot taken in actor 0 restores into a slot of actor 1 (on the other node) and
    replays the continuation, as with worker processes (tests/agentenvs/test_snapshot.py)."""
    pytest.importorskip("bm25s", reason="WebShop search needs bm25s (extra [webshop])")
    from agentenvs.factories import webshop_factory
    from agentenvs.toytext import parse_toy_spec, toy_factory
    from tests.agentenvs.test_snapshot import _batched_branch_replays

    toy = toy_factory(parse_toy_spec("toy:keydoor:size=4,horizon=30,slip=0"), "train", seed=0)
    _batched_branch_replays(toy, [0, 1], seed=1, b=3, backend="ray")
    shop = webshop_factory(n_products=200, n_goals=40, n_eval=10, seed=3)
    _batched_branch_replays(shop, [3], seed=4, b=2, backend="ray")


def test_missing_ray_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "agentenvs.ray_backend", raising=False)
    with pytest.raises(ValueError, match=r"backend='ray'.*pip install -e \"\.\[ray\]\""):
        BatchedEnv(ToyEnv, 2, backend="ray")
    with pytest.raises(ValueError, match=r"^backend: must be one of .*, got 'threads'$"):
        BatchedEnv(ToyEnv, 2, backend="threads")
