"""Context keys of Eq. (3) for every level k = 0..K, and the level groups' advantages (Eq. 6).

The hierarchy is computed in chunks of whole rollout groups (a group never crosses a rollout
group, so chunking is exact): the cost is linear in the number of steps and the temporaries
stay the size of a chunk. Within a chunk, level k refines level k - 1 by the state k steps
back; a step alone in its level-(k-1) group stays alone at every deeper level (Eq. 5: the
groups are nested), so only the steps of shared groups are sorted again, and deep levels,
which are mostly singletons, cost little.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from hgpo.batch import StepBatch
from hgpo.branched_batch import lookback_rows
from hgpo.config import CHOICES, check_K
from hgpo.groups import dense_rank, segment_normalise
from hgpo.options import check_bool, check_choice, check_int, check_number
from hgpo.returns import check_batch, check_step_values

__all__ = [
    "CHUNK_ROWS",
    "EARLY_RULES",
    "Hierarchy",
    "context_keys",
    "hierarchy",
]

EARLY_RULES = ("paper", "drop")
CHUNK_ROWS = 1 << 16
"""Rows per chunk (whole rollout groups; a larger rollout group is one chunk). 2^16 rows keep a
chunk's arrays in the caches; the result does not depend on it."""
_RADIX = 1 << 16  # keys below this sort as uint16 with numpy's O(n) radix sort
_PACK = 1 << 31  # codes below this pack in pairs into int64 without overflow


@dataclass(frozen=True)
class Hierarchy:
    """The level groups G_0 ... G_K of every step and, given returns, A_k of Eq. (6).

    Attributes:
        ids: int64[K + 1, n] dense level-k group id of each step (0..n_groups_k - 1), -1 for
            a step left out of level k (``early="drop"`` and t < k).
        n_groups: int64[K + 1] groups per level.
        step_size_hist: K + 1 arrays, ``step_size_hist[k][s]``: the number of steps whose
            level-k group has s members.
        advantages: float64[K + 1, n] or None, R_t normalised within G_k (0 where the step is
            alone, left out, or its group is tied).
        informative: bool[K + 1, n] or None, the step's group has >= 2 members whose returns
            are not all equal.
    """

    ids: np.ndarray
    n_groups: np.ndarray
    step_size_hist: list[np.ndarray]
    advantages: np.ndarray | None = None
    informative: np.ndarray | None = None

    def size_of_row(self, k: int) -> np.ndarray:
        """int64[n] size of each step's level-k group, 0 for steps left out."""
        ids = self.ids[k]
        out = np.zeros(ids.shape[0], dtype=np.int64)
        member = ids >= 0
        out[member] = np.bincount(ids[member], minlength=int(self.n_groups[k]))[ids[member]]
        return out


def _check(K: object, early: str) -> int:
    """K as an int, checked before anything is allocated (the outputs are (K + 1) x n)."""
    check_choice("early", early, EARLY_RULES)
    return check_K("K", K)


def _codes(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Non-negative integer codes of ``x`` (equal values, equal codes) and their bound:
    x - min when the range is small enough to pack, dense ranks otherwise."""
    lo, hi = int(x.min()), int(x.max())
    if hi - lo < _PACK:
        return x - lo, hi - lo + 1
    return dense_rank(x)


def _sort(key: np.ndarray, bound: int) -> np.ndarray:
    """Indices that sort ``key`` (values in [0, bound)); any order within equal keys."""
    if bound <= _RADIX:
        return np.argsort(key.astype(np.uint16), kind="stable")
    return np.argsort(key)


def _chunks(batch: StepBatch, chunk_rows: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(perm, bounds): rows ``perm[bounds[c]:bounds[c + 1]]`` (or that slice when perm is None)
    are chunk c, made of whole rollout groups with their trajectories contiguous and ordered."""
    n = batch.n_steps
    if n <= chunk_rows:
        return None, np.array([0, n], dtype=np.int64)
    tg = batch.group[batch.traj_start]
    run_start = np.flatnonzero(np.concatenate(([True], tg[1:] != tg[:-1])))
    perm = None
    if np.unique(tg[run_start]).size != run_start.size:  # a rollout group is split: regroup
        torder = np.argsort(tg, kind="stable")
        lens = batch.traj_len[torder]
        first = np.cumsum(lens) - lens
        perm = np.repeat(batch.traj_start[torder] - first, lens) + np.arange(n, dtype=np.int64)
        tg = tg[torder]
        run_start = np.flatnonzero(np.concatenate(([True], tg[1:] != tg[:-1])))
        lens_sorted = lens
    else:
        lens_sorted = batch.traj_len
    traj_row = np.concatenate(([0], np.cumsum(lens_sorted)))
    group_row = traj_row[run_start]  # first row of each rollout group, ascending
    cuts = np.searchsorted(group_row, np.arange(chunk_rows, n, chunk_rows, dtype=np.int64))
    bounds = np.unique(np.concatenate(([0], group_row[np.minimum(cuts, group_row.size - 1)], [n])))
    return perm, bounds


def hierarchy(
    batch: StepBatch,
    K: int,
    returns: np.ndarray | None = None,
    *,
    include_actions: bool = False,
    early: str = "paper",
    norm: str = "mean_std",
    std: str = "population",
    eps: float = 1e-6,
    leave_one_out: bool = False,
    chunk_rows: int | None = None,
) -> Hierarchy:
    """Level groups G_k (Eq. 4) of every step for k = 0..K and, given ``returns``, A_k (Eq. 6).

    Eq. (3): C_k(s_t) = (s_{t-k}, ..., s_t) when t >= k, else (s_0, ..., s_t). Two steps share a
    level-k group iff they are in the same rollout group and their C_k are equal as whole
    sequences (length included). With ``include_actions`` the past actions enter too:
    (s_{t-k}, a_{t-k}, ..., s_{t-1}, a_{t-1}, s_t), as in the memory-module prompt.

    Args:
        batch: the steps.
        K: deepest level, >= 0.
        returns: float64[n] R_t to normalise within each group, or None for the groups only.
        include_actions: put past actions in the key (needs ``batch.action``).
        early: "paper" (t < k uses the shorter full history) or "drop" (the public reference
            code: a step with t < k is left out of level k).
        norm, std, eps: the normalisation of :func:`hgpo.groups.normalise`.
        leave_one_out: each step's baseline is the mean of the other members of its group
            (:func:`hgpo.groups.segment_normalise`).
        chunk_rows: rows per chunk of whole rollout groups (default ``CHUNK_ROWS``); the
            result does not depend on it beyond the numbering of the groups.

    Keys are exact, never hashed: level k refines level k - 1 by the pair (group_{k-1},
    s_{t-k}), a start-of-trajectory marker standing in for s_{t-k} when t < k, ranked by a
    sort, so no two different contexts can share a group.
    """
    K = _check(K, early)
    check_bool("include_actions", include_actions)
    check_choice("norm", norm, CHOICES["norm"])
    check_choice("std", std, CHOICES["std"])
    check_number("eps", eps, lo=0.0)
    check_bool("leave_one_out", leave_one_out)
    if chunk_rows is not None:
        check_int("chunk_rows", chunk_rows, lo=1)
    if returns is not None:
        returns = check_step_values(batch, returns, "returns")
    else:
        check_batch(batch)
    if include_actions and batch.action is None:
        raise ValueError("include_actions=True needs StepBatch.action, which is None")
    out = _Outputs.empty(K, batch.n_steps, returns is not None)
    back = None
    if batch.branches is not None:  # [branching] one chunk; contexts read across branch points
        perm, bounds = None, np.array([0, batch.n_steps], dtype=np.int64)
        back = lookback_rows(batch, K)
    else:
        perm, bounds = _chunks(batch, CHUNK_ROWS if chunk_rows is None else chunk_rows)
    for lo, hi in itertools.pairwise(bounds.tolist()):
        rows = slice(lo, hi) if perm is None else perm[lo:hi]
        _chunk(batch, rows, K, returns, include_actions, early, (norm, std, eps, leave_one_out),
               out, back)  # fmt: skip
    return Hierarchy(out.ids, out.offset, out.hist, out.A, out.info)


@dataclass
class _Outputs:
    """What :func:`hierarchy` fills chunk by chunk: ``ids``, ``A`` and ``info`` per (level,
    row) (see :class:`Hierarchy`), the size histogram per level and ``offset``, the groups
    numbered so far per level."""

    ids: np.ndarray
    A: np.ndarray | None
    info: np.ndarray | None
    hist: list[np.ndarray]
    offset: np.ndarray

    @classmethod
    def empty(cls, K: int, n: int, with_returns: bool) -> _Outputs:
        L = K + 1
        return cls(
            ids=np.empty((L, n), dtype=np.int64),  # every entry is written chunk by chunk
            A=np.zeros((L, n)) if with_returns else None,
            info=np.zeros((L, n), dtype=np.bool_) if with_returns else None,
            hist=[np.zeros(2, dtype=np.int64) for _ in range(L)],
            offset=np.zeros(L, dtype=np.int64),
        )


@dataclass(frozen=True)
class _Columns:
    """One chunk's columns as small codes (:func:`_codes`): rollout group ``g`` and state ``s``
    with their bounds, step ``t``, and ``past``, what a context holds per earlier step (s, or
    the pair (s, a) with ``include_actions``)."""

    g: np.ndarray
    g_n: int
    s: np.ndarray
    s_n: int
    t: np.ndarray
    past: np.ndarray
    past_n: int


@dataclass(frozen=True)
class _Shared:
    """The steps still to split at the next level: ``cand`` (chunk rows) whose group has >= 2
    members, ``prev`` that group's dense rank among such groups (``n_prev`` of them), and
    ``alone``, the steps alone at some level so far (alone at every deeper one, Eq. 5)."""

    cand: np.ndarray
    prev: np.ndarray
    n_prev: int
    alone: np.ndarray


@dataclass(frozen=True)
class _Groups:
    """One level's groups among the candidates: ``members`` (chunk rows) in key order,
    ``size`` per group and ``rank``, each member's group."""

    members: np.ndarray
    size: np.ndarray
    rank: np.ndarray


def _chunk(
    batch: StepBatch,
    rows: slice | np.ndarray,
    K: int,
    R: np.ndarray | None,
    include_actions: bool,
    early: str,
    norm_args: tuple[str, str, float, bool],
    out: _Outputs,
    back_rows: np.ndarray | None = None,
) -> None:
    """The hierarchy of one chunk of whole rollout groups, written into ``out``: level 0
    groups by (g, s_t), level k > 0 splits each shared level-(k-1) group by s_{t-k}.

    back_rows: int64[K + 1, n] the row of s_{t-k} of each step (branched batches, one chunk),
    or None: the row k before (trajectories contiguous).
    """
    cols = _columns(batch, rows, include_actions)
    x = R[rows] if R is not None else None
    glob = (lambda i: i + rows.start) if isinstance(rows, slice) else (lambda i: rows[i])
    m = cols.t.shape[0]
    everyone = np.arange(m, dtype=np.int64)  # level 0: every step, in one candidate group
    shared = _Shared(everyone, everyone, m, np.zeros(0, dtype=np.int64))
    for k in range(K + 1):
        if k == 0:
            key, bound = cols.g * cols.s_n + cols.s, cols.g_n * cols.s_n
        else:
            if early == "drop":
                shared = _drop_early(shared, cols.t, k, out, glob)
            key, bound = _refined_key(cols, shared, k, back_rows)
        groups = _group(key, bound, shared.cand)
        _record(out, k, groups, shared.alone, glob)
        shared = _still_shared(groups, shared.alone)
        if x is not None and shared.n_prev:
            _normalise(out, k, groups, shared, x, norm_args, glob)


def _columns(batch: StepBatch, rows: slice | np.ndarray, include_actions: bool) -> _Columns:
    g, g_n = _codes(batch.group[rows])
    s, s_n = _codes(batch.state[rows])
    if include_actions:
        a, a_n = _codes(batch.action[rows])
        past, past_n = _codes(s * a_n + a) if s_n * a_n >= _PACK else (s * a_n + a, s_n * a_n)
    else:
        past, past_n = s, s_n
    return _Columns(g, g_n, s, s_n, batch.step[rows], past, past_n)


def _drop_early(shared: _Shared, t: np.ndarray, k: int, out: _Outputs, glob) -> _Shared:
    """``early="drop"``: the steps with t < k leave level k and every deeper one (id -1)."""
    out.ids[k, glob(np.flatnonzero(t < k))] = -1
    keep = t[shared.cand] >= k
    return _Shared(
        shared.cand[keep], shared.prev[keep], shared.n_prev, shared.alone[t[shared.alone] >= k]
    )


def _refined_key(
    cols: _Columns, shared: _Shared, k: int, back_rows: np.ndarray | None
) -> tuple[np.ndarray, int]:
    """Level k's key of each candidate and its bound: its level-(k-1) group and its entry k
    steps back, plus one, or 0, the start-of-trajectory marker, when t < k."""
    cand = shared.cand
    back = cand - k if back_rows is None else back_rows[k, cand]
    shifted = np.where(cols.t[cand] >= k, cols.past[np.maximum(back, 0)] + 1, 0)
    return shared.prev * (cols.past_n + 1) + shifted, shared.n_prev * (cols.past_n + 1)


def _group(key: np.ndarray, bound: int, cand: np.ndarray) -> _Groups:
    """The candidates grouped by equal keys (a sort)."""
    order = _sort(key, bound)
    ks = key[order]
    boundary = np.empty(ks.shape[0], dtype=np.bool_)
    if ks.shape[0]:
        boundary[0] = True
        np.not_equal(ks[1:], ks[:-1], out=boundary[1:])
    starts = np.flatnonzero(boundary)
    size = np.diff(starts, append=ks.shape[0])
    return _Groups(cand[order], size, np.cumsum(boundary) - 1)


def _record(out: _Outputs, k: int, groups: _Groups, alone: np.ndarray, glob) -> None:
    """Level k's ids (the candidates' groups, then one group per step alone), its size
    histogram and its group count."""
    n_groups = groups.size.shape[0]
    out.ids[k, glob(groups.members)] = groups.rank + out.offset[k]
    out.ids[k, glob(alone)] = out.offset[k] + n_groups + np.arange(alone.shape[0])
    size = groups.size
    h = np.bincount(size, weights=size).astype(np.int64) if n_groups else np.zeros(0, np.int64)
    if h.shape[0] > out.hist[k].shape[0]:
        out.hist[k] = np.concatenate(
            (out.hist[k], np.zeros(h.shape[0] - out.hist[k].shape[0], np.int64))
        )
    out.hist[k][: h.shape[0]] += h
    out.hist[k][1] += alone.shape[0]
    out.offset[k] += n_groups + alone.shape[0]


def _still_shared(groups: _Groups, alone: np.ndarray) -> _Shared:
    """The next level's candidates: the members of groups with >= 2 members; the others join
    the steps alone."""
    multi = groups.size >= 2
    in_multi = multi[groups.rank]
    multi_rank = np.cumsum(multi) - 1
    return _Shared(
        cand=groups.members[in_multi],
        prev=multi_rank[groups.rank[in_multi]],
        n_prev=int(np.count_nonzero(multi)),
        alone=np.concatenate((alone, groups.members[~in_multi])),
    )


def _normalise(
    out: _Outputs,
    k: int,
    groups: _Groups,
    shared: _Shared,
    x: np.ndarray,
    norm_args: tuple[str, str, float, bool],
    glob,
) -> None:
    """A_k (Eq. 6) of the steps in level-k groups of >= 2 members: their returns normalised
    within the group, and whether the group is informative (returns not all equal)."""
    m_size = groups.size[groups.size >= 2]
    m_start = np.zeros(shared.n_prev, dtype=np.int64)
    np.cumsum(m_size[:-1], out=m_start[1:])
    vals, tied = segment_normalise(x[shared.cand], shared.prev, m_start, m_size, *norm_args)
    where = glob(shared.cand)
    out.A[k, where] = vals
    out.info[k, where] = ~tied[shared.prev]


def context_keys(
    batch: StepBatch, K: int, include_actions: bool = False, early: str = "paper"
) -> np.ndarray:
    """int64[K + 1, n]: row k the dense level-k group id of each step (-1 = left out).

    See :func:`hierarchy`: two steps share a level-k id iff they are in the same rollout group
    and their contexts C_k (Eq. 3) are equal; the ids are exact, never hashed.
    """
    return hierarchy(batch, K, include_actions=include_actions, early=early).ids
