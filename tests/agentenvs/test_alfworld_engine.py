"""The cached ALFWorld engine: same output as the stock TextWorld engine, shared per-game work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="ALFWorld needs the alfworld package (extra [alfworld])")
pytest.importorskip("textworld", reason="ALFWorld needs textworld (installed with alfworld)")

from agentenvs.alfworld import engine
from agentenvs.alfworld.env import AlfWorldEnv, find_games, run_expert

HERE = Path(__file__).parent
DATA = HERE / "data" / "alfworld_games"
ROOT = HERE.parent.parent


def _trace(mode: str, files: list[str], disk_cache: str = "off") -> dict:
    """Run tests/agentenvs/_alfworld_trace.py in a fresh process (the stock engine must not see
    the patches the cached engine installs in its process)."""
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        AGENTENVS_ALFWORLD_CACHE=disk_cache,
    )
    out = subprocess.run(
        [sys.executable, str(HERE / "_alfworld_trace.py"), mode, *files],
        capture_output=True, text=True, check=True, env=env, cwd=ROOT,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_cached_engine_equals_the_stock_engine_step_by_step(tmp_path):
    # two episodes per game, random admissible commands and one invalid command: every
    # observation, admissible list and won flag must be the stock engine's, whether the
    # translation and grammar were computed (first run) or loaded from the disk cache (second)
    files = [find_games(DATA / "valid_seen")[0], find_games(DATA / "valid_unseen")[0]]
    stock = _trace("stock", files)
    computed = _trace("cached", files, disk_cache=str(tmp_path))
    assert len(list(tmp_path.glob("translation-*.pkl"))) == 2
    assert len(list(tmp_path.glob("logic-*.pkl"))) == 2
    loaded = _trace("cached", files, disk_cache=str(tmp_path))
    for f in files:
        assert len(stock[f]) == 26
        for run in (computed, loaded):
            for i, (a, b) in enumerate(zip(stock[f], run[f], strict=True)):
                assert a == b, f"{f}: entry {i} differs"


def test_group_members_share_one_translation_per_game(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTENVS_ALFWORLD_CACHE", str(tmp_path))
    engine.clear_caches()
    files = find_games(DATA / "train")[:2]
    envs = [AlfWorldEnv(files) for _ in range(4)]
    first = [e.reset(0)[0] for e in envs] + [e.reset(1)[0] for e in envs]
    assert len(set(first[:4])) == 1 and len(set(first[4:])) == 1
    info = engine.cache_info()
    assert info["translations"][1] == 2  # one PDDL -> SAS translation per game
    assert info["logics"][1] == 2  # one grammar parse per game
    # 8 loads look the translation up (2 misses, 6 hits); each first reset reuses the state
    # its load built, so it does not look it up again
    assert info["translations"] == (6, 2)
    assert info["disk"] == (0, 4)  # translation and grammar of 2 games written once
    engine.clear_caches()
    AlfWorldEnv(files).reset(1)
    assert engine.cache_info()["disk"] == (2, 0)  # a fresh process would load them
    # each env keeps one engine (and one fast-downward library copy) across games
    engines = {id(e._env) for e in envs}
    envs[0].reset(0)
    assert {id(e._env) for e in envs} == engines
    for e in envs:
        e.close()


def test_expert_still_wins_after_switching_games_in_one_env():
    files = find_games(DATA / "train")
    env = AlfWorldEnv(files)
    for task in (0, 1, 0, 2):
        won, plan = run_expert(env, task)
        assert won, f"expert failed on {files[task]} with {plan}"
    env.close()
