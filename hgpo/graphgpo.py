"""GraphGPO: step credit from the state-transition graph of a rollout group.

Source: X. Cheng, S. He, L. Feng, H. Xu, M. Yan, L. Feng, B. An, "Beyond Trajectory-Level
Attribution: Graph-Based Credit Assignment for Agentic Reinforcement Learning" (GraphGPO,
ICML 2026, arXiv:2605.26684); code: verl-agent ``recipe/GraphGPO/core_graph.py``
(``ComplexGraph.from_data``, ``all_to_target_shortest_paths``, ``compute_graph_path_returns``,
``compute_graphgpo_outcome_advantage``) and ``recipe/GraphGPO/rollout_loop.py``
(``gather_rollout_data``: the goal), as added by verl-agent PR #256, commit
234a913609ef820de826f2276b7b912e4b8b8410 (read at zzj1111/alfworldauto@51c1a039, where
they are unchanged; the fork floatingstarZ/verl-agent@113f665 has the same recipe options
and defaults, but its core_graph.py was not available to compare).

The graph of rollout group g (one per group, never across groups):

- nodes: the group's states (``StepBatch.state`` keys), one goal node ``*`` of its own, and
  the states its failed trajectories ended in (``StepBatch.next_state`` of a last row);
- edges, one per step: s_t -> s'_t, the state the step led to: the next row's state, or
  after a trajectory's last step ``*`` if the episode succeeded (its return, environment
  rewards only, exceeds ``graph_success_return``: the authors' ``episode_rewards > 0``),
  else its terminal state ``next_state``. Directed, every edge of length 1;
- d(v): the fewest edges from v to ``*`` (Dijkstra from ``*`` on the reversed edges; d(*) =
  0); a node that cannot reach ``*`` gets D_g + 1, D_g the largest finite distance in the
  group (0 when no trajectory succeeded, so every node then gets 1).

Step return, with gamma = ``graph_gamma`` (``normalize_distance`` = ``graph_normalize_distance``)::

    R_t = 10 gamma^d(s'_t)                       (default: nearness of the next state)
    R_t = 10 gamma^(d(s'_t) - d(s_t) + 1)        (normalize_distance: progress of the step)

less ``invalid_penalty`` on an invalid step (subtracted from the step's own return under
either ``penalty_mode``: the return is not a sum of rewards through which to propagate it;
the authors' trainer subtracts 0.1 after computing it). Advantage (GiGPO's normalisation)::

    A_t = graph_step_weight * A^S_t + graph_episode_weight * A^E_t
    A^S_t = (R_t - mean_{G_0} R) [/ (std_{G_0} R + eps)]   G_0: same group, same state s_t
    A^E_t = Eq. (1), the episode return normalised in the rollout group (as grpo / gigpo)

with ``norm``, ``std``, ``eps``, ``leave_one_out`` for A^S and ``norm``, ``episode_std``,
``episode_pooling``, ``episode_singleton``, ``penalty_mode`` for A^E, as in ``gigpo``;
``hgpo.reference_config("graphgpo", env)`` gives the authors' settings.

Without ``StepBatch.next_state`` the state a failed trajectory ended in is unknown: it is
taken to be a state seen nowhere else in the group (a dead end, d = D_g + 1), which is the
authors' graph whenever that observation is none of the group's states; the result says
which in ``diagnostics["graph"]["terminal"]``. Not reproduced: the authors' optional merging
of similar observations (``enable_similarity``): give merged keys as ``state`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs, episode_advantage
from hgpo.groups import dense_rank
from hgpo.keys import hierarchy
from hgpo.options import check_number
from hgpo.returns import check_batch, check_finite, episode_returns

__all__ = ["GraphDistances", "graph_distances", "graph_returns", "graphgpo"]


@dataclass(frozen=True)
class GraphDistances:
    """Distances to the goal in each rollout group's graph, per step.

    Attributes:
        d_state: float64[n] d(s_t) of every step's state.
        d_next: float64[n] d(s'_t) of the state it led to (0: the goal).
        reaches_goal: bool[n] s'_t has a path to the goal (d_next is a true distance, not
            D_g + 1).
        success: bool[n_traj] the trajectory's return exceeds ``graph_success_return``.
        n_nodes: nodes of all the graphs, goals included.
        terminal: "next_state" (the batch gave the states failed trajectories ended in) or
            "dead_end" (it did not: each is taken as a state seen nowhere else).
    """

    d_state: np.ndarray
    d_next: np.ndarray
    reaches_goal: np.ndarray
    success: np.ndarray
    n_nodes: int
    terminal: str


def graph_distances(batch: StepBatch, success_return: float = 0.0) -> GraphDistances:
    """d(s_t) and d(s'_t) of every step (module docstring), all rollout groups at once.

    The graphs of all groups form one block-diagonal sparse graph (a node is a (group, state)
    pair, plus one goal per group); one multi-source Dijkstra (scipy.sparse.csgraph, unit
    edge lengths) from every goal on the reversed edges gives each node its distance to its
    own group's goal, since no edge crosses groups.
    """
    # (imported here: scipy.sparse.csgraph adds a third to ``import hgpo``'s time)
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    check_batch(batch)
    success_return = check_number("graph_success_return", success_return, lo=-1e12, hi=1e12)
    n = batch.n_steps
    last = batch.traj_start + batch.traj_len - 1
    success = episode_returns(batch) > success_return
    g, n_groups = dense_rank(batch.group)
    failed_last = last[~success]
    # Node keys (group, state), the failed trajectories' terminal states included.
    states = batch.state
    if batch.next_state is not None:
        states = np.concatenate([states, batch.next_state[failed_last]])
    s, n_states = dense_rank(states)
    node_group = np.concatenate([g, g[failed_last]]) if batch.next_state is not None else g
    node, n_nodes = dense_rank(node_group * n_states + s)  # sorted by group, then state
    goal = n_nodes + g  # the goal node of each row's group
    # Each step's edge s_t -> s'_t: the next row, the goal, a terminal state or (no
    # next_state) none, its s'_t a dead end.
    dst = np.empty(n, dtype=np.int64)
    dst[:-1] = node[1:n]
    dst[last] = -1
    dst[last[success]] = goal[last[success]]
    if batch.next_state is not None:
        dst[failed_last] = node[n:]
    src = np.arange(n, dtype=np.int64)[dst >= 0]
    total = n_nodes + n_groups
    rev = csr_matrix(
        (np.ones(src.size), (dst[src], node[src])), shape=(total, total), dtype=np.float64
    )
    dist = dijkstra(
        rev, directed=True, indices=np.arange(n_nodes, total), unweighted=True, min_only=True
    )[:n_nodes]
    reach = np.isfinite(dist)
    # D_g: the largest finite distance among group g's nodes (its goal's 0 included); node ids
    # run through the groups in order, so each group's nodes are one contiguous segment.
    nodes_group = np.empty(n_nodes, dtype=np.int64)
    nodes_group[node] = node_group
    starts = np.flatnonzero(np.r_[True, nodes_group[1:] != nodes_group[:-1]])
    d_max = np.maximum.reduceat(np.where(reach, dist, 0.0), starts)
    dist = np.where(reach, dist, d_max[nodes_group] + 1.0)
    to_node = (dst >= 0) & (dst < n_nodes)
    d_next = np.where(dst >= 0, 0.0, d_max[g] + 1.0)  # the goal, or a dead end
    d_next[to_node] = dist[dst[to_node]]
    reaches = dst >= n_nodes
    reaches[to_node] = reach[dst[to_node]]
    return GraphDistances(
        d_state=dist[node[:n]],
        d_next=d_next,
        reaches_goal=reaches,
        success=success,
        n_nodes=int(total),
        terminal="dead_end" if batch.next_state is None else "next_state",
    )


def graph_returns(batch: StepBatch, cfg: EstimatorConfig) -> tuple[np.ndarray, GraphDistances]:
    """float64[n] the step returns R_t of the module docstring, invalid-action penalty
    included, and the distances they came from."""
    gd = graph_distances(batch, cfg.graph_success_return)
    exponent = gd.d_next
    if cfg.graph_normalize_distance:
        exponent = gd.d_next - gd.d_state + 1.0  # >= 0: d(s_t) <= d(s'_t) + 1 on an edge
    R = 10.0 * np.power(cfg.graph_gamma, exponent)
    if batch.invalid is not None and cfg.invalid_penalty != 0.0:
        R = R - cfg.invalid_penalty * batch.invalid
    return R, gd


def _step_diagnostics(hist: np.ndarray, n_groups: int, n: int) -> dict:
    """The same-state groups' count, mean size and utilisation (share of steps in a group of
    >= 2 members), as the other estimators report a level."""
    members = int(hist.sum())
    single = int(hist[1]) if hist.size > 1 else 0
    return {
        "level": "0",
        "n_groups": int(n_groups),
        "mean_group_size": members / n_groups if n_groups else 0.0,
        "utilisation": (members - single) / n,
        "left_out": 1.0 - members / n,
        "step_size_hist": np.trim_zeros(hist, "b"),
    }


def graphgpo(
    batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
) -> Advantages:
    """GraphGPO (arXiv:2605.26684; verl-agent recipe/GraphGPO/core_graph.py @ 234a913):

        A_t = graph_step_weight * A^S_t + graph_episode_weight * A^E_t,
        A^S_t = R_t normalised within G_0 (same rollout group, same state s_t),
        R_t = 10 graph_gamma^d(s'_t)  [graph_normalize_distance: 10 graph_gamma^(d(s'_t) - d(s_t) + 1)]
              - invalid_penalty * invalid_t,
        A^E_t = the episode advantage of Eq. (1) (as gigpo's episode term),

    d(v) the number of transitions from v to the goal in the directed graph of the group's
    observed transitions, the goal being where every successful episode's last step leads;
    a node without a path to the goal gets the group's largest distance + 1 (see
    :mod:`hgpo.graphgpo`). ``returns`` holds R_t; ``level_advantages`` the rows A^S ("0")
    and A^E ("episode").
    """
    check_inputs("graphgpo", batch, cfg)
    if cfg.graph_step_weight == 0.0 and cfg.graph_episode_weight == 0.0:
        raise ValueError(
            "graphgpo: graph_step_weight and graph_episode_weight are both 0, so every "
            "advantage would be 0; give one of them a positive weight"
        )
    R, gd = graph_returns(batch, cfg)
    R = check_finite(batch, R, "graph return")
    h = hierarchy(batch, 0, R, norm=cfg.norm, std=cfg.std, eps=cfg.eps,
                  leave_one_out=cfg.leave_one_out)  # fmt: skip
    step_adv = h.advantages[0]
    ep, _ = episode_advantage(batch, cfg)
    adv = cfg.graph_step_weight * step_adv + cfg.graph_episode_weight * ep
    n = batch.n_steps
    diagnostics = {
        "levels": [
            _step_diagnostics(h.step_size_hist[0], int(h.n_groups[0]), n),
            {"level": "episode"},
        ],
        "graph": {
            "terminal": gd.terminal,
            "n_nodes": gd.n_nodes,
            "success_rate": float(gd.success.mean()),
            "reaches_goal": float(gd.reaches_goal.mean()),
            "mean_d_next": float(gd.d_next.mean()),
        },
    }
    return Advantages(
        adv,
        R,
        np.stack([step_adv, ep]),
        np.stack([h.ids[0], np.full(n, -1, dtype=np.int64)]),
        ("0", "episode"),
        diagnostics,
    )
