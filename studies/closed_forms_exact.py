"""Exact per-task quantities of a toy POMDP under a tabular policy that the closed forms of
:mod:`hgpo.closed_form_bias` take, and the exact expected policy gradient of an estimator whose
expected advantage is known in closed form.

For one task (start state) the reachable chain z = (t, hidden state, context) is enumerated
(:func:`toyenvs.truth.enumerate_chain`) and, undiscounted (gamma = 1), with the true reward
r = reward on entering s' - 0.1 x invalid:

- ``success``: P(the episode enters a goal, a state with a positive entry reward) = p;
- ``alive[k]``: S_k = P(the episode takes a turn k); ``mu[k]`` = E[r_k | a turn k is taken];
- :func:`weighted_q`: Q^x(z, a) = E[sum_{k>=t} x_k | z_t = z, a_t = a] by backward
  induction for a per-step reward x_k = c_k r_k + h_k (c_k, h_k per turn index: the closed
  forms' weights and hidden per-turn rewards);
- :func:`expected_gradient`: sum_{t,z} d_t(z) pi(b | c) (Y(z, b) - sum_a pi(a | c) Y(z, a))
  per policy row c and action b: E[(1 / n_traj) sum_t Y_t grad log pi(a_t | c_t)] per
  trajectory for an estimator whose expected advantage at (z, a) is Y(z, a) (the tabular
  softmax, temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import toyenvs
from toyenvs.truth import enumerate_chain, solve_chain

__all__ = ["TaskChain", "expected_gradient", "task_chain", "weighted_q"]


@dataclass(frozen=True)
class TaskChain:
    """One task's chain under the policy: per layer t the policy rows ``rows[t]``, the action
    probabilities ``pis[t]`` (n_t x A), the successor nodes ``succ[t]`` (n_t x A x B, -1 where
    the episode ends), outcome probabilities ``prob[t]`` and rewards ``rew[t]`` (n_t x A x B),
    the occupancy ``d[t]``; ``success``, ``alive`` and ``mu`` as in the module docstring."""

    rows: list[np.ndarray]
    pis: list[np.ndarray]
    succ: list[np.ndarray]
    prob: list[np.ndarray]
    rew: list[np.ndarray]
    d: list[np.ndarray]
    success: float
    alive: np.ndarray
    mu: np.ndarray


def task_chain(env: toyenvs.POMDP, pol: toyenvs.TabularPolicy, task: int) -> TaskChain:
    """Enumerate and solve the forward pass of one task (module docstring)."""
    chain = enumerate_chain(env, pol.K, np.array([task]))
    rows = [pol.index_of(c) for c in chain.codes]
    pis = [pol.probs(r) for r in rows]
    sol = solve_chain(chain, pis, 1.0)
    goal = env.reward_enter > 0.0
    prob, rew = [], []
    success, alive, er = 0.0, [], []
    for t, s in enumerate(chain.layer_s):
        ns = env.next_state[s]
        p = env.next_prob[s]
        r = env.reward_enter[ns] - toyenvs.INVALID_PENALTY * env.invalid[s][:, :, None]
        prob.append(p)
        rew.append(r)
        w = sol.d[t][:, None, None] * pis[t][:, :, None] * p
        success += float((w * goal[ns]).sum())
        alive.append(float(sol.d[t].sum()))
        er.append(float((w * r).sum()))
    alive_arr = np.clip(alive, 0.0, 1.0)  # a sum of probabilities may round past 1
    mu = np.divide(er, alive_arr, out=np.zeros_like(alive_arr), where=alive_arr > 0)
    return TaskChain(rows, pis, chain.succ, prob, rew, sol.d, success, alive_arr, mu)


def weighted_q(tc: TaskChain, c: np.ndarray, h: np.ndarray) -> list[np.ndarray]:
    """Q^x per layer (n_t x A) for the per-step reward x_k = c_k r_k + h_k (undiscounted)."""
    n_layers = len(tc.rows)
    out: list[np.ndarray] = [np.empty(0)] * n_layers
    V_next = np.zeros(0)
    for t in range(n_layers - 1, -1, -1):
        nxt = np.append(V_next, 0.0)[tc.succ[t]]  # -1 (ended) reads the appended 0
        Q = (tc.prob[t] * (c[t] * tc.rew[t] + nxt)).sum(axis=2) + h[t]
        out[t] = Q
        V_next = (tc.pis[t] * Q).sum(axis=1)
    return out


def expected_gradient(tc: TaskChain, Y: list[np.ndarray], n_rows: int) -> np.ndarray:
    """float64[n_rows, A]: the expected per-trajectory gradient estimate for expected
    advantages ``Y`` (per layer, n_t x A; module docstring)."""
    A = tc.pis[0].shape[1]
    g = np.zeros((n_rows, A))
    for t, y in enumerate(Y):
        pi = tc.pis[t]
        term = tc.d[t][:, None] * pi * (y - (pi * y).sum(axis=1, keepdims=True))
        for b in range(A):
            g[:, b] += np.bincount(tc.rows[t], weights=term[:, b], minlength=n_rows)
    return g
