"""The finite-POMDP core every toy environment is an instance of.

A :class:`POMDP` is a frozen bundle of numpy arrays: hidden states ``0..S-1``, a many-to-one
observation map ``obs_of_state`` (the aliasing), actions ``0..A-1``, transitions as up to ``B``
outcomes per (state, action), an invalid-action mask, a reward for entering each state and a
terminal mask. Semantics, shared by the numba kernels, the gymnasium wrapper and the exact
solver:

- an *invalid* action (``invalid[s, a]``) leaves the state unchanged and costs 0.1; the
  environment reward reported in a :class:`hgpo.StepBatch` excludes that penalty (the flag is
  reported instead), the *true* reward is ``r_t - 0.1 * invalid_t``;
- a valid action moves to ``next_state[s, a, b]`` with probability ``next_prob[s, a, b]``;
- entering state ``s'`` pays ``reward_enter[s']`` (+10 for a goal) and ends the episode when
  ``terminal[s']``;
- an episode also ends after ``horizon`` steps (steps ``t = 0 .. horizon - 1``).

A *task* is a start state; a rollout group is N rollouts of one task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hgpo.options import bad, check_int, check_number

__all__ = ["GOAL_REWARD", "INVALID_PENALTY", "POMDP", "add_slip", "mdp_optimal_values"]

INVALID_PENALTY = 0.1
GOAL_REWARD = 10.0


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class POMDP:
    """A finite POMDP with aliasing, invalid actions, goal reward and a horizon.

    Attributes (S states, O observations, A actions, B outcomes per (state, action)):
        name: family name (``"keydoor"``, ...).
        obs_of_state: int64[S] observation id of each hidden state (many-to-one).
        next_state: int64[S, A, B] possible successors of a *valid* action. Unused outcome slots
            repeat a used successor with probability 0.
        next_prob: float64[S, A, B] their probabilities (rows sum to 1).
        invalid: bool[S, A] True where the action is invalid in that state (state unchanged,
            penalty 0.1).
        reward_enter: float64[S] reward paid on entering each state.
        terminal: bool[S] entering such a state ends the episode.
        horizon: int the episode length cap T_max.
        tasks: int64[n_tasks] start states, the default task set (train + held-out).
        train_tasks / heldout_tasks: disjoint subsets of ``tasks`` for generalisation studies.
        action_names: one label per action. state_names: one label per hidden state.
        obs_names: one label per observation. params: the constructor's arguments.
    """

    name: str
    obs_of_state: np.ndarray
    next_state: np.ndarray
    next_prob: np.ndarray
    invalid: np.ndarray
    reward_enter: np.ndarray
    terminal: np.ndarray
    horizon: int
    tasks: np.ndarray
    train_tasks: np.ndarray
    heldout_tasks: np.ndarray
    action_names: tuple[str, ...]
    state_names: tuple[str, ...] = ()
    obs_names: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        obs = np.asarray(self.obs_of_state, dtype=np.int64)
        nxt = np.asarray(self.next_state, dtype=np.int64)
        prob = np.asarray(self.next_prob, dtype=np.float64)
        if nxt.ndim == 2:
            nxt, prob = nxt[:, :, None], np.ones((*nxt.shape, 1))
        inv = np.asarray(self.invalid, dtype=np.bool_)
        rew = np.asarray(self.reward_enter, dtype=np.float64)
        term = np.asarray(self.terminal, dtype=np.bool_)
        S = obs.shape[0]
        if obs.ndim != 1 or S == 0:
            raise ValueError(f"POMDP.obs_of_state must be a non-empty 1-d array, got {obs.shape}")
        if nxt.ndim != 3 or nxt.shape[0] != S or prob.shape != nxt.shape:
            raise ValueError(
                f"POMDP.next_state {nxt.shape} / next_prob {prob.shape} must be [S={S}, A, B]"
            )
        A = nxt.shape[1]
        if inv.shape != (S, A):
            raise ValueError(f"POMDP.invalid has shape {inv.shape}, expected {(S, A)}")
        if rew.shape != (S,) or term.shape != (S,):
            raise ValueError(f"POMDP.reward_enter / terminal must have shape ({S},)")
        if not np.isfinite(rew).all():
            i = int(np.flatnonzero(~np.isfinite(rew))[0])
            raise ValueError(f"POMDP.reward_enter[{i}] is {rew[i]}; rewards must be finite")
        if obs.min() < 0:
            raise ValueError(f"POMDP.obs_of_state holds {obs.min()}; observation ids are >= 0")
        if nxt.min() < 0 or nxt.max() >= S:
            raise ValueError(f"POMDP.next_state holds {nxt.min()}..{nxt.max()}, outside 0..{S - 1}")
        if (prob < 0).any() or not np.allclose(prob.sum(axis=2), 1.0):
            raise ValueError("POMDP.next_prob must be non-negative and sum to 1 over outcomes")
        set_(self, "horizon", check_int("POMDP.horizon", self.horizon, lo=1))
        for name in ("tasks", "train_tasks", "heldout_tasks"):
            t = np.asarray(getattr(self, name), dtype=np.int64)
            if t.ndim != 1 or (t.size and (t.min() < 0 or t.max() >= S)):
                raise ValueError(f"POMDP.{name} must list start states in 0..{S - 1}, got {t}")
            if t.size and term[t].any():
                raise ValueError(f"POMDP.{name} holds a terminal state: {t[term[t]]}")
            set_(self, name, _frozen(t))
        if np.intersect1d(self.train_tasks, self.heldout_tasks).size:
            raise ValueError("POMDP.train_tasks and heldout_tasks must be disjoint")
        if len(self.action_names) != A:
            raise ValueError(
                f"POMDP.action_names has {len(self.action_names)} names for {A} actions"
            )
        # An invalid action leaves the state unchanged, whatever next_state says.
        ss, aa = np.nonzero(inv)
        if ss.size:
            nxt = nxt.copy()
            prob = prob.copy()
            nxt[ss, aa, :] = ss[:, None]
            prob[ss, aa, :] = 0.0
            prob[ss, aa, 0] = 1.0
        set_(self, "horizon", int(self.horizon))
        set_(self, "obs_of_state", _frozen(obs))
        set_(self, "next_state", _frozen(nxt))
        set_(self, "next_prob", _frozen(prob))
        set_(self, "invalid", _frozen(inv))
        set_(self, "reward_enter", _frozen(rew))
        set_(self, "terminal", _frozen(term))
        set_(self, "action_names", tuple(self.action_names))
        set_(self, "state_names", tuple(self.state_names))
        set_(self, "obs_names", tuple(self.obs_names))

    @property
    def n_states(self) -> int:
        return int(self.obs_of_state.shape[0])

    @property
    def n_obs(self) -> int:
        return int(self.obs_of_state.max()) + 1

    @property
    def n_actions(self) -> int:
        return int(self.next_state.shape[1])

    @property
    def n_outcomes(self) -> int:
        return int(self.next_state.shape[2])

    @property
    def deterministic(self) -> bool:
        return bool((self.next_prob[:, :, 0] == 1.0).all())

    def aliasing(self) -> float:
        """Share of non-terminal hidden states whose observation another such state shares."""
        live = ~self.terminal
        _, inv, counts = np.unique(self.obs_of_state[live], return_inverse=True, return_counts=True)
        return float((counts[inv] > 1).mean()) if live.any() else 0.0

    def optimal_values(self, gamma: float = 0.95) -> np.ndarray:
        """float64[n_tasks] optimal value of each task with the hidden state observed.

        An upper bound on what any context policy achieves; reached when the context holds
        enough history to tell the aliased states apart (see each family's docstring).
        """
        gamma = check_number("gamma", gamma, lo=0.0, hi=1.0)
        return mdp_optimal_values(self, gamma)[:, 0][self.tasks]

    def __repr__(self) -> str:
        return (
            f"POMDP({self.name!r}, n_states={self.n_states}, n_obs={self.n_obs}, "
            f"n_actions={self.n_actions}, horizon={self.horizon}, n_tasks={self.tasks.size})"
        )


def mdp_optimal_values(env: POMDP, gamma: float = 0.95) -> np.ndarray:
    """float64[S, T+1] optimal time-indexed values of the fully observed MDP (V[:, T] = 0).

    Finite-horizon backward induction with true rewards (goal reward minus invalid penalty):
    V_t(s) = max_a sum_b p_b (r(s, a, s'_b) + gamma * [s'_b not terminal] V_{t+1}(s'_b)).
    """
    T, S = env.horizon, env.n_states
    V = np.zeros((S, T + 1))
    r = env.reward_enter[env.next_state] - INVALID_PENALTY * env.invalid[:, :, None]  # (S, A, B)
    nxt = env.next_state
    live = ~env.terminal[nxt]
    for t in range(T - 1, -1, -1):
        q = (env.next_prob * (r + gamma * live * V[nxt, t + 1])).sum(axis=2)
        V[:, t] = q.max(axis=1)
    return V


def add_slip(
    det_next: np.ndarray, invalid: np.ndarray, slip: float, slip_actions: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Turn deterministic successors into slippery ones.

    With probability ``slip`` a valid action in ``slip_actions`` is replaced by a uniformly
    drawn action of ``slip_actions`` (itself included); if the drawn action is invalid in that
    state the state is unchanged (no penalty: the chosen action was valid). Outcomes leading to
    the same successor are merged.

    Returns:
        next_state int64[S, A, B], next_prob float64[S, A, B].
    """
    slip = check_number("slip", slip, lo=0.0, hi=1.0)
    S, A = det_next.shape
    slip_actions = list(slip_actions)
    if slip == 0.0 or not slip_actions:
        return det_next[:, :, None].copy(), np.ones((S, A, 1))
    B = len(slip_actions) + 1
    nxt = np.repeat(det_next[:, :, None], B, axis=2)
    prob = np.zeros((S, A, B))
    share = slip / len(slip_actions)
    for s in range(S):
        for a in range(A):
            if invalid[s, a] or a not in slip_actions:
                prob[s, a, 0] = 1.0
                continue
            outcomes: dict[int, float] = {int(det_next[s, a]): 1.0 - slip}
            for b in slip_actions:
                tgt = s if invalid[s, b] else int(det_next[s, b])
                outcomes[tgt] = outcomes.get(tgt, 0.0) + share
            for i, (tgt, p) in enumerate(outcomes.items()):
                nxt[s, a, i], prob[s, a, i] = tgt, p
            nxt[s, a, len(outcomes) :] = int(det_next[s, a])
    used = int((prob > 0).sum(axis=2).max())
    return nxt[:, :, :used].copy(), prob[:, :, :used].copy()


def split_tasks(tasks: np.ndarray, heldout_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded disjoint (train, held-out) split of ``tasks``; at least one train task."""
    heldout_frac = check_number("heldout_frac", heldout_frac, lo=0.0, hi=1.0, hi_open=True)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(tasks.size)
    n_held = min(round(heldout_frac * tasks.size), tasks.size - 1)
    held = np.sort(tasks[perm[:n_held]])
    train = np.sort(tasks[perm[n_held:]])
    return train, held


def check_tasks(env: POMDP, tasks: Any) -> np.ndarray:
    """``tasks`` as int64 start states of ``env`` (default: ``env.tasks``), or a ValueError:
    a non-empty one-dimensional integer array (not bool, not 1.5) of non-terminal states in
    0..n_states - 1."""
    if not isinstance(env, POMDP):
        raise bad("env", "a toyenvs.POMDP (toyenvs.make)", type(env).__name__)
    if tasks is None:
        return env.tasks.copy()
    t = np.asarray(tasks)
    if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"tasks must be a non-empty 1-d integer array of start states, got {t!r}")
    if t.min() < 0 or t.max() >= env.n_states:
        raise ValueError(f"tasks must be start states in 0..{env.n_states - 1}, got {t}")
    if env.terminal[t].any():
        raise ValueError(f"tasks holds terminal state(s) {t[env.terminal[t]]}")
    return t.astype(np.int64)
