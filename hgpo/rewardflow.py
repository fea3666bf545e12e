"""RewardFlow: rewards propagated over the state graph of a rollout group, turned into dense
step rewards (potential differences), normalised among the steps from the same state.

Source: "RewardFlow: Topology-Aware Reward Propagation on State Graphs for Agentic RL with
Large Language Models", arXiv 2603.18859 (2026), and the authors' code tmlr-group/RewardFlow at commit
1cdead8ef1104fc56dbd8d6937de0b57c82cd047: ``rewardflow/core_rewardflow.py``
(``apply_rewardflow_propagation``, ``compute_rewardflow_outcome_advantage``,
``episode_norm_reward``, ``build_step_group``, ``step_norm_reward``),
``rewardflow/propagation.py`` (``propagate_reward_decay``),
``agent_system/multi_turn_rollout/utils.py`` (``extract_unique_states``, ``build_trajectory``,
``unique_trajectory``) and ``agent_system/environments/env_manager.py``
(``EnvironmentManagerBase.state_preprocess`` and ``clean_trajectory``).

The graph of rollout group g (one per group, never across groups):

- nodes: the group's states (``StepBatch.state`` keys) and the states its trajectories ended
  in (``StepBatch.next_state`` of a last row; without that column each trajectory ends in a
  state of its own, seen nowhere else);
- edges: every step's transition s_t -> s'_t (s'_t the next row's state, or after the last
  row the terminal state) except self-loops (s'_t = s_t), which the authors' cleaning drops;
- node reward r(v): the reward of the transition *into* v at v's first appearance in the
  group's edge list (trajectories in batch order, steps in order, the source before the
  target): r_{t-1} for the state of step t (0 for a trajectory's first state), r_{T-1} for
  the terminal state. A state that only self-loops is not a node: its value is 0.

Propagation (``propagate_reward_decay``, Jacobi iterations from V_0 = r)::

    V_{k+1}(v) = max(V_k(v), gamma * max_{v -> u} V_k(u)),   k < rewardflow_max_iter

stopped early once V_{k+1} = V_k (then it stays so: the same numbers as all iterations).
Dense step reward and advantage (``compute_rewardflow_outcome_advantage``)::

    d_t = V(s'_t) - V(s_t) - invalid_penalty * invalid_t
    A_t = A^E_t + rewardflow_step_weight * (d_t - mean_{G_0} d) [/ (std_{G_0} d + eps)]

G_0 the steps of the same rollout group and the same state s_t (GiGPO's step groups; a
singleton gives 0) with ``norm``, ``std``, ``eps``, ``leave_one_out``; A^E the episode
advantage of Eq. (1) with ``norm``, ``episode_std``, ``episode_pooling``,
``episode_singleton``, ``penalty_mode`` (the authors' ``episode_norm_reward`` is GiGPO's:
``reference_config("rewardflow")`` gives their settings, "mean" normalisation, every step row
pooled, sample std, a one-row group passing through).

How one batch maps the authors' setup (docs/estimators.md, "rewardflow"): their rollout
loop stops when every environment is done, so the batch's longest trajectories have no row
after their last step; for those their graph lacks the last transition and the last step
keeps its env reward as d_t. Here every trajectory's last transition is in the graph (the
terminal state from ``next_state``, or a state of its own). Their ALFWorld and WebShop
managers rewrite the observations into states (inventory appended, "You Won!") and drop
look / inventory / examine transitions before building the graph: give such keys as
``state``; only the generic manager's graph (raw anchor observations) is reproduced. A
branch (``StepBatch.parent``) adds its own transitions; the reward into its first state is
its parent's reward at the step before the branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs, episode_advantage, level_diagnostics
from hgpo.groups import dense_rank
from hgpo.keys import hierarchy
from hgpo.options import check_int, check_number
from hgpo.returns import check_batch, check_finite

__all__ = ["REWARDFLOW_SOURCE", "FlowValues", "flow_values", "rewardflow", "step_rewards"]

REWARDFLOW_SOURCE = "tmlr-group/RewardFlow@1cdead8ef1104fc56dbd8d6937de0b57c82cd047"
"""The commit of the authors' code this module follows (``rewardflow/core_rewardflow.py``)."""


@dataclass(frozen=True)
class FlowValues:
    """The propagated values of every step's states.

    Attributes:
        v_state: float64[n] V(s_t).
        v_next: float64[n] V(s'_t), the state the step led to.
        n_nodes: nodes of all the groups' graphs.
        n_edges: distinct edges (self-loops left out).
        iterations: the Jacobi iterations run (at most ``rewardflow_max_iter``).
        terminal: "next_state" (the batch gave the terminal states) or "own" (each
            trajectory ended in a state of its own).
    """

    v_state: np.ndarray
    v_next: np.ndarray
    n_nodes: int
    n_edges: int
    iterations: int
    terminal: str


def _nodes(batch: StepBatch) -> tuple[np.ndarray, np.ndarray, int]:
    """(int64[n] node of s_t, int64[n] node of s'_t, number of nodes); a node is a (rollout
    group, state) pair; a terminal state without ``next_state`` is a node of its own."""
    n, n_traj = batch.n_steps, batch.n_traj
    last = batch.traj_start + batch.traj_len - 1
    g, _ = dense_rank(batch.group)
    states, groups = batch.state, g
    if batch.next_state is not None:
        states = np.concatenate([states, batch.next_state[last]])
        groups = np.concatenate([g, g[last]])
    s, n_states = dense_rank(states)
    node, n_nodes = dense_rank(groups * n_states + s)
    nxt = np.empty(n, dtype=np.int64)
    nxt[:-1] = node[1:n]
    if batch.next_state is not None:
        nxt[last] = node[n:]
    else:
        nxt[last] = n_nodes + np.arange(n_traj, dtype=np.int64)
        n_nodes += n_traj
    return node[:n], nxt, int(n_nodes)


def _reward_in(batch: StepBatch) -> np.ndarray:
    """float64[n] the reward of the transition into each step's state: r_{t-1}, 0 for a
    trajectory's first state, the parent's reward at step b - 1 for a branch's first."""
    rin = np.empty(batch.n_steps)
    rin[1:] = batch.reward[:-1]
    rin[batch.traj_start] = 0.0
    br = batch.branches
    if br is not None:  # [branching]
        k = np.flatnonzero(br.parent >= 0)
        rin[br.first[k]] = batch.reward[br.row_at(br.parent[k], br.branch_step[k] - 1)]
    return rin


def _node_rewards(
    batch: StepBatch, node: np.ndarray, nxt: np.ndarray, loop: np.ndarray, n_nodes: int
) -> np.ndarray:
    """float64[n_nodes] r(v): the incoming reward at v's first position that a kept edge
    touches (positions ordered by trajectory, then step, the terminal last; 0 if none)."""
    n, n_traj = batch.n_steps, batch.n_traj
    last = batch.traj_start + batch.traj_len - 1
    is_start = np.zeros(n, dtype=np.bool_)
    is_start[batch.traj_start] = True
    touched = ~loop
    touched[1:] |= ~loop[:-1] & ~is_start[1:]
    # interleaved positions: row i at i + traj_index[i], the terminal of k at last_k + k + 1
    pos_node = np.empty(n + n_traj, dtype=np.int64)
    pos_r = np.empty(n + n_traj)
    pos_ok = np.empty(n + n_traj, dtype=np.bool_)
    rows = np.arange(n, dtype=np.int64) + batch.traj_index
    ends = last + np.arange(1, n_traj + 1, dtype=np.int64)
    pos_node[rows], pos_node[ends] = node, nxt[last]
    pos_r[rows], pos_r[ends] = _reward_in(batch), batch.reward[last]
    pos_ok[rows], pos_ok[ends] = touched, ~loop[last]
    first_node, first_at = np.unique(pos_node[pos_ok], return_index=True)
    r = np.zeros(n_nodes)
    r[first_node] = pos_r[pos_ok][first_at]
    return r


def flow_values(batch: StepBatch, gamma: float, max_iter: int = 1000) -> FlowValues:
    """V(s_t) and V(s'_t) of every step (module docstring), all rollout groups at once: the
    groups' graphs are one graph whose edges never cross groups. Each iteration is a gather
    and a segment max over the distinct edges (sorted by source)."""
    check_batch(batch)
    gamma = check_number("rewardflow_gamma", gamma, lo=0.0, hi=1.0)
    max_iter = check_int("rewardflow_max_iter", max_iter, lo=1, hi=100_000)
    node, nxt, n_nodes = _nodes(batch)
    loop = node == nxt
    V = _node_rewards(batch, node, nxt, loop, n_nodes)
    pairs = np.unique(node[~loop] * n_nodes + nxt[~loop])  # sorted by source
    src, dst = pairs // n_nodes, pairs % n_nodes
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]]) if src.size else src
    heads = src[starts]
    it = 0
    while src.size and it < max_iter:
        best = np.maximum.reduceat(gamma * V[dst], starts)
        new = V.copy()
        new[heads] = np.maximum(V[heads], best)
        it += 1
        if np.array_equal(new, V):
            break
        V = new
    return FlowValues(
        V[node], V[nxt], n_nodes, int(src.size), it,
        "own" if batch.next_state is None else "next_state",
    )  # fmt: skip


def step_rewards(batch: StepBatch, cfg: EstimatorConfig) -> tuple[np.ndarray, FlowValues]:
    """float64[n] the dense step rewards d_t = V(s'_t) - V(s_t), less ``invalid_penalty`` on
    an invalid step (the authors subtract it from the step rewards after the propagation),
    and the values they came from."""
    fv = flow_values(batch, cfg.rewardflow_gamma, cfg.rewardflow_max_iter)
    d = fv.v_next - fv.v_state
    if batch.invalid is not None and cfg.invalid_penalty != 0.0:
        d = d - cfg.invalid_penalty * batch.invalid
    return check_finite(batch, d, "RewardFlow step reward"), fv


def rewardflow(
    batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
) -> Advantages:
    """RewardFlow (arXiv 2603.18859; tmlr-group/RewardFlow@1cdead8, rewardflow/):

        A_t = A^E_t + rewardflow_step_weight * (d_t - mean_{G_0} d) [/ (std_{G_0} d + eps)],
        d_t = V(s'_t) - V(s_t) - invalid_penalty * invalid_t,
        V = the fixed point (or ``rewardflow_max_iter`` Jacobi iterations) of
            V(v) = max(r(v), rewardflow_gamma * max_{v -> u} V(u)) from V = r,

    over the directed graph of the rollout group's observed transitions (self-loops dropped),
    r(v) the reward of the transition into v at its first appearance; G_0 the steps of the
    same group and state s_t; A^E the episode advantage of Eq. (1) (see
    :mod:`hgpo.rewardflow`). ``returns`` holds d_t; ``level_advantages`` the rows of the step
    term ("0") and the episode term ("episode").
    """
    check_inputs("rewardflow", batch, cfg)
    d, fv = step_rewards(batch, cfg)
    h = hierarchy(batch, 0, d, norm=cfg.norm, std=cfg.std, eps=cfg.eps,
                  leave_one_out=cfg.leave_one_out)  # fmt: skip
    step_adv = h.advantages[0]
    ep, _ = episode_advantage(batch, cfg)
    adv = ep + cfg.rewardflow_step_weight * step_adv
    n = batch.n_steps
    diagnostics = level_diagnostics(h, n)
    diagnostics["levels"].append({"level": "episode"})
    diagnostics["rewardflow"] = {
        "terminal": fv.terminal, "n_nodes": fv.n_nodes, "n_edges": fv.n_edges,
        "iterations": fv.iterations, "v_state": fv.v_state, "v_next": fv.v_next,
    }  # fmt: skip
    return Advantages(
        adv,
        d,
        np.stack([step_adv, ep]),
        np.stack([h.ids[0], np.full(n, -1, dtype=np.int64)]),
        ("0", "episode"),
        diagnostics,
    )
