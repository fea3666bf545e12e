"""A gymnasium.Env over any toy POMDP, for single-environment use."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hgpo.options import bad, check_int
from toyenvs.core import INVALID_PENALTY, POMDP, check_tasks
from toyenvs.families import make

__all__ = ["POMDPEnv", "make_gym"]


class POMDPEnv(gym.Env):
    """One episode at a time of a :class:`toyenvs.POMDP`, through the gymnasium API.

    Observation: Discrete(n_obs), the observation id (never the hidden state). Action:
    Discrete(n_actions). Reward: the *true* reward r_t - 0.1 * invalid_t. ``terminated`` when a
    terminal state is entered, ``truncated`` after ``horizon`` steps. ``info`` holds
    ``hidden_state``, ``invalid`` (the flag) and ``env_reward`` (r_t without the penalty).
    ``reset(options={"task": start_state})`` fixes the task; otherwise a task is drawn
    uniformly from ``tasks`` (default ``env.tasks``) with the env's seeded generator.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(self, env: POMDP, tasks: np.ndarray | None = None,
                 render_mode: str | None = None) -> None:  # fmt: skip
        if not isinstance(env, POMDP):
            raise ValueError(f"env must be a toyenvs.POMDP, got {type(env).__name__}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.pomdp = env
        self.tasks = check_tasks(env, tasks)
        self.observation_space = spaces.Discrete(env.n_obs)
        self.action_space = spaces.Discrete(env.n_actions)
        self.render_mode = render_mode
        self._s = int(self.tasks[0])
        self._t = 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
        super().reset(seed=seed)
        if options and "task" in options:
            task = check_int("options['task']", options["task"], lo=0, hi=self.pomdp.n_states - 1)
            if self.pomdp.terminal[task]:
                raise bad("options['task']", "a non-terminal state", task)
            self._s = task
        else:
            self._s = int(self.tasks[self.np_random.integers(self.tasks.size)])
        self._t = 0
        return int(self.pomdp.obs_of_state[self._s]), {"hidden_state": self._s}

    def step(self, action: Any) -> tuple[int, float, bool, bool, dict[str, Any]]:
        # what the action space holds (an int, a numpy integer or a 0-d integer array), no bool
        if isinstance(action, bool) or not self.action_space.contains(action):
            raise bad("action", f"an integer in 0..{self.pomdp.n_actions - 1}", action)
        a = int(action)
        env, s = self.pomdp, self._s
        invalid = bool(env.invalid[s, a])
        probs = env.next_prob[s, a]
        b = 0 if probs[0] >= 1.0 else int(self.np_random.choice(probs.size, p=probs))
        s2 = int(env.next_state[s, a, b])
        r_env = float(env.reward_enter[s2])
        self._s = s2
        self._t += 1
        terminated = bool(env.terminal[s2])
        truncated = not terminated and self._t >= env.horizon
        info = {"hidden_state": s2, "invalid": invalid, "env_reward": r_env}
        reward = r_env - INVALID_PENALTY * invalid
        return int(env.obs_of_state[s2]), reward, terminated, truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        names = self.pomdp.state_names
        return names[self._s] if names else f"state {self._s}"


def make_gym(name: str, **params: Any) -> POMDPEnv:
    """``POMDPEnv(toyenvs.make(name, **params))``."""
    return POMDPEnv(make(name, **params))
