"""Solvability check of generated games: the scripted expert plays each through the engine.

Run: ``python -m agentenvs.alfworld.solvability --n 500 --workers 2`` (prints a JSON report with
the solved share and the plan-length distribution per task type).

``--planner`` plans with the PDDL planner (fast-downward through TextWorld) instead of the
scripted expert; ``--official SPLIT`` does that on the official games under $ALFWORLD_DATA, so
that the real benchmark's optimal-plan lengths per task type can stand beside the generated
games' (``--planner`` on both)::

    python -m agentenvs.alfworld.solvability --planner --n 500
    ALFWORLD_DATA=/data/alfworld python -m agentenvs.alfworld.solvability --official train --n 500
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from agentenvs.alfworld.env import AlfWorldEnv, official_games, planner_plan, play, run_expert
from agentenvs.alfworld.generator import generate_split
from hgpo.extras import exit_on_missing_extras
from hgpo.options import ArgumentParser, check_int


def _check(args: tuple[bool, list[str]]) -> list[tuple[str, bool, int]]:
    planner, files = args
    env = AlfWorldEnv(files, max_steps=50)
    out = []
    for i in range(len(files)):
        try:
            if planner:
                plan = planner_plan(env, i)
                won = play(env, i, plan)
            else:
                won, plan = run_expert(env, i)
        except Exception:  # a crash counts as unsolved
            won, plan = False, []
        out.append((env.traj.get("task_type", ""), won and len(plan) <= 50, len(plan)))
    env.close()
    return out


def _run(files: list[str], workers: int, planner: bool) -> list[tuple[str, bool, int]]:
    chunks = [(planner, files[w::workers]) for w in range(workers)]
    chunks = [c for c in chunks if c[1]]
    if len(chunks) == 1:
        return _check(chunks[0])
    with ProcessPoolExecutor(len(chunks)) as pool:
        return [r for part in pool.map(_check, chunks) for r in part]


def solvability_report(
    n_games: int = 500,
    split: str = "train",
    seed: int = 123,
    workers: int = 2,
    planner: bool = False,
    official: bool = False,
) -> dict[str, Any]:
    """Report the expert's (or planner's) success and plan lengths per task type.

    Generated games (``n_games`` of ``split`` from ``seed``) by default; with ``official`` the
    first ``n_games`` official games of ``split`` in a seeded random order (always planned:
    the scripted expert needs the generator's record of a game).
    """
    check_int("n_games", n_games, lo=1)
    check_int("seed", seed, lo=0)
    check_int("workers", workers, lo=1)
    if official:
        files = official_games(split)
        if not files:
            raise ValueError(
                f"official: no official games of split={split!r}: set ALFWORLD_DATA to the "
                "folder holding json_2.1.1/ (from alfworld-download)"
            )
        import random

        random.Random(seed).shuffle(files)
        results = _run(files[:n_games], workers, True)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            files = [str(p) for p in generate_split(tmp, split, n_games, seed)]
            results = _run(files, workers, planner)
    by_type: dict[str, list[int]] = defaultdict(list)
    for tt, won, n in results:
        if won:
            by_type[tt].append(n)
    report: dict[str, Any] = {
        "games": "official" if official else "generated",
        "plans": "planner" if (planner or official) else "scripted expert",
        "split": split,
        "n_games": len(results),
        "solved": sum(w for _, w, _ in results),
        "solved_share": sum(w for _, w, _ in results) / max(1, len(results)),
        "plan_length": {
            tt: {
                "n": len(v),
                "min": min(v),
                "mean": sum(v) / len(v),
                "max": max(v),
                "hist": {str(k): v.count(k) for k in sorted(set(v))},
            }
            for tt, v in sorted(by_type.items())
        },
    }
    return report


def main() -> None:
    ap = ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--split", default="train")
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--planner", action="store_true", help="plan with fast-downward")
    ap.add_argument(
        "--official", metavar="SPLIT", default=None,
        help="the official games of SPLIT under $ALFWORLD_DATA (planner plans)",
    )  # fmt: skip
    a = ap.parse_args()
    exit_on_missing_extras("python -m agentenvs.alfworld.solvability", "alfworld")
    split = a.official or a.split
    try:
        for flag, value, lo in (
            ("--n", a.n, 1),
            ("--seed", a.seed, 0),
            ("--workers", a.workers, 1),
        ):
            check_int(flag, value, lo=lo)
        rep = solvability_report(a.n, split, a.seed, a.workers, a.planner, a.official is not None)
    except ValueError as exc:
        ap.error(str(exc))
    print(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
