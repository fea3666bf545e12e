"""Snapshot and restore of the agent environments (branching rollouts, docs/branching.md).

For each environment: play a random episode, snapshot at step b, go on; restore the snapshot
into another instance (and, through BatchedEnv, into another slot of another worker), replay
the same remaining actions: observations, rewards, dones and infos must equal the original
continuation step by step.
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentenvs.batched import BatchedEnv, Snapshot, env_supports_snapshot, require_snapshot
from agentenvs.toytext import ToyTextEnv, parse_toy_spec, toy_factory
from hgpo.options import OptionError
from tests.agentenvs.test_batched import ToyEnv

ALFWORLD_GAMES = Path(__file__).parent / "data" / "alfworld_games"

Step = tuple[str, float, bool, dict[str, Any]]


def webshop_query(action: str, info: dict[str, Any]) -> str:
    """WebShop lists ``search[<your query>]``: search the goal's first words instead."""
    if action == "search[<your query>]":
        return f"search[{' '.join(info['task'].split()[2:5])}]"
    return action


def random_episode(env: Any, task: int, seed: int, max_len: int = 60) -> list[str]:
    """Actions of one episode of uniformly drawn admissible actions (plus, now and then, one
    no admissible list offers), played on ``env`` from ``reset(task)``."""
    rng = random.Random(seed)
    _, info = env.reset(task)
    actions: list[str] = []
    for _ in range(max_len):
        a = "jump over the moon" if rng.random() < 0.1 else rng.choice(info["admissible_actions"])
        a = webshop_query(a, info)
        actions.append(a)
        _, _, done, info = env.step(a)
        if done:
            break
    return actions


def continuation(env: Any, actions: list[str]) -> list[Step]:
    return [env.step(a) for a in actions]


def check_branch_replays(
    make: Any, task: int, seed: int, b: int, actions: list[str] | None = None
) -> None:
    """Snapshot after b steps of a random episode (or of ``actions``); a fresh env restored
    from it (through a pickle, as between processes) replays the rest exactly."""
    env = make()
    actions = actions or random_episode(env, task, seed)
    b = min(b, len(actions) - 1)
    env.reset(task)
    at_b = env.reset(task) if b == 0 else None
    for a in actions[:b]:
        obs, _, _, info = env.step(a)
        at_b = (obs, info)
    snap = pickle.loads(pickle.dumps(env.snapshot()))
    want = continuation(env, actions[b:])
    other = make()
    other.reset(task if task == 0 else 0)  # in the middle of some other episode
    other.step(actions[0])
    assert other.restore(snap) == at_b
    assert continuation(other, actions[b:]) == want
    # the same snapshot restores twice, and into the env it was taken from
    assert env.restore(snap) == at_b
    assert continuation(env, actions[b:]) == want


# -- toy text ----------------------------------------------------------------------------------
NO_SLIP = [
    "toy:keydoor:size=4,horizon=20,slip=0",
    "toy:tmaze:length=3,slip=0",
    "toy:household:n_rooms=2,receptacles_per_room=3,n_tasks=4,slip=0",
    "toy:shop:n_items=4,n_tasks=4",
    "toy:random:n_states=12,slip=0",
]


@pytest.mark.parametrize("spec", NO_SLIP)
def test_toy_branch_replays_the_continuation(spec):
    sp = parse_toy_spec(spec)
    for seed, b in ((0, 0), (1, 3), (2, 7)):
        check_branch_replays(lambda: ToyTextEnv(sp, "train", seed=5), 0, seed, b)


def test_toy_branch_with_slip_draws_its_own_future():
    """With slip the restored slot draws from its own next stream: restoring one snapshot
    many times gives next states distributed as the env's next_prob, and the branches do not
    replay the parent's draws."""
    sp = parse_toy_spec("toy:random:n_states=12,slip=0.5")
    parent = ToyTextEnv(sp, "train", seed=0)
    parent.reset(0)
    snap = parent.snapshot()
    s0 = snap.state
    a = next(i for i in range(parent.env.n_actions) if parent.env.next_prob[s0, i, 1] > 0.1)
    action = parent.env.action_names[a]
    parent_path = [parent.step(action)[3]["hidden_state"] for _ in range(4)]

    branch = ToyTextEnv(sp, "train", seed=0)  # same seed and slot as the parent
    n, firsts, same_path = 600, [], 0
    for _ in range(n):
        branch.restore(snap)
        path = [branch.step(action)[3]["hidden_state"] for _ in range(4)]
        firsts.append(path[0])
        same_path += path == parent_path
    probs = parent.env.next_prob[s0, a]
    for b, p in enumerate(probs):
        if p > 0:
            s2 = parent.env.next_state[s0, a, b]
            got = np.mean(np.array(firsts) == s2)
            want = probs[parent.env.next_state[s0, a] == s2].sum()
            assert abs(got - want) < 4 * np.sqrt(want * (1 - want) / n) + 1e-9, (s2, got, want)
    # a copied random stream would replay the parent's path every time
    assert same_path < n / 2


def test_toy_restore_refuses_another_env():
    a = ToyTextEnv(parse_toy_spec("toy:tmaze:length=3"), "train")
    b = ToyTextEnv(parse_toy_spec("toy:tmaze:length=2"), "train")
    a.reset(0)
    with pytest.raises(ValueError, match="snapshot of ToySpec"):
        b.restore(a.snapshot())
    with pytest.raises(TypeError, match="expected a ToySnapshot"):
        b.restore({"state": 1})


# -- WebShop ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shop_world():
    pytest.importorskip("bm25s", reason="WebShop search needs bm25s (extra [webshop])")
    from agentenvs.webshop.env import make_world

    return make_world(seed=0, n_products=300, n_goals=40, n_eval=10)


def test_webshop_branch_replays_the_continuation(shop_world):
    from agentenvs.webshop.env import WebShopEnv

    def make() -> WebShopEnv:
        return WebShopEnv(shop_world, max_steps=15)

    for task, seed, b in ((0, 0, 0), (3, 1, 2), (5, 2, 4), (7, 3, 9)):
        check_branch_replays(make, task, seed, b)


def test_webshop_branch_from_a_chosen_option_buys_the_same(shop_world):
    """The expert's route, snapshot on the item page after choosing options: the restored
    session buys with the same options and the same score."""
    from agentenvs.webshop.env import WebShopEnv, expert_actions

    env = WebShopEnv(shop_world, max_steps=15)
    for task in range(6):
        env.reset(task)
        route = expert_actions(env)
        assert route[-1] == "click[buy now]" and env.score == 1.0
        check_branch_replays(lambda: WebShopEnv(shop_world, max_steps=15), task, 0,
                             len(route) - 1, actions=route)  # fmt: skip
    snap = env.snapshot()
    assert snap.page == "done" and len(pickle.dumps(snap)) < 2000


def test_webshop_restore_refuses_another_world(shop_world):
    from agentenvs.webshop.env import WebShopEnv, make_world

    env = WebShopEnv(shop_world)
    env.reset(2)
    other = WebShopEnv(make_world(seed=1, n_products=300, n_goals=40, n_eval=10))
    with pytest.raises(ValueError, match="is not this env's goal of that number"):
        other.restore(env.snapshot())


# -- ALFWorld ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alfworld_files() -> list[str]:
    pytest.importorskip("alfworld", reason="ALFWorld needs the alfworld package (extra [alfworld])")
    pytest.importorskip("textworld", reason="ALFWorld needs textworld (installed with alfworld)")
    from agentenvs.alfworld.env import find_games

    return find_games(ALFWORLD_GAMES / "train")


def test_alfworld_branch_replays_the_continuation(alfworld_files):
    """Random admissible commands (and invalid ones) on four games; the restoring env is in
    the middle of another game, so the restore loads the snapshot's game first."""
    from agentenvs.alfworld.env import AlfWorldEnv

    for task, seed, b in ((1, 0, 0), (2, 1, 5), (5, 2, 20), (3, 3, 12)):
        check_branch_replays(lambda: AlfWorldEnv(alfworld_files), task, seed, b)


def test_alfworld_branch_from_the_expert_route_wins(alfworld_files):
    """Snapshot half-way along the expert's winning plan: the restored env wins at the same
    step, with the same observations."""
    from agentenvs.alfworld.env import AlfWorldEnv, run_expert

    env = AlfWorldEnv(alfworld_files)
    for task in (0, 3):
        won, plan = run_expert(env, task)
        assert won
        check_branch_replays(lambda: AlfWorldEnv(alfworld_files), task, 0, len(plan) // 2,
                             actions=plan)  # fmt: skip
    # into an env that never played: the restore loads the game
    env.reset(3)
    for cmd in plan[:3]:
        env.step(cmd)
    fresh, at = AlfWorldEnv(alfworld_files), env.snapshot()
    assert fresh.restore(at) == env.restore(at)
    assert [fresh.step(c) for c in plan[3:]] == [env.step(c) for c in plan[3:]]


def _pddl_state(env: Any) -> Any:
    return env._env.unwrapped._pddl_state


def test_alfworld_library_state_is_followed_and_restored_exactly(alfworld_files):
    """The snapshot follows fast-downward's state in Python (effects with conditions: the
    floor lamp's toggle in game 0); it must equal the state read from C after every step,
    and a restored library must be in the same C state as the original at every later step
    (derived variables included)."""
    from agentenvs.alfworld import engine
    from agentenvs.alfworld.env import AlfWorldEnv, run_expert

    env, other = AlfWorldEnv(alfworld_files), AlfWorldEnv(alfworld_files)
    for task in (0, 3):
        won, plan = run_expert(env, task)
        assert won and any(c.startswith("use ") for c in plan) == (task == 0)
        env.reset(task)
        layout = engine._sas_layout(_pddl_state(env).sas)
        assert layout.effects is not None and layout.derived  # the fast path, with axioms
        for i, a in enumerate(plan):
            if i == len(plan) // 2:
                other.reset((task + 1) % len(alfworld_files))
                other.restore(env.snapshot())
            _, _, done, _ = env.step(a)
            st = _pddl_state(env)
            c_state = st.read_sas_values()
            assert [x for v, x in enumerate(c_state) if v not in layout.derived] == [
                x for v, x in enumerate(st._values) if v not in layout.derived
            ], (task, i)
            if i >= len(plan) // 2:
                other.step(a)
                assert _pddl_state(other).read_sas_values() == c_state, (task, i)
        assert done


def test_alfworld_snapshot_restores_in_a_process_with_another_hash_seed(alfworld_files, tmp_path):
    """Python's str hashes differ between processes (a Ray actor, a spawned worker), and
    textworld's Propositions keep theirs: the snapshot must carry plain values."""
    import json
    import os
    import subprocess
    import sys

    from agentenvs.alfworld.env import AlfWorldEnv

    env = AlfWorldEnv(alfworld_files)
    actions = random_episode(env, 2, seed=7)
    env.reset(2)
    for a in actions[:6]:
        env.step(a)
    (tmp_path / "snap.pkl").write_bytes(pickle.dumps(env.snapshot()))
    (tmp_path / "commands.json").write_text(json.dumps(actions[6:]))
    want = [list(env.restore(env.snapshot()))] + [list(env.step(a)) for a in actions[6:]]
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    root = Path(__file__).parent.parent.parent
    out = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "_restore_elsewhere.py"),
         str(tmp_path / "snap.pkl"), str(tmp_path / "commands.json"), *alfworld_files],
        capture_output=True, text=True, check=True, cwd=root,
        env=dict(os.environ, PYTHONHASHSEED=seed,
                 PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )  # fmt: skip
    assert json.loads(out.stdout) == json.loads(json.dumps(want))


def test_alfworld_restore_refuses_another_game(alfworld_files):
    from agentenvs.alfworld.env import AlfWorldEnv

    env = AlfWorldEnv(alfworld_files)
    env.reset(1)
    snap = env.snapshot()
    other = AlfWorldEnv(alfworld_files[1:] + alfworld_files[:1])  # game 1 is another file
    with pytest.raises(ValueError, match="is not this env's game of that number"):
        other.restore(snap)
    other.reset(1)  # another game than the snapshot's: the engine refuses it too
    with pytest.raises(ValueError, match="another game than the one loaded"):
        other._env.unwrapped.restore(snap.engine)


# -- BatchedEnv --------------------------------------------------------------------------------
def _batched_branch_replays(factory: Any, tasks: list[int], seed: int, b: int, **kw: Any) -> None:
    """4 slots, 2 workers: slot 0 (worker 0) plays a random episode, snapshot at step b
    (from step(..., snapshot=True) and from snapshot()); restored into slot 3 (worker 1) and
    slot 1, which were playing other actions, they replay slot 0's continuation exactly."""
    with BatchedEnv(factory, 4, num_workers=2, **kw) as env:
        obs, infos = env.reset(tasks, group_n=4 // len(tasks))
        rng, others = random.Random(seed), random.Random(seed + 1000)

        def play(a: str) -> list[str]:
            acts = [a] + [others.choice(i["admissible_actions"] or ["none"]) for i in infos[1:]]
            return acts

        actions, snap_b, at_b = [], None, (obs[0], infos[0])
        for _ in range(b):
            a = webshop_query(rng.choice(infos[0]["admissible_actions"]), infos[0])
            actions.append(a)
            obs, _, done, infos, snaps = env.step(play(a), snapshot=True)
            assert not done[0], "the episode ended before the branch point"
            snap_b, at_b = snaps[0], (obs[0], infos[0])
        (direct,) = env.snapshot([0])
        if snap_b is None:
            snap_b = direct
        assert isinstance(direct, Snapshot) and direct.task == tasks[0]
        want = []
        for _ in range(6):
            a = webshop_query(rng.choice(infos[0]["admissible_actions"]), infos[0])
            actions.append(a)
            obs, r, done, infos = env.step(play(a))
            want.append((obs[0], r[0], done[0], infos[0]))
            if done[0]:
                break
        got_obs, got_infos = env.restore([(3, snap_b), (1, direct)])
        assert env.tasks[3] == tasks[0] and not env.done[[1, 3]].any()
        assert got_obs == [at_b[0]] * 2 and got_infos == [at_b[1]] * 2
        for i, a in enumerate(actions[b:]):
            obs, r, done, infos = env.step([a] * 4)
            for s in (1, 3):
                assert (obs[s], r[s], done[s], infos[s]) == want[i], (s, i)


def test_batched_toy_restores_across_workers():
    factory = toy_factory(parse_toy_spec("toy:keydoor:size=4,horizon=30,slip=0"), "train", seed=0)
    _batched_branch_replays(factory, [0], seed=1, b=3)
    _batched_branch_replays(factory, [0, 1], seed=2, b=0)  # a snapshot of the start
    # into another BatchedEnv that was never reset
    with BatchedEnv(factory, 2, num_workers=2) as a, BatchedEnv(factory, 2, num_workers=2) as b:
        _, infos = a.reset([0], 2)
        acts = infos[0]["admissible_actions"]
        a.step([acts[0]] * 2)
        (snap,) = a.snapshot([0])
        b.restore([(1, snap)])
        assert b.tasks == [-1, 0] and list(b.done) == [True, False]
        want, got = a.step([acts[1]] * 2), b.step(["unused", acts[1]])
        assert (got[0][1], got[1][1], got[3][1]) == (want[0][0], want[1][0], want[3][0])


def test_batched_park_holds_a_slot_until_restored():
    factory = toy_factory(parse_toy_spec("toy:keydoor:size=4,horizon=30,slip=0"), "train", seed=0)
    with BatchedEnv(factory, 2, num_workers=2) as env:
        obs0, infos = env.reset([0], 2)
        acts = infos[0]["admissible_actions"]
        (snap,) = env.snapshot([0])
        env.park([1])
        obs, r, done, _ = env.step([acts[0]] * 2)
        # the parked slot is not stepped: done, reward 0, its last observation kept
        assert list(done) == [False, True] and r[1] == 0.0 and obs[1] == obs0[1]
        with pytest.raises(ValueError, match=r"BatchedEnv\.park: slots must lie in 0\.\.1"):
            env.park([2])
        env.restore([(1, snap)])  # live again, from slot 0's start
        assert list(env.done) == [False, False]


def test_batched_webshop_restores_across_workers(shop_world):
    from agentenvs.factories import webshop_factory

    factory = webshop_factory(n_products=300, n_goals=40, n_eval=10, seed=0)
    _batched_branch_replays(factory, [3], seed=4, b=2)


def test_batched_alfworld_restores_across_workers(alfworld_files):
    from agentenvs.factories import alfworld_factory

    _batched_branch_replays(alfworld_factory(alfworld_files[:2]), [0, 1], seed=5, b=4)


def test_batched_snapshot_support_and_named_error():
    factory = toy_factory(parse_toy_spec("toy:tmaze:length=2"))
    with BatchedEnv(factory, 2, num_workers=2) as env:
        assert env.supports_snapshot
        require_snapshot("toy:tmaze:length=2", env)
    assert not env_supports_snapshot(ToyEnv())
    with BatchedEnv(ToyEnv, 2, num_workers=2) as env:
        assert not env.supports_snapshot
        with pytest.raises(
            OptionError, match=r"^--env: must be an environment with snapshot support, got 'toy'$"
        ):
            require_snapshot("toy", env)
        env.reset([0], 2)
        with pytest.raises(ValueError, match="no snapshot support"):
            env.snapshot([0])
        with pytest.raises(ValueError, match="no snapshot support"):
            env.step(["inc", "inc"], snapshot=True)


class CountingEnv(ToyEnv):
    """ToyEnv with snapshots of its step count; restoring "die" kills the worker."""

    supports_snapshot = True

    def snapshot(self):
        return (self.task, self.t)

    def restore(self, snap):
        if snap == "die":
            os._exit(3)
        self.task, self.t = snap
        return f"task {self.task} t {self.t}", {"admissible_actions": ["inc"]}


def test_a_worker_dying_during_restore_crashes_its_slots_only():
    with BatchedEnv(CountingEnv, 4, num_workers=2) as env:
        env.reset([0, 1], 2)
        env.step(["inc"] * 4)
        snaps = env.snapshot([2, 3])
        obs, infos = env.restore([(0, Snapshot(0, "die")), (3, snaps[0])])
        assert infos[0]["crashed"] and not infos[1]["crashed"] and obs[1] == "task 1 t 1"
        assert env.restarts == 1 and list(env.done) == [True, True, False, False]
        assert env.last_info[1]["crashed"]  # slot 1 lived in the restarted worker too
        obs, _, _, infos = env.step(["inc"] * 4)
        assert [i["crashed"] for i in infos] == [True, True, False, False]
        assert obs[2:] == ["task 1 t 2"] * 2


def test_batched_snapshot_bad_input_and_crashes():
    factory = toy_factory(parse_toy_spec("toy:tmaze:length=1,slip=0"))
    with BatchedEnv(factory, 4, num_workers=2) as env:
        env.reset([0], 4)
        with pytest.raises(ValueError, match=r"slots must lie in 0..3, got \[4\]"):
            env.snapshot([4])
        with pytest.raises(ValueError, match="a slot may appear once"):
            env.snapshot([1, 1])
        with pytest.raises(ValueError, match="must be a Snapshot"):
            env.restore([(0, "state")])
        # slot 0 wins (forward, forward, up), slots 1-3 walk into a wall
        for a in ("forward", "forward"):
            env.step([a] * 4)
        _, _, done, _, snaps = env.step(["up", "down", "dance", "dance"], snapshot=True)
        assert done[0] and snaps[0] is None and all(isinstance(s, Snapshot) for s in snaps[2:])
        with pytest.raises(ValueError, match=r"slots \[0\] are done"):
            env.snapshot([0, 2])
        # a snapshot the env cannot restore is that slot's crash; other slots go on
        bad = Snapshot(0, "not a ToySnapshot")
        _, infos = env.restore([(0, snaps[2]), (2, bad)])
        assert not infos[0]["crashed"] and infos[1]["crashed"]
        assert "expected a ToySnapshot" in infos[1]["error"]
        assert not env.done[0] and env.done[2] and not env.done[3]
        *_, infos = env.step(["forward"] * 4)
        assert infos[2]["crashed"] and not infos[0]["crashed"] and not infos[3]["crashed"]
