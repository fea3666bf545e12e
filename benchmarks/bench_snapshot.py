"""Size and cost of environment snapshots (branching rollouts), against the cost of a step.

Run: ``python -m benchmarks.bench_snapshot [--episodes 6] [--envs 16] [--workers 2]
[--games DIR]``. For the toy text env (keydoor 6x6), the WebShop simulator (5,000 products) and
ALFWorld (generated games, the real engine; default the games shipped with the tests): random
admissible actions; after every step env A is snapshotted, the snapshot is pickled and
unpickled (as between processes), and restored into env B. Prints per env the pickled size
(mean, max) and the median milliseconds of step, snapshot, pickle round trip and restore (for
ALFWorld also a restore into an env playing another game, which loads the game first). Then,
through ``BatchedEnv`` (``--envs`` slots in ``--workers`` worker processes): median ms per
call of ``step`` and ``step(snapshot=True)`` (two passes with the same actions), and of
``snapshot(all live slots)`` and ``restore(every slot from one snapshot)`` after each step of
a third pass; 4 tasks in groups of ``--envs / 4``, 8 steps, 3 rounds. Wall-clock times: on a
shared machine they vary with the load.
"""

from __future__ import annotations

import os
import pickle
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentenvs.alfworld.env import AlfWorldEnv, find_games
from agentenvs.batched import BatchedEnv
from agentenvs.factories import alfworld_factory, webshop_factory
from agentenvs.toytext import ToyTextEnv, parse_toy_spec, toy_factory
from hgpo.options import ArgumentParser

HERE = Path(__file__).parent
TEST_GAMES = HERE.parent / "tests" / "agentenvs" / "data" / "alfworld_games" / "train"


def _query(action: str, info: dict[str, Any]) -> str:
    if action == "search[<your query>]":  # WebShop: search the goal's words
        return f"search[{' '.join(info['task'].split()[2:5])}]"
    return action


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def per_env(
    name: str, make: Callable[[], Any], n_tasks: int, episodes: int, other_game: bool = False
) -> None:
    """Snapshot after every step of random episodes of env A, restore into env B (and, with
    ``other_game``, into B after it reset to another task: ALFWorld loads another game)."""
    a, b = make(), make()
    rng = random.Random(0)
    cost: dict[str, list[float]] = {k: [] for k in ("step", "snapshot", "pickle", "restore")}
    other: list[float] = []
    sizes: list[int] = []
    for ep in range(episodes):
        task = ep % n_tasks
        _, info = a.reset(task)
        b.reset(task)
        done = False
        while not done:
            act = _query(rng.choice(info["admissible_actions"]), info)
            t0 = time.perf_counter()
            _, _, done, info = a.step(act)
            cost["step"].append(_ms(t0))
            t0 = time.perf_counter()
            snap = a.snapshot()
            cost["snapshot"].append(_ms(t0))
            t0 = time.perf_counter()
            blob = pickle.dumps(snap)
            snap = pickle.loads(blob)
            cost["pickle"].append(_ms(t0))
            sizes.append(len(blob))
            t0 = time.perf_counter()
            b.restore(snap)
            cost["restore"].append(_ms(t0))
        if other_game and n_tasks > 1:  # B plays another game: the restore loads ours
            b.reset((task + 1) % n_tasks)
            t0 = time.perf_counter()
            b.restore(snap)
            other.append(_ms(t0))
    figures = "  ".join(f"{k} {statistics.median(v):.3f}" for k, v in cost.items())
    print(
        f"{name:9s} snapshots {len(sizes):4d}  bytes mean {statistics.mean(sizes):6.0f} "
        f"max {max(sizes):6d}  median ms: {figures}"
        + (f"  restore(other game) {statistics.median(other):.1f}" if other else "")
    )


def _play_batch(env: BatchedEnv, tasks: list[int], group: int, steps: int, mode: str) -> dict:
    """One pass of ``steps`` batched steps from ``reset(tasks, group)``, the same random
    actions for every mode; returns the milliseconds of each timed call."""
    rng = random.Random(1)
    cost: dict[str, list[float]] = {}
    _, infos = env.reset(tasks, group)
    for _ in range(steps):
        acts = [_query(rng.choice(i["admissible_actions"] or ["x"]), i) for i in infos]
        t0 = time.perf_counter()
        if mode == "step+snap":
            _, _, done, infos, _ = env.step(acts, snapshot=True)
        else:
            _, _, done, infos = env.step(acts)
        if mode != "snapshot/restore":
            cost.setdefault(mode, []).append(_ms(t0))
        live = [s for s in range(env.num_envs) if not done[s]]
        if mode == "snapshot/restore" and live:
            t0 = time.perf_counter()
            snaps = env.snapshot(live)
            cost.setdefault("snapshot", []).append(_ms(t0))
            t0 = time.perf_counter()
            infos = env.restore([(s, snaps[0]) for s in range(env.num_envs)])[1]
            cost.setdefault("restore", []).append(_ms(t0))
        if not live:
            break
    return cost


def batched(name: str, factory: Callable[[], Any], n_tasks: int, envs: int, workers: int) -> None:
    """Median milliseconds per BatchedEnv call: plain steps, steps that also snapshot every
    live slot (same actions, same states), and snapshot(live) / restore(every slot)."""
    cost: dict[str, list[float]] = {}
    group = envs // n_tasks
    with BatchedEnv(factory, envs, num_workers=workers) as env:
        for rnd in range(3):
            tasks = [(rnd + i) % n_tasks for i in range(n_tasks)]
            for mode in ("step", "step+snap", "snapshot/restore"):
                for k, v in _play_batch(env, tasks, group, 8, mode).items():
                    cost.setdefault(k, []).extend(v)
    figures = "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in cost.items())
    print(f"{name:9s} BatchedEnv({envs} slots, {workers} workers) median ms per call: {figures}")


def main() -> None:
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--games", default=str(TEST_GAMES), help="folder of ALFWorld games")
    args = ap.parse_args()

    spec = parse_toy_spec("toy:keydoor:size=6,horizon=30")
    per_env("toy", lambda: ToyTextEnv(spec), 8, args.episodes * 4)
    shop = webshop_factory(n_products=5000, n_goals=2000)
    per_env("webshop", shop, 50, args.episodes * 4)

    games = find_games(args.games)
    os.environ.setdefault("AGENTENVS_ALFWORLD_CACHE", tempfile.mkdtemp(prefix="bench_snap_"))
    per_env("alfworld", lambda: AlfWorldEnv(games), len(games), args.episodes, other_game=True)
    batched("toy", toy_factory(spec), 4, args.envs, args.workers)
    batched("webshop", shop, 4, args.envs, args.workers)
    batched("alfworld", alfworld_factory(games), 4, args.envs, args.workers)


if __name__ == "__main__":
    main()
