"""Branched batches: a trajectory may continue another one's prefix instead of starting anew.

A simulator can restart from any visited state with its full context. A *branch* of
trajectory p at step b (1 <= b <= T_p - 1, T_p the length of p's full trajectory) replays
nothing: the environment is restored to where p stood before acting at step b, so the branch
shares p's steps 0..b-1 (states, actions, rewards) and its state s_b, and takes its own action
from there. In a :class:`hgpo.StepBatch` a branch carries only its *own* rows, steps b..T-1
(``step`` starts at b), and ``parent`` names p; the shared prefix stays with p and is never a
sample twice.

The *virtual full trajectory* of trajectory i is

    V(i) = (own rows of i)                          if i is a root (parent -1, starts at 0),
    V(i) = V(p)[0:b] followed by the own rows of i  if i branches from p at step b.

Every quantity an estimator reads is defined on V(i) for the own rows of i only:

- step return R_t = sum_{j >= t} gamma^(j - t) r_j: only steps j >= t >= b enter, all own;
- episode return R(tau_i) = sum_{t < T_i} r_t over V(i): the parent's prefix rewards r_0..r_{b-1}
  plus the branch's own (Eq. (1) compares whole episodes);
- context C_k(s_t) = (s_{t-k}, ..., s_t) read on V(i) (Eq. (3)): at t = b the branch's context
  is the parent's context at b, so the branch's first step falls in the parent's level-K group
  at step b, which is what branching is for.

The episode-level groups (GRPO, RLOO, GiGPO's episode term) have one member per trajectory,
branches included; a step's advantage is given to its own rows only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

__all__ = [
    "BranchLayout",
    "BranchedRows",
    "bad_parent_change",
    "branch_layout",
    "lookback_rows",
    "virtual_episode_returns",
]


@dataclass(frozen=True)
class BranchLayout:
    """Where the rows of every virtual full trajectory lie (n_traj trajectories, n rows).

    Attributes:
        parent: int64[n_traj] dense index of each trajectory's parent, -1 for a root.
        branch_step: int64[n_traj] the step of its first own row (0 for a root).
        virtual_len: int64[n_traj] length of V(i) (the step after its last).
        first: int64[n_traj] the row of its first own step.
        virtual_rows: int64[n_traj, T_max] row of step t of V(i), -1 past its end; built on
            first use (the estimators need it, building the batch does not).
    """

    parent: np.ndarray
    branch_step: np.ndarray
    virtual_len: np.ndarray
    first: np.ndarray

    @cached_property
    def virtual_rows(self) -> np.ndarray:
        return _virtual_rows(self.parent, self.branch_step, self.virtual_len, self.first)

    def row_at(self, j: np.ndarray, t: np.ndarray) -> np.ndarray:
        """int64 row of step t of V(j) (t < virtual_len[j]), by climbing to the owner of step t:
        one vector step per level of branching, over the queried pairs only."""
        own = np.asarray(j, dtype=np.int64).copy()
        t = np.asarray(t, dtype=np.int64)
        while True:
            up = t < self.branch_step[own]
            if not up.any():
                return self.first[own] + t - self.branch_step[own]
            own[up] = self.parent[own[up]]

    @property
    def n_branches(self) -> int:
        return int(np.count_nonzero(self.parent >= 0))


def branch_layout(
    parent_row: np.ndarray,
    traj: np.ndarray,
    group: np.ndarray,
    state: np.ndarray,
    step: np.ndarray,
    traj_start: np.ndarray,
    traj_len: np.ndarray,
    ids_rise: bool,
) -> BranchLayout | None:
    """Check the parent pointers of a batch and lay out its virtual full trajectories (None
    when every trajectory is a root: an ordinary batch, whose roots start at step 0).

    Args:
        parent_row: int64[n] traj id of each row's parent trajectory, -1 for a root, constant
            within a trajectory (checked by the batch).
        traj, group, state, step: the batch's columns; traj_start, traj_len: its segments;
        ids_rise: the trajectory ids rise from one trajectory to the next.

    Raises:
        ValueError naming the row and value when a parent pointer is below -1, names no
        earlier trajectory, crosses a rollout group, or the branch step lies outside
        1..T_p - 1 or the branch's first state differs from the parent's state at that step.
    """
    first = traj_start
    p_id = parent_row[first]
    if p_id.min() < -1:
        i = int(first[np.flatnonzero(p_id < -1)[0]])
        raise ValueError(
            f"StepBatch.parent[{i}] is {parent_row[i]}: a parent is a trajectory id, or -1 "
            "for a root"
        )
    b = step[first]
    if p_id.max() < 0:  # no branch: an ordinary batch, whose trajectories start at step 0
        if (b != 0).any():
            _bad_root_start(int(first[np.flatnonzero(b != 0)[0]]), traj, step)
        return None
    index = np.arange(first.shape[0])
    parent = _dense_parents(p_id, traj[first], ids_rise, index)
    roots = parent < 0
    vlen = b + traj_len
    # The checks run over every trajectory at once (few numpy calls: this runs on every
    # branched batch), a root standing in for its own parent: a root starts at step 0, a
    # branch at a step 1..T_p - 1 of its parent (a root's b < vlen holds by itself).
    own = np.where(roots, index, parent)
    if not (((b > 0) != roots) & (b < vlen[own])).all():
        _bad_start(roots, b, vlen, parent, first, p_id, traj, step)
    layout = BranchLayout(parent, b, vlen, first)
    # The row of step b of V(p): p's own row when b is at or after p's branch step (every
    # rollout kernel branches so), else its owner's, found by climbing; a root's own first row.
    b_own = b[own]
    climb = bool((b < b_own).any())
    p_row = layout.row_at(own, b) if climb else first[own] + (b - b_own)
    # (a trajectory in its parent's group puts every ancestor in it: the snapshot's row too)
    g_first = group[first]
    if not ((g_first[own] == g_first) & (state[p_row] == state[first])).all():
        _bad_snapshot(roots, p_row, first, b, p_id, traj, group, state)
    return layout


def bad_parent_change(row: int, parent_row: np.ndarray, traj: np.ndarray, new: np.ndarray) -> None:
    """(error path of the batch's row checks) Row ``row`` continues a trajectory with another
    parent pointer than its first row's (``new``: bool[n - 1], row i + 1 starts a
    trajectory)."""
    starts = np.concatenate(([0], np.flatnonzero(new) + 1))
    start = int(starts[np.searchsorted(starts, row, side="right") - 1])
    raise ValueError(
        f"StepBatch.parent[{row}] is {parent_row[row]} but trajectory {traj[row]} started with "
        f"parent {parent_row[start]}: a trajectory has one parent"
    )


def _bad_root_start(row: int, traj: np.ndarray, step: np.ndarray) -> None:
    """(error path of branch_layout) A batch without branches in which a trajectory starts
    after step 0: the unbranched batch's messages."""
    if row == 0:
        raise ValueError(f"StepBatch.step[0] is {step[0]}; a trajectory must start at step 0")
    raise ValueError(
        f"StepBatch.step[{row}] is {step[row]} (traj {traj[row]}) after step "
        f"{step[row - 1]} (traj {traj[row - 1]}): the rows of a trajectory must be "
        "contiguous and ordered 0..T-1"
    )


def _bad_start(roots, b, vlen, parent, first, p_id, traj, step) -> None:
    """(error path of branch_layout) A root that starts after step 0, else a branch whose
    step lies outside its parent's trajectory."""
    if (roots & (b != 0)).any():
        row = int(first[np.flatnonzero(roots & (b != 0))[0]])
        raise ValueError(
            f"StepBatch.step[{row}] is {step[row]} at the start of trajectory {traj[row]}, "
            "which has no parent: only a branch may start after step 0"
        )
    br = np.flatnonzero(~roots)
    out_of_range = (b[br] < 1) | (b[br] > vlen[parent[br]] - 1)
    j = int(br[np.flatnonzero(out_of_range)[0]])
    raise ValueError(
        f"{_where(first[j], p_id[j], traj)}: it starts at step {b[j]}, a branch must start "
        f"at a step 1..{vlen[parent[j]] - 1} of its parent's trajectory"
    )


def _bad_snapshot(roots, p_row, first, b, p_id, traj, group, state) -> None:
    """(error path of branch_layout) A branch in another group than its parent (named
    first), else one whose first state is not its parent's at the branch step."""
    br = np.flatnonzero(~roots)
    p_row, f_br = p_row[br], first[br]
    bad_group = group[p_row] != group[f_br]
    k = int(np.flatnonzero(bad_group if bad_group.any() else state[p_row] != state[f_br])[0])
    row = int(f_br[k])
    if bad_group.any():
        raise ValueError(
            f"{_where(row, p_id[br[k]], traj)}: the parent lies in group "
            f"{group[p_row[k]]}, not {group[row]}"
        )
    raise ValueError(
        f"{_where(row, p_id[br[k]], traj)}: its first state {state[row]} differs from "
        f"its parent's state {state[p_row[k]]} at step {b[br[k]]} (a branch restarts "
        "from the parent's snapshot)"
    )


def _where(row: int, parent_id: int, traj: np.ndarray) -> str:
    return f"StepBatch.parent[{row}] is {parent_id} (trajectory {traj[row]})"


def _dense_parents(
    p_id: np.ndarray, ids: np.ndarray, ids_rise: bool, index: np.ndarray
) -> np.ndarray:
    """int64[n_traj] dense index of each parent id (-1 for a root; ids >= -1, checked before);
    ValueError when a parent is not a trajectory listed earlier in the batch (so the pointers
    have no cycle)."""
    n_traj = ids.shape[0]
    if ids_rise and ids[0] == 0 and ids[-1] == n_traj - 1:
        parent = p_id  # ids 0..n_traj-1 in order (every rollout kernel): the index is the id
    else:
        order = np.argsort(ids, kind="stable")
        pos = np.minimum(np.searchsorted(ids[order], p_id), n_traj - 1)
        parent = np.where(ids[order][pos] == p_id, order[pos], n_traj)
        parent[p_id < 0] = -1
    bad = parent >= index  # also an id that names no trajectory (n_traj)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"StepBatch.parent is {p_id[j]} on trajectory {ids[j]}: a parent must be a "
            "trajectory listed earlier in the batch"
        )
    return parent


def _virtual_rows(
    parent: np.ndarray, b: np.ndarray, vlen: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """int64[n_traj, T_max] row of step t of V(j), -1 past its end.

    The owner of step t of V(j) is j when t >= b_j, else the owner of step t of V(parent_j):
    the map F(j, t) = (t < b_j ? parent_j : j) iterated to its fixed point, by doubling
    (F <- F(F, t), t fixed along a chain), so log2(depth of the deepest branch) passes.
    """
    n_traj, T = vlen.shape[0], int(vlen.max())
    t = np.arange(T)[None, :]
    j = np.arange(n_traj)[:, None]
    owner = np.where(t < b[:, None], parent[:, None], j)  # a root owns all (b = 0)
    # flat index owner * T + t: F(F(j, t), t) is one gather on the flattened table
    flat = (owner * T + t).ravel()
    while True:
        nxt = flat[flat]
        if np.array_equal(nxt, flat):
            break
        flat = nxt
    own = (flat // T).reshape(n_traj, T)
    rows = first[own] + t - b[own]
    rows[t >= vlen[:, None]] = -1
    return rows


class BranchedRows(Protocol):
    """What :func:`lookback_rows` and :func:`virtual_episode_returns` read of a branched
    :class:`hgpo.StepBatch` (batch.py builds the layout from this module, so this module names
    the slice it needs instead of importing the batch)."""

    @property
    def branches(self) -> BranchLayout | None: ...

    @property
    def traj_index(self) -> np.ndarray: ...

    @property
    def step(self) -> np.ndarray: ...

    @property
    def n_steps(self) -> int: ...


def lookback_rows(batch: BranchedRows, K: int) -> np.ndarray:
    """int64[K + 1, n]: row k holds the row of s_{t-k} on the step's virtual trajectory, -1
    where t < k (Eq. (3)'s context read across the branch point)."""
    lay = batch.branches
    assert lay is not None
    out = np.full((K + 1, batch.n_steps), -1, dtype=np.int64)
    ti, t = batch.traj_index, batch.step
    for k in range(K + 1):
        ok = t >= k
        out[k, ok] = lay.virtual_rows[ti[ok], t[ok] - k]
    return out


def virtual_episode_returns(batch: BranchedRows, rewards: np.ndarray) -> np.ndarray:
    """float64[n_traj] R(tau_i) = sum of the rewards of V(i), by the recursion from the last
    step back (the rounding of the unbranched :func:`hgpo.returns.episode_returns`)."""
    lay = batch.branches
    assert lay is not None
    vr = lay.virtual_rows
    table = np.where(vr >= 0, rewards[np.maximum(vr, 0)], 0.0)
    total = np.zeros(vr.shape[0])
    for j in range(vr.shape[1] - 1, -1, -1):
        total = table[:, j] + total  # past the end: r + 0.0 = r, as the recursion starts
    return total
