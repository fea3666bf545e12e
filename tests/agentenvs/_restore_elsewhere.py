"""Restore a pickled ALFWorld snapshot in this (fresh) process and replay commands.

Run as ``python _restore_elsewhere.py SNAPSHOT_PICKLE COMMANDS_JSON GAME_FILE...``; prints the
restore's (observation, info) and every step's (observation, reward, done, info) as JSON. Used
by test_snapshot.py with another PYTHONHASHSEED than the process that took the snapshot, as a
Ray actor on another node would have.
"""

from __future__ import annotations

import json
import pickle
import sys


def main() -> None:
    from agentenvs.alfworld.env import AlfWorldEnv

    snap_path, commands_path, *games = sys.argv[1:]
    with open(snap_path, "rb") as f:
        snap = pickle.load(f)
    with open(commands_path) as f:
        commands = json.load(f)
    env = AlfWorldEnv(games)
    out = [list(env.restore(snap))]
    out += [list(env.step(c)) for c in commands]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
