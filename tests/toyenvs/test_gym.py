"""The gymnasium interface of every family."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import toyenvs


@pytest.mark.parametrize("name", sorted(toyenvs.FAMILIES))
def test_check_env_is_clean(name: str) -> None:
    env = toyenvs.make_gym(name)
    check_env(env, skip_render_check=True)


def test_steps_follow_the_pomdp() -> None:
    pomdp = toyenvs.make("keydoor", size=4, horizon=5)
    env = toyenvs.POMDPEnv(pomdp, render_mode="ansi")
    obs, info = env.reset(seed=0, options={"task": int(pomdp.tasks[0])})
    assert obs == pomdp.obs_of_state[pomdp.tasks[0]]
    s = info["hidden_state"]
    for t in range(5):
        a = 4  # pickup: invalid away from the key
        obs, r, term, trunc, info = env.step(a)
        assert info["invalid"] == bool(pomdp.invalid[s, a])
        assert r == pytest.approx(info["env_reward"] - 0.1 * info["invalid"])
        assert trunc == (t == 4) and not term
        s = info["hidden_state"]
    assert isinstance(env.render(), str)
    env.step(np.int64(1))  # what the action space holds
    env.step(np.array(1))
    for action in (9, -1, 1.7, True, "1"):  # 1.7 is not read as 1
        with pytest.raises(ValueError, match=r"^action: must be an integer in 0\.\.\d+, got"):
            env.step(action)
    for task in (10**6, 1.0):
        with pytest.raises(ValueError, match=r"^options\['task'\]: must be an integer in 0\.\."):
            env.reset(options={"task": task})
    end = int(np.flatnonzero(pomdp.terminal)[0])
    with pytest.raises(
        ValueError, match=rf"^options\['task'\]: must be a non-terminal state, got {end}$"
    ):
        env.reset(options={"task": end})


def test_tmaze_goal_through_gym() -> None:
    env = toyenvs.make_gym("tmaze", length=2)
    env.reset(seed=1, options={"task": 1})  # cue "down"
    total = 0.0
    for a in (0, 0, 0, 3):
        _, r, term, _, _ = env.step(a)
        total += r
    assert term and total == 10.0
    tasks = {env.reset(seed=s)[1]["hidden_state"] for s in range(20)}
    assert tasks == {0, 1}
    assert np.issubdtype(type(env.reset()[0]), np.integer)
