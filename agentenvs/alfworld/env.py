"""ALFWorld through the real text engine (TextWorld's PDDL engine with alfworld's wrappers).

Games are either the official ones ($ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen})
or generated ones (:mod:`agentenvs.alfworld.generator`). The engine produces every string the
agent sees; this class adds the episode limit (50 steps, invalid steps count), the reward
(10 on success, else 0) and the info fields the trainer reads.

Snapshots (branching rollouts): :class:`AlfWorldSnapshot` holds the game, the episode's
bookkeeping (steps, done, won) and the engine's own state
(:class:`agentenvs.alfworld.engine.EngineSnapshot`: SAS variable values, facts, feedback); a
restore loads the game if this env is playing another one and copies the state in, no replay.

Same role as ``agentenvs/webshop/env.py`` in a parallel benchmark package (each
benchmark's ``env.py`` holds its environment class); the shared name is deliberate.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenvs.alfworld.expert import expert_plan
from agentenvs.alfworld.generator import GameSpec
from hgpo.options import bad, check_int

MAX_STEPS = 50
SUCCESS_REWARD = 10.0
OFFICIAL_SPLITS = {
    "train": "train",
    "valid_seen": "valid_seen",
    "valid_unseen": "valid_unseen",
    "eval_in_distribution": "valid_seen",
    "eval_out_of_distribution": "valid_unseen",
}


def find_games(root: str | os.PathLike[str]) -> list[str]:
    """Every solvable ``game.tw-pddl`` under ``root`` with a ``traj_data.json`` beside it, as
    alfworld's own loader selects them (movable and sliced tasks skipped), sorted."""
    out = []
    for dirpath, _, files in os.walk(root):
        if "traj_data.json" not in files or "game.tw-pddl" not in files:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            continue
        out.append(str(Path(dirpath) / "game.tw-pddl"))
    return sorted(out)


def official_games(split: str) -> list[str]:
    """Official games of ``split`` under $ALFWORLD_DATA (empty list when it is not set)."""
    if split not in OFFICIAL_SPLITS:
        raise bad("split", "one of " + ", ".join(map(repr, sorted(OFFICIAL_SPLITS))), split)
    data = os.environ.get("ALFWORLD_DATA")
    if not data:
        return []
    return find_games(Path(data) / "json_2.1.1" / OFFICIAL_SPLITS[split])


def _traj(game_file: str) -> dict[str, Any]:
    p = Path(game_file).parent / "traj_data.json"
    return json.loads(p.read_text()) if p.exists() else {}


@dataclass(frozen=True)
class AlfWorldSnapshot:
    """One ALFWorld episode mid-way: task (game number) and game (its file, checked on
    restore), steps taken (the limit counts them), done, won, and the engine's state."""

    task: int
    game: str
    steps: int
    done: bool
    won: bool
    engine: Any  # agentenvs.alfworld.engine.EngineSnapshot (engine imports textworld lazily)


class AlfWorldEnv:
    """One ALFWorld episode at a time over a fixed list of game files."""

    supports_snapshot = True

    def __init__(self, game_files: list[str], max_steps: int = MAX_STEPS) -> None:
        if not game_files:
            raise ValueError("game_files must not be empty")
        max_steps = check_int("max_steps", max_steps, lo=1)
        self.game_files = list(game_files)
        self.max_steps = max_steps
        self._env: Any = None
        self._loaded: str | None = None

    @property
    def num_tasks(self) -> int:
        return len(self.game_files)

    def _load(self, game_file: str) -> None:
        """Load ``game_file`` into this env's engine (made on first use, reused after).

        The engine is :class:`agentenvs.alfworld.engine.CachedPddlEnv`: the game's PDDL
        translation, grammar and text-generation parses are computed once per process and
        shared by every env of the process that plays the same game.
        """
        from agentenvs.alfworld import engine  # (the [alfworld] extra's error if it is missing)

        if self._env is None:
            req = engine.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
            self._env = engine.start(game_file, req)
        else:
            self._env.load(game_file)
        self._loaded = game_file

    def reset(self, task: int) -> tuple[str, dict[str, Any]]:
        """Start game number ``task``; returns the engine's first observation and info."""
        task = check_int("task", task, lo=0, hi=len(self.game_files) - 1)
        game = self.game_files[task]
        if self._loaded != game:
            self._load(game)
        state = self._env.reset()
        self.task = task
        self.traj = _traj(game)
        self.steps = 0
        self.done = False
        self.won = False
        self._state = state
        return state.feedback, self._info()

    def snapshot(self) -> AlfWorldSnapshot:
        """The current episode (see :class:`AlfWorldSnapshot`)."""
        if self._loaded is None:
            raise ValueError("snapshot called before reset")
        engine = self._env.unwrapped.snapshot()
        return AlfWorldSnapshot(self.task, self._loaded, self.steps, self.done, self.won, engine)

    def restore(self, snap: AlfWorldSnapshot) -> tuple[str, dict[str, Any]]:
        """Continue ``snap``'s episode here (loading its game if needed); returns the
        observation and info current when it was taken."""
        if not isinstance(snap, AlfWorldSnapshot):
            raise TypeError(f"restore: expected an AlfWorldSnapshot, got {type(snap).__name__}")
        if not 0 <= snap.task < len(self.game_files) or self.game_files[snap.task] != snap.game:
            raise ValueError(
                f"restore: game {snap.task} of the snapshot ({snap.game}) is not this env's "
                "game of that number"
            )
        if self._loaded != snap.game:
            self._load(snap.game)
        if getattr(self, "task", None) != snap.task or not hasattr(self, "traj"):
            self.traj = _traj(snap.game)
        self._state = self._env.unwrapped.restore(snap.engine)
        self.task, self.steps, self.done, self.won = snap.task, snap.steps, snap.done, snap.won
        return self._state.feedback, self._info()

    def entity_names(self) -> dict[str, str]:
        """Engine id (mangled, lower case) -> name shown to the agent ("apple 1")."""
        return {k: v.name for k, v in self._env._entity_infos.items()}

    def admissible_actions(self) -> list[str]:
        """The engine's admissible commands (sorted, de-duplicated)."""
        return sorted(set(self._state["admissible_commands"]))

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Send one command to the engine; reward 10 on success, done on success or 50 steps."""
        if self._loaded is None:
            raise ValueError("step called before reset")
        if self.done:
            return self._state.feedback, 0.0, True, self._info()
        state, _, _ = self._env.step(action if isinstance(action, str) else "")
        self._state = state
        self.steps += 1
        self.won = bool(state["won"])
        self.done = self.won or self.steps >= self.max_steps
        return state.feedback, SUCCESS_REWARD if self.won else 0.0, self.done, self._info()

    def _info(self) -> dict[str, Any]:
        return {
            "won": self.won,
            "task_score": 1.0 if self.won else 0.0,
            "task_type": self.traj.get("task_type", ""),
            "admissible_actions": self.admissible_actions(),
            "gamefile": self.game_files[self.task],
        }

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env, self._loaded = None, None


def planner_plan(env: AlfWorldEnv, task: int) -> list[str]:
    """The PDDL planner's plan (fast-downward, TextWorld's ``replan``) from game ``task``'s start.

    Works on any game the engine loads, official or generated, so plan lengths of the two can
    be compared like for like. Resets the env to ``task``.
    """
    env.reset(task)
    e = env._env
    while not hasattr(e, "_pddl_state") and hasattr(e, "_wrapped_env"):
        e = e._wrapped_env
    return list(e._pddl_state.replan(e._entity_infos))


def play(env: AlfWorldEnv, task: int, plan: list[str]) -> bool:
    """Send ``plan`` to game ``task`` from its start; True when it wins with every command
    admissible when sent."""
    env.reset(task)
    for cmd in plan:
        if cmd not in env.admissible_actions():
            return False
        _, _, done, info = env.step(cmd)
        if done:
            return bool(info["won"])
    return env.won


def run_expert(env: AlfWorldEnv, task: int) -> tuple[bool, list[str]]:
    """Play the scripted expert's plan of generated game ``task`` through the engine.

    Returns (won, plan). Every command must be admissible when it is sent.
    """
    env.reset(task)
    gen = env.traj.get("generator")
    if gen is None:
        raise ValueError(f"game {env.game_files[task]} was not generated by agentenvs")
    plan = expert_plan(GameSpec(**gen), env.entity_names())
    for cmd in plan:
        if cmd not in env.admissible_actions():
            return False, plan
        _, _, done, info = env.step(cmd)
        if done:
            return bool(info["won"]), plan
    return env.won, plan
