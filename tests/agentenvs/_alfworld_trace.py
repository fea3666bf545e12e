"""Play a fixed command sequence per game and print what the engine returns, as JSON.

Run as ``python _alfworld_trace.py stock|cached game_file...``; used by test_alfworld_engine.py
to compare the stock TextWorld engine (in a fresh process, unpatched) with the cached one.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any


def trace(env_start: Any, game_file: str) -> list[list[Any]]:
    """Reset twice and play expert-free random admissible commands plus one invalid command."""
    import textworld

    req = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    env = env_start(game_file, req)
    out = []
    for episode in range(2):
        state = env.reset()
        out.append([state.feedback, sorted(set(state["admissible_commands"])), state["won"]])
        rng = random.Random(episode)
        for i in range(12):
            adm = sorted(set(state["admissible_commands"]))
            cmd = "jump over the moon" if i == 5 else rng.choice(adm)
            state, _, _ = env.step(cmd)
            out.append(
                [cmd, state.feedback, sorted(set(state["admissible_commands"])), state["won"]]
            )
    env.close()
    return out


def main() -> None:
    mode, files = sys.argv[1], sys.argv[2:]
    if mode == "stock":
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        def start(path: str, req: Any) -> Any:
            return textworld.start(
                path, request_infos=req, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos]
            )
    else:
        from agentenvs.alfworld.engine import start
    print(json.dumps({f: trace(start, f) for f in files}))


if __name__ == "__main__":
    main()
