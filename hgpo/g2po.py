"""G2PO: group-aggregated state values on the rollout group's state graph, edge advantages.

Source: Y. Wang, M. Song, Z. Zhang, S. Huang, H. Huang, F. Wei, W. Deng, F. Sun, Q. Zhang,
"Group-Graph Policy Optimization for Long-Horizon Agentic Reinforcement Learning" (G2PO,
arXiv:2606.22995); code: Nala-YN/G2PO commit b8ffaf56ad241ce73507908e6ed30209cafd324d,
``g2po/core_g2po.py`` (blob 74936220786430f6c2a63cecb3ced307b4c01826:
``compute_group_aggregation_values``, ``compute_step_level_advantage``,
``episode_norm_reward``, ``compute_g2po_outcome_advantage``), called from
``verl/trainer/ppo/ray_trainer.py`` (verl-agent's trainer; the episode reward at the last
token of every step row, less 0.1 per invalid action). This module follows the code; where
the abstract's wording ("TD errors standardised over the whole graph") reads differently,
the code is what is reproduced (below).

The graph of rollout group g (never across groups): one node per state (``StepBatch.state``
key) the group's steps visit; each step is an edge from its state to the next row's state,
or after a trajectory's last step to a terminal node, "success" when the episode return
(environment rewards, without the invalid-action penalty) is at least ``g2po_success_return``
(the authors: ``episode_rewards == 10``), else "failure". With gamma = ``g2po_gamma``:

    V(s)  = mean over the visits (g, s) of gamma^(T - t) R(tau)     (group-aggregated value)
            T - t: the rows from the visit to its trajectory's end, the visit included;
            R(tau): the visiting trajectory's episode return
    V'_t  = V(s_{t+1}); after the last step g2po_success_return (success) or 0 (failure)
    A^S_t = (V'_t - invalid_penalty * invalid_t) normalised within (group, s_t)
    A^D_t = (V'_t - V(s_t)) normalised over all the steps of the group (the "TD error" of the
            abstract: gamma enters through V, the terminal value stands in for the reward)
    A^E_t = the episode advantage, Eq. (1) as in gigpo
    A_t   = A^E_t + g2po_step_weight * (A^S_t + A^D_t)

``norm``, ``std``, ``eps`` normalise A^S and A^D (a one-member group gives 0); A^E uses the
episode options as gigpo. ``reference_config("g2po", env)`` gives the authors' settings
("mean_std" and sample std as their run scripts; every step row pooled in A^E).

Not reproduced, or chosen: the authors' success test is an exact ``== 10`` and their terminal
value the same constant: here success is ``>=`` the threshold (the same on ALFWorld's 0/10
returns; a return above it is a failure for them). A rollout group of one step row gives
their code a NaN (torch's std of one value); here A^D is 0. Branches (``StepBatch.parent``)
use the virtual episode's return R(tau). ``StepBatch.next_state`` is not read (the authors'
graph does not hold the observation after the last step).
"""

from __future__ import annotations

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs, episode_advantage
from hgpo.groups import dense_rank, group_by, key_means, normalise, sorted_within
from hgpo.returns import check_batch, check_finite, episode_returns

__all__ = ["g2po", "g2po_values"]


def _state_nodes(batch: StepBatch) -> tuple[np.ndarray, np.ndarray, int]:
    """(node, group rank) per row and the number of nodes: a node is a (group, state) pair."""
    g, _ = dense_rank(batch.group)
    s, n_states = dense_rank(batch.state)
    node, n_nodes = dense_rank(g * n_states + s)
    return node, g, n_nodes


def g2po_values(batch: StepBatch, cfg: EstimatorConfig) -> tuple[np.ndarray, np.ndarray]:
    """(V(s_t), V'_t) of every step, float64[n] each (module docstring)."""
    check_batch(batch)
    n = batch.n_steps
    last = batch.traj_start + batch.traj_len - 1
    ret = episode_returns(batch)
    to_end = (last[batch.traj_index] - np.arange(n, dtype=np.int64) + 1).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        disc = np.power(cfg.g2po_gamma, to_end) * ret[batch.traj_index]
    node, _, n_nodes = _state_nodes(batch)
    V = key_means(node, n_nodes, disc)[node]
    V = check_finite(batch, V, "g2po state value")
    V_next = np.empty(n, dtype=np.float64)
    V_next[:-1] = V[1:]
    goal = float(cfg.g2po_success_return)
    V_next[last] = np.where(ret >= goal, goal, 0.0)
    return V, V_next


def g2po(batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None) -> Advantages:
    """G2PO (arXiv:2606.22995; Nala-YN/G2PO@b8ffaf5 g2po/core_g2po.py):

        A_t = A^E_t + g2po_step_weight * (A^S_t + A^D_t),
        A^S_t = V(s_{t+1}) - invalid_penalty * invalid_t, normalised within (group, s_t),
        A^D_t = V(s_{t+1}) - V(s_t), normalised over the rollout group's steps,
        V(s) = mean over the group's visits of s of g2po_gamma^(T - t) R(tau),

    the successor of a trajectory's last step a terminal node worth ``g2po_success_return``
    (success) or 0 (see :mod:`hgpo.g2po`). ``returns`` holds V(s_{t+1}); ``level_advantages``
    the rows A^S ("state"), A^D ("edge") and A^E ("episode").
    """
    check_inputs("g2po", batch, cfg)
    V, V_next = g2po_values(batch, cfg)
    x = V_next
    if batch.invalid is not None and cfg.invalid_penalty != 0.0:
        with np.errstate(over="ignore", invalid="ignore"):
            x = V_next - cfg.invalid_penalty * batch.invalid
    with np.errstate(over="ignore", invalid="ignore"):
        gain = V_next - V
    x = check_finite(batch, x, "g2po next-state value")
    gain = check_finite(batch, gain, "g2po value gain")
    node, g, _ = _state_nodes(batch)
    by_state = group_by(node)
    a_state, _ = normalise(sorted_within(by_state, x), x, cfg.norm, cfg.std, cfg.eps)
    a_edge, _ = normalise(sorted_within(group_by(g), gain), gain, cfg.norm, cfg.std, cfg.eps)
    ep, _ = episode_advantage(batch, cfg)
    with np.errstate(over="ignore", invalid="ignore"):
        adv = ep + cfg.g2po_step_weight * (a_state + a_edge)
    adv = check_finite(batch, adv, "g2po advantage")
    n = batch.n_steps
    sizes = by_state.size_of_row()
    diagnostics = {
        "levels": [{"level": "state", "n_groups": by_state.n_groups,
                    "utilisation": float((sizes >= 2).mean()) if n else 0.0},
                   {"level": "edge"}, {"level": "episode"}],
        "mean_value": float(V.mean()) if n else 0.0,
    }  # fmt: skip
    return Advantages(
        adv,
        V_next,
        np.stack([a_state, a_edge, ep]),
        np.stack([by_state.ids, g, np.full(n, -1, dtype=np.int64)]),
        ("state", "edge", "episode"),
        diagnostics,
    )
