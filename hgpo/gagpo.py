"""GAGPO: GAE with a grouped value proxy built from the rollouts, normalised per group.

Source: S. Zhu, C. Yu, R. Yang, Z. Liu, J. Hu, Q. Chen, Y. Zhang, "GAGPO: Generalized
Advantage Grouped Policy Optimization" (arXiv:2605.13217). No code is public (searched
GitHub's stored index and the web for the title, the arXiv id and "gagpo" on 2026-12-03:
none found), so this follows the paper's description and names every choice; it is checked
against a hand-worked example (tests/hgpo/test_hand_worked.py) and a slow reference.

The paper: steps are grouped by identical environment state across the rollouts of a task
(its "rollout grouping", as GiGPO's anchor states); the grouped value proxy of a state is the
mean discounted return of the steps in it; TD residuals with that proxy are accumulated with
GAE's (gamma lambda) recursion; the step-level temporal advantage is the only signal (no
trajectory-level term added) and is normalised within the task's group. Here, with
gamma = ``gamma`` and lambda = ``gagpo_lambda``::

    R_t     = sum_{j >= t} gamma^(j - t) r_j          (r: rewards less invalid_penalty)
    V(g, s) = mean of R_t over the steps of rollout group g in state s
    delta_t = r_t + gamma V(g, s_{t+1}) - V(g, s_t),  V = 0 after a trajectory's last step
    A~_t    = sum_{l >= 0} (gamma lambda)^l delta_{t+l}  (within the trajectory)
    A_t     = A~_t normalised over the steps of rollout group g (``norm``, ``std``, ``eps``)

Choices where the paper's text as read gives no detail (each can be argued; named so that a
later reading of the full text can correct it): lambda's default 0.95 (the paper ablates
lambda = 0 as worse; its value is not in the text read); the value after a trajectory's last
step is 0 (a terminal state; the batch holds no value for it); the invalid-action penalty is
a reward (propagated, as ``gae``; ``penalty_mode`` is not read); a one-member group gives 0;
the normalisation pools all step rows of the group (the paper's "group-wise" against its
ablated batch-wise and none). The action-level importance ratio is a loss detail, not an
advantage, and is not here. ``returns`` holds A~_t + V(g, s_t), the lambda-return.
"""

from __future__ import annotations

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs
from hgpo.groups import dense_rank, group_by, key_means, normalise, sorted_within
from hgpo.returns import check_batch, check_finite, discounted_returns, penalised_rewards

__all__ = ["gagpo", "gagpo_values"]


def gagpo_values(batch: StepBatch, cfg: EstimatorConfig) -> np.ndarray:
    """float64[n] the grouped value proxy V(g, s_t) of every step (module docstring)."""
    check_batch(batch)
    r = penalised_rewards(batch, cfg.invalid_penalty)
    R = discounted_returns(batch, cfg.gamma, r)
    g, _ = dense_rank(batch.group)
    s, n_states = dense_rank(batch.state)
    node, n_nodes = dense_rank(g * n_states + s)
    V = key_means(node, n_nodes, R)[node]
    return check_finite(batch, V, "gagpo value proxy")


def gagpo(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """GAGPO (arXiv:2605.13217; no public code):

        A_t = [sum_l (gamma gagpo_lambda)^l delta_{t+l}] normalised within the rollout group,
        delta_t = r_t + gamma V(g, s_{t+1}) - V(g, s_t),
        V(g, s) = the mean discounted return of the group's steps in state s,

    r_t less ``invalid_penalty`` on an invalid step, V = 0 after a trajectory's last step (see
    :mod:`hgpo.gagpo`). ``returns`` holds the lambda-returns; ``level_advantages`` the row
    "td" (the advantage before the group normalisation).
    """
    check_inputs("gagpo", batch, cfg)
    V = gagpo_values(batch, cfg)
    r = penalised_rewards(batch, cfg.invalid_penalty)
    V_next = np.zeros_like(V)
    V_next[:-1] = V[1:]
    V_next[batch.traj_start + batch.traj_len - 1] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        delta = r + cfg.gamma * V_next - V
    delta = check_finite(batch, delta, "gagpo TD error")
    A_td = discounted_returns(batch, cfg.gamma * cfg.gagpo_lambda, delta)
    g, _ = dense_rank(batch.group)
    groups = group_by(g)
    adv, _ = normalise(sorted_within(groups, A_td), A_td, cfg.norm, cfg.std, cfg.eps)
    with np.errstate(over="ignore", invalid="ignore"):
        lam_return = A_td + V
    return Advantages(
        adv,
        check_finite(batch, lam_return, "gagpo lambda-return"),
        A_td[None, :],
        g[None, :],
        ("td",),
        {"levels": [{"level": "td", "n_groups": groups.n_groups}],
         "mean_value": float(V.mean()) if batch.n_steps else 0.0},
    )  # fmt: skip
