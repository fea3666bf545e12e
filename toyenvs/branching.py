"""Rollout schemes that branch from visited steps, at a budget counted in env steps.

A toy POMDP restarts exactly from any visited step: its *snapshot* is the hidden state s_t,
the policy's K-step context (the code of the step's full context, whose past part P holds the
last K (observation, action) pairs) and the step index t. The environment's randomness is a
stream per trajectory, so a branch draws its own future from a fresh stream. A branch shares
its parent's steps 0..b-1 and state s_b, hence its first step falls in the level-K group of the
step it branches from; it runs until it terminates (goal, trap or horizon). The batch is a
branched :class:`hgpo.StepBatch` (``parent`` column, see ``hgpo/branching.py``): the shared
prefix is a sample once.

Schemes (``toyenvs.rollout(..., scheme=..., steps=S, branch_budget=beta)``), per rollout group:

- ``independent``: roots only, until the group has used S env steps (without ``steps``:
  today's N independent rollouts);
- otherwise root rollouts until (1 - beta) S steps are used (at least one), then branches until
  S steps are used, each branch point drawn by a rule among the group's steps with t >= 1:
  ``branch:uniform`` uniformly; ``branch:singleton`` among steps whose level-K group (same
  K-step context) is still a singleton (consistency-aware rollouts, the paper's future work);
  ``branch:hard`` among the steps of the level-K group whose return-to-go (true reward,
  undiscounted) varies most (3SPO-like); ``tree:D1,D2,...`` at the set depths, the step with
  the fewest branches first (Tree-GRPO-like). A rule with no eligible step falls back to
  uniform, and to a new root when no step has t >= 1.

The last trajectory of a group may overshoot S by at most ``horizon - 1`` steps; the batch's
row count is the cost actually paid (compare schemes by it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from hgpo.batch import StepBatch
from hgpo.options import bad, check_int, check_number
from toyenvs import _kernels as kn
from toyenvs.core import POMDP

__all__ = ["RULES", "SCHEMES", "Scheme", "branch_arrays", "branched_rollout", "parse_scheme"]

RULES = ("independent", "branch:uniform", "branch:singleton", "branch:hard", "tree")
SCHEMES = ("independent", "branch:uniform", "branch:singleton", "branch:hard", "tree:D")
"""Scheme names; ``tree:D`` stands for ``tree:`` followed by comma-separated depths."""
_RULE_CODE = {name: i for i, name in enumerate(RULES)}
_STREAMS = 1 << 24  # random streams per rollout group: trajectory j draws from g * 2^24 + j
_CHOICE = _STREAMS - 1  # the group's stream for drawing branch points


@dataclass(frozen=True)
class Scheme:
    """A parsed rollout scheme: ``rule`` one of :data:`RULES`, ``depths`` for ``tree``."""

    rule: str
    depths: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"tree:{','.join(map(str, self.depths))}" if self.rule == "tree" else self.rule


def parse_scheme(text: str, horizon: int | None = None, where: str = "scheme") -> Scheme:
    """``"branch:singleton"`` -> Scheme; OptionError naming ``where`` and the scheme when it is
    unknown or a tree depth lies outside 1..horizon - 1."""
    if not isinstance(text, str):
        raise bad(where, "one of " + ", ".join(SCHEMES), text)
    if text.startswith("tree:"):
        parts = text[5:].split(",")
        if not all(p.strip().isdigit() for p in parts):
            raise bad(where, "tree:D with D comma-separated depths >= 1, e.g. tree:2,4", text)
        depths = tuple(sorted({int(p) for p in parts}))
        hi = None if horizon is None else horizon - 1
        for d in depths:
            check_int(f"{where} {text!r}: depth", d, lo=1, hi=hi)
        return Scheme("tree", depths)
    if text not in RULES or text == "tree":
        raise bad(where, "one of " + ", ".join(SCHEMES), text)
    return Scheme(text)


def check_budget(scheme: Scheme, steps: int | None, branch_budget: float) -> None:
    """Named errors for a step budget or branch share that cannot be used, before any work."""
    check_number("branch_budget", branch_budget, lo=0.0, hi=1.0, lo_open=True)
    if steps is None:
        if scheme.rule != "independent":
            raise bad(
                f"steps (scheme {scheme.name!r})", "an integer >= 1 env steps per group", None
            )
        return
    check_int("steps", steps, lo=1)


def branched_rollout(
    env: POMDP,
    pol: object,
    tasks: np.ndarray,
    seed: int,
    scheme: Scheme,
    steps: int,
    branch_budget: float,
) -> tuple[dict[str, np.ndarray], StepBatch]:
    """Run ``scheme`` on every task with ``steps`` env steps per group (checked arguments).

    Returns the raw columns (:func:`branch_arrays`) and the branched StepBatch. Trajectory j of
    group g draws from stream (seed, g * 2^24 + j).
    """
    res = branch_arrays(env, pol, tasks, seed, scheme, steps, branch_budget)
    batch = StepBatch(
        group=res["group"], traj=res["traj"], step=res["step"], reward=res["reward"],
        state=res["state"], action=res["action"], invalid=res["invalid"], parent=res["parent"],
    )  # fmt: skip
    return res, batch


_COLUMNS = (
    ("group", np.int64), ("traj", np.int64), ("parent", np.int64), ("step", np.int64),
    ("reward", np.float64), ("state", np.int64), ("action", np.int64), ("invalid", np.bool_),
    ("hidden", np.int64), ("context", np.int64),
)  # fmt: skip


def branch_arrays(
    env: POMDP,
    pol: object,
    tasks: np.ndarray,
    seed: int,
    scheme: Scheme,
    steps: int,
    branch_budget: float,
    kernel: Callable[..., tuple[int, int]] | None = None,
) -> dict[str, np.ndarray]:
    """The raw kernel output of :func:`branched_rollout` (the columns of
    :func:`toyenvs.rollout.rollout_arrays` plus ``parent``), without building a StepBatch.
    ``kernel``: :func:`branch_kernel` by default; the tests pass the one-at-a-time reference."""
    kernel = branch_kernel if kernel is None else kernel
    if scheme.rule == "independent":
        root_steps = steps
    else:
        root_steps = int(np.ceil((1.0 - branch_budget) * steps))
    at_depth = np.zeros(env.horizon + 1, dtype=np.bool_)
    at_depth[list(scheme.depths)] = True
    cap = tasks.size * (steps + env.horizon)
    K = pol.K  # type: ignore[attr-defined]
    pol.cover(env, tasks)  # type: ignore[attr-defined]  # a NeuralPolicy's table: every context
    out = {name: np.empty(cap, dtype) for name, dtype in _COLUMNS}
    keys = np.empty((K + 1, cap), np.int64)
    success = np.empty(cap, np.bool_)

    def call(tables: tuple) -> tuple[int, int]:
        return kernel(
            tasks, seed, env.horizon, K, pol.n_obs, pol.powM,  # type: ignore[attr-defined]
            env.obs_of_state, env.next_state, env.next_prob, env.invalid, env.reward_enter,
            env.terminal, *tables, steps, root_steps, _RULE_CODE[scheme.rule], at_depth,
            *out.values(), keys, success,
        )  # fmt: skip

    n, n_traj = pol.run_visited(call, lambda got: out["context"][: got[0]])  # type: ignore[attr-defined]
    res = {k: v[:n] for k, v in out.items()}
    res["context_keys"] = np.ascontiguousarray(keys[:, :n])
    res["success"] = success[:n_traj]
    return res


# --------------------------------------------------------------------------- kernels
#
# How the kernel is fast (same batch as the one-trajectory-at-a-time reference in
# tests/toyenvs/reference_branching.py, bit for bit):
# - Lanes. A group's trajectories run one after another (the next branch point depends on the
#   finished ones), but groups are independent: LANES groups are in flight at once and step in
#   turn, as in ``_kernels.rollout_kernel_fast``, so the table probes of different groups
#   overlap in the CPU. Group g writes its rows at the padded rows g * cap_g + i; :func:`compact`
#   then moves them to their place in group order and fills the columns the step loop does not
#   need.
# - No scans. Each rule's eligible steps are kept up to date (the "book" of each lane, below:
#   level-K counts as each step is taken, the rest as a trajectory ends), so a branch point
#   costs O(1) (uniform), O(rows / 64) (singleton: a bit per row, words skipped by their
#   popcount), one pass over the group's distinct level-K contexts (hard) or over its steps at
#   the tree depths (tree), not a pass over all its rows. The draw is the reference's: u from
#   the group's choice stream, the j = floor(u n)-th eligible row in row order.

W = kn.LANES  # groups in flight at once
INDEPENDENT, UNIFORM, SINGLETON, HARD, TREE = range(5)  # rule codes, the order of RULES
_TIE = 1e-12  # hard: level-K groups whose variance is within this of the largest tie

# The kernels' state lives in a few plain arrays with named fields, and the helpers are
# compiled without reference counting (_nrt=False) and inlined: numba pays an atomic
# increment and decrement for every array bound in a helper (or taken out of a tuple), which
# made the per-row and per-trajectory bookkeeping cost more than the env steps.
#
# lane: int64[W, 11], per lane: its group (-1: idle), the trajectory j being run, the group's
# rows so far and the row where j started, j's snapshot (t, hidden state, stream, past part P),
# the ring slot of P's oldest pair, j's parent (-1: a root) and the group's choice stream.
# ring: int64[W, max(K, 1)] the last K (observation, action) pairs, ring[w, pos] the oldest.
L_G, L_J, L_ROW, L_ROW0, L_T, L_S, L_ST, L_P, L_POS, L_PARENT, L_CST = range(11)
#
# The branch-point structures of each lane's group ("book"; rows are the group's local rows):
# The level-K group of a step is its full K-step context, which the step loop has already
# looked up in the policy's table: its row c there names the group, so no second hash table.
# dmap: int32[W, table capacity] the group's slot d of policy row c (-1: not met yet), slots
#   numbered 0, 1, ... in the order they are met; clear() resets only the entries it set.
# slots: int64[W, cap_g, 8] per slot d: CODE (the policy row c), CNT steps, FIRST row (while
#   CNT == 1 its only one), N1 steps with t >= 1, HEAD / TAIL of the list of those rows in row
#   order (linked by NXT); a slot's fields in one cache line.
# rows: int64[W, 8, cap_g + 1]: SLOT and NXT of each row, NCHILD branches taken from it (tree),
#   ONES (rows with t >= 1 in row order: uniform and every fallback), DEEP (rows at the
#   tree depths in row order), FLAGS one bit per row (64 to a word) of "t >= 1 and its slot's
#   CNT == 1" (singleton), TIED and MERGED scratch (hard: the tied slots, their rows).
# sums: float64[W, cap_g, 3]: SUM and SQ of the return-to-go over slot d's steps, VAR its
#   population variance as the reference computes it, -inf when N1 == 0.
# count: int64[W, 4]: ND (slots met), N_ONES, N_DEEP, N_SINGLE (set FLAGS bits).
CODE, CNT, FIRST, N1, HEAD, TAIL = range(6)
SLOT, NXT, NCHILD, ONES, DEEP, FLAGS, TIED, MERGED = range(8)
SUM, SQ, VAR = range(3)
ND, N_ONES, N_DEEP, N_SINGLE = range(4)
#
# trajs: int64[(W + n_groups) * steps, 4], trajectory j of lane w's group at w * steps + j: its
# LENGTH, PARENT j (-1: a root), FINAL hidden state and SUCCESS; copied when the group is done
# to the rows from W * steps on, in the order the groups finish (only the first pages of trajs
# are touched); groups: int64[n_groups, 3] each group's trajectories, rows and first record;
# next_group: int64[2] the next group to start and the next free record.
LENGTH, PARENT, FINAL, SUCCESS = range(4)


_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_ONE = np.uint64(1)


@njit(cache=True, _nrt=False, inline="always")
def _popcount(x):
    """Set bits of a uint64 (SWAR)."""
    x = x - ((x >> _ONE) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return np.int64((x * _H01) >> np.uint64(56))


@njit(cache=True, _nrt=False, inline="always")
def _flag(rows, w, r, on):
    """Set (on) or clear row r's singleton flag: bit r % 64 of word r // 64 of FLAGS."""
    x = np.uint64(rows[w, FLAGS, r >> 6])
    bit = _ONE << np.uint64(r & 63)
    rows[w, FLAGS, r >> 6] = np.int64(x | bit if on else x & ~bit)


@njit(cache=True, _nrt=False, inline="always")
def _nth_flag(rows, w, j):
    """The row of the (j + 1)-th set flag in row order: whole words by their popcount, then
    the lowest set bits of the word that holds it."""
    i = 0
    while True:
        x = np.uint64(rows[w, FLAGS, i])
        c = _popcount(x)
        if j < c:
            for _ in range(j):
                x &= x - _ONE
            return i * 64 + _popcount((x & (~x + _ONE)) - _ONE)
        j -= c
        i += 1


@njit(cache=True, _nrt=False, inline="always")
def _slot(dmap, slots, sums, count, w, c):
    """Slot d of the level-K group of policy row c in lane w's group (a new one, empty, when
    the group meets c for the first time)."""
    d = np.int64(dmap[w, c])
    if d < 0:
        d = count[w, ND]
        count[w, ND] = d + 1
        dmap[w, c] = d
        slots[w, d, CODE], slots[w, d, CNT], slots[w, d, N1], slots[w, d, HEAD] = c, 0, 0, -1
        sums[w, d, SUM], sums[w, d, SQ], sums[w, d, VAR] = 0.0, 0.0, -np.inf
    return d


@njit(cache=True, _nrt=False, inline="always")
def _enter_step(dmap, slots, rows, sums, count, w, rule, r, t, c, base, o_step):
    """Count row r (step t, policy row c) in its level-K group, in row order when its
    trajectory has ended (the rules read the counts only then, so this is the reference's
    state at every branch point; a tight loop over one trajectory's rows costs less than the
    same lookups interleaved in the step loop). singleton: a group's row is a branch point
    while the group has one step and that step has t >= 1."""
    h = _slot(dmap, slots, sums, count, w, c)
    rows[w, SLOT, r] = h
    c = slots[w, h, CNT]
    slots[w, h, CNT] = c + 1
    if rule != SINGLETON:
        return
    if c == 0:
        slots[w, h, FIRST] = r
        if t >= 1:
            _flag(rows, w, r, True)
            count[w, N_SINGLE] += 1
    elif c == 1 and o_step[base + slots[w, h, FIRST]] >= 1:
        _flag(rows, w, slots[w, h, FIRST], False)
        count[w, N_SINGLE] -= 1


@njit(cache=True, _nrt=False, inline="always")
def _record_hard(slots, rows, sums, count, w, base, r0, r1, final, o_step, o_hidden,
                 o_action, invalid, reward_enter):  # fmt: skip
    """Enter rows r0..r1-1's return-to-go G_t = sum_{j >= t} (r_j - 0.1 invalid_j) in their
    level-K groups (slots found by :func:`_enter_step`; last row first, the reference's order
    of summation), then append their rows with t >= 1 to the groups' lists and refresh the
    touched groups' variances."""
    g = 0.0
    for r in range(r1 - 1, r0 - 1, -1):
        q = base + r
        s2 = o_hidden[q + 1] if r + 1 < r1 else final
        g += reward_enter[s2] - kn.INVALID_PENALTY * invalid[o_hidden[q], o_action[q]]
        h = rows[w, SLOT, r]
        sums[w, h, SUM] += g
        sums[w, h, SQ] += g * g
    for r in range(r0, r1):
        h = rows[w, SLOT, r]
        if o_step[base + r] >= 1:
            rows[w, NXT, r] = -1
            if slots[w, h, HEAD] < 0:
                slots[w, h, HEAD] = r
            else:
                rows[w, NXT, slots[w, h, TAIL]] = r
            slots[w, h, TAIL] = r
            slots[w, h, N1] += 1
        c = slots[w, h, CNT]
        m = sums[w, h, SUM] / c
        v = sums[w, h, SQ] / c - m * m if c >= 2 else 0.0
        sums[w, h, VAR] = v if slots[w, h, N1] > 0 else -np.inf


@njit(cache=True, _nrt=False, inline="always")
def record(dmap, slots, rows, sums, count, w, rule, base, r0, r1, final, at_depth, o_step,
           o_hidden, o_action, o_ctx, invalid, reward_enter):  # fmt: skip
    """Enter the rows r0..r1-1 of lane w's trajectory that just ended (at padded rows base + r)
    in the structures its rule reads."""
    if rule in (SINGLETON, HARD):
        for r in range(r0, r1):
            _enter_step(dmap, slots, rows, sums, count, w, rule, r, o_step[base + r],
                        o_ctx[base + r], base, o_step)  # fmt: skip
    for r in range(r0, r1):
        t = o_step[base + r]
        rows[w, NCHILD, r] = 0
        if t >= 1:
            rows[w, ONES, count[w, N_ONES]] = r
            count[w, N_ONES] += 1
            if at_depth[t]:
                rows[w, DEEP, count[w, N_DEEP]] = r
                count[w, N_DEEP] += 1
    if rule == HARD:
        _record_hard(slots, rows, sums, count, w, base, r0, r1, final, o_step, o_hidden,
                     o_action, invalid, reward_enter)  # fmt: skip


@njit(cache=True, _nrt=False, inline="always")
def _choose_hard(slots, rows, sums, count, w, cst):
    """hard: (row, stream, True) drawn uniformly among the steps with t >= 1 of the level-K
    groups whose variance is within _TIE of the largest; (-1, stream, False) when the largest
    is <= _TIE (no draw: the caller falls back to uniform)."""
    best = -np.inf  # one pass: the largest variance and the candidates within _TIE of it
    nc = 0
    for d in range(count[w, ND]):
        v = sums[w, d, VAR]
        if v >= best - _TIE:
            if v > best + _TIE:  # every earlier candidate is now out of the band
                nc = 0
            rows[w, TIED, nc] = d
            nc += 1
            best = max(best, v)
    if not best > _TIE:
        return -1, cst, False
    n = 0
    n_slots = 0
    only = -1
    for i in range(nc):  # the candidates within _TIE of the final largest
        d = rows[w, TIED, i]
        if sums[w, d, VAR] >= best - _TIE:
            rows[w, TIED, n_slots] = d
            only = d
            n += slots[w, only, N1]
            n_slots += 1
    cst, u = kn.rng_uniform(cst)
    j = min(np.int64(u * n), n - 1)
    r = slots[w, only, HEAD]
    if n_slots == 1:  # the usual case: walk the one group's list
        for _ in range(j):
            r = rows[w, NXT, r]
        return r, cst, True
    m = 0  # tied groups: their rows merged in row order (insertion sort into MERGED)
    for k in range(n_slots):
        r = slots[w, rows[w, TIED, k], HEAD]
        while r >= 0:
            i = m
            while i > 0 and rows[w, MERGED, i - 1] > r:
                rows[w, MERGED, i] = rows[w, MERGED, i - 1]
                i -= 1
            rows[w, MERGED, i] = r
            m += 1
            r = rows[w, NXT, r]
    return rows[w, MERGED, j], cst, True


@njit(cache=True, _nrt=False, inline="always")
def choose(slots, rows, sums, count, w, rule, cst):
    """The group's row to branch from by ``rule`` (-1: no step with t >= 1 yet, a new root),
    and the advanced choice stream. A rule with no eligible step falls back to uniform."""
    n_any = count[w, N_ONES]
    if n_any == 0:
        return -1, cst
    if rule == TREE:  # the fewest branches first, then the earliest row; no draw
        fewest = -1
        for i in range(count[w, N_DEEP]):
            r = rows[w, DEEP, i]
            if fewest < 0 or rows[w, NCHILD, r] < rows[w, NCHILD, fewest]:
                fewest = r
        if fewest >= 0:
            return fewest, cst
    elif rule == SINGLETON and count[w, N_SINGLE] > 0:
        n = count[w, N_SINGLE]
        cst, u = kn.rng_uniform(cst)
        return _nth_flag(rows, w, min(np.int64(u * n), n - 1)), cst
    elif rule == HARD:
        r, cst, ok = _choose_hard(slots, rows, sums, count, w, cst)
        if ok:
            return r, cst
    cst, u = kn.rng_uniform(cst)
    return rows[w, ONES, min(np.int64(u * n_any), n_any - 1)], cst


@njit(cache=True, _nrt=False, inline="always")
def clear(dmap, slots, rows, count, w):
    """Empty lane w's structures for its next group (the dmap entries it set; a slot's fields
    are reset when it is met again)."""
    for d in range(count[w, ND]):
        dmap[w, slots[w, d, CODE]] = -1
    if count[w, N_SINGLE] > 0:
        for i in range(rows.shape[2] // 64 + 1):
            rows[w, FLAGS, i] = 0
    for i in range(count.shape[1]):
        count[w, i] = 0


@njit(cache=True, _nrt=False, inline="always")
def begin(lane, ring, rows, w, r, seed, starts, K, M, n_obs, powM, cap_g, o_hidden, o_keys,
          o_step, o_traj):  # fmt: skip
    """Start lane w's next trajectory j of its group g from stream (seed, g * 2^24 + j): a
    root at the group's start state (r = -1) or a branch from the snapshot of local row r
    (hidden state, past part P of the full context, t)."""
    g = lane[w, L_G]
    lane[w, L_ST] = kn.stream_seed(seed, g * _STREAMS + lane[w, L_J])
    lane[w, L_ROW0] = lane[w, L_ROW]
    lane[w, L_POS] = 0
    if r < 0:
        lane[w, L_S], lane[w, L_P], lane[w, L_T], lane[w, L_PARENT] = starts[g], powM[K] - 1, 0, -1
        for k in range(K):
            ring[w, k] = M - 1
        return
    q = g * cap_g + r
    P = o_keys[K, q] // n_obs
    lane[w, L_S], lane[w, L_P], lane[w, L_T], lane[w, L_PARENT] = (
        o_hidden[q],
        P,
        o_step[q],
        o_traj[q],
    )
    rows[w, NCHILD, r] += 1
    for k in range(K):  # ring[w, k] is pair t-K+k: the oldest, most significant digit first
        ring[w, k] = (P // powM[K - 1 - k]) % M


@njit(cache=True, _nrt=False, inline="always")
def start_group(lane, ring, rows, next_group, w, seed, starts, K, M, n_obs, powM, cap_g,
                o_hidden, o_keys, o_step, o_traj):  # fmt: skip
    """Give lane w the next group (its first root); False when none is left."""
    g = next_group[0]
    if g >= starts.shape[0]:
        lane[w, L_G] = -1
        return False
    next_group[0] = g + 1
    lane[w, L_G], lane[w, L_J], lane[w, L_ROW] = g, 0, 0
    lane[w, L_CST] = kn.stream_seed(seed, g * _STREAMS + _CHOICE)
    begin(lane, ring, rows, w, -1, seed, starts, K, M, n_obs, powM, cap_g, o_hidden, o_keys,
          o_step, o_traj)  # fmt: skip
    return True


@njit(cache=True, _nrt=False)
def file_group(trajs, groups, next_group, w, g, n_traj, n_rows, steps):
    """Lane w's group g is done: copy its trajectory records (at w * steps) to trajs after
    those of the groups done before it (from W * steps on), and note where."""
    n_done = next_group[1]
    groups[g, 0], groups[g, 1], groups[g, 2] = n_traj, n_rows, n_done
    for i in range(n_traj):
        for f in range(4):
            trajs[n_done + i, f] = trajs[w * steps + i, f]
    next_group[1] = n_done + n_traj


@njit(cache=True, _nrt=False, inline="always")
def end_trajectory(lane, ring, dmap, slots, rows, sums, count, trajs, groups, next_group, w, s2,
                   success, seed, starts, steps, root_steps, rule, at_depth, n_obs, powM,
                   cap_g, invalid, reward_enter, o_hidden, o_action, o_ctx, o_keys, o_step,
                   o_traj):  # fmt: skip
    """Lane w's trajectory ended in s2: record it, then start the group's next trajectory
    (roots until root_steps rows, then branches until steps) or the next group. Returns False
    when the lane has nothing left to run."""
    K = powM.shape[0] - 1  # K and M are not arguments: numba inlines calls of <= 30
    M = (n_obs + 1) * (invalid.shape[1] + 1)
    g, j, r0, r1 = lane[w, L_G], lane[w, L_J], lane[w, L_ROW0], lane[w, L_ROW]
    k = w * steps + j  # the lane's records come first in trajs
    trajs[k, LENGTH], trajs[k, PARENT] = r1 - r0, lane[w, L_PARENT]
    trajs[k, FINAL], trajs[k, SUCCESS] = s2, success
    base = g * cap_g
    if rule != INDEPENDENT:
        for r in range(base + r0, base + r1):  # the parent id of a branch from these rows
            o_traj[r] = j
        record(dmap, slots, rows, sums, count, w, rule, base, r0, r1, s2, at_depth, o_step,
               o_hidden, o_action, o_ctx, invalid, reward_enter)  # fmt: skip
    lane[w, L_J] = j + 1
    if r1 < steps:
        r = -1
        if r1 >= root_steps:
            r, lane[w, L_CST] = choose(slots, rows, sums, count, w, rule, lane[w, L_CST])
        begin(lane, ring, rows, w, r, seed, starts, K, M, n_obs, powM, cap_g, o_hidden, o_keys,
              o_step, o_traj)  # fmt: skip
        return True
    file_group(trajs, groups, next_group, w, g, j + 1, r1, steps)
    clear(dmap, slots, rows, count, w)
    return start_group(lane, ring, rows, next_group, w, seed, starts, K, M, n_obs, powM, cap_g,
                       o_hidden, o_keys, o_step, o_traj)  # fmt: skip


@njit(cache=True)
def new_book(rule, cap_g, capacity):
    """(dmap, slots, rows, sums, count) of every lane, empty; the level-K structures only for
    the rules that read them (capacity: the policy table's rows)."""
    counted = rule in (SINGLETON, HARD)
    dmap = np.full((W, capacity if counted else 1), -1, np.int32)
    slots = np.empty((W, cap_g if counted else 1, 8), np.int64)
    rows = np.empty((W, 8, cap_g + 1), np.int64)
    rows[:, FLAGS] = 0
    sums = np.empty((W, cap_g if counted else 1, 3))
    return dmap, slots, rows, sums, np.zeros((W, 4), np.int64)


@njit(cache=True)
def branch_kernel(
    starts, seed, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    steps, root_steps, rule, at_depth,
    o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx,
    o_keys, o_success,
):  # fmt: skip
    """Every group: roots until ``root_steps`` rows (at least one), then branches by ``rule``
    until ``steps`` rows. Returns (rows, trajectories), or (-1, 0) when the table filled up.

    Outputs (capacity n_groups * (steps + horizon) rows) as ``rollout_kernel_fast``'s, plus
    ``o_parent`` (the parent's traj id, -1 for a root). The step loop is
    ``rollout_kernel_fast``'s (inline probe, draw and move; past part P from a ring of the last
    K pairs) over groups in lanes instead of trajectories; it records hidden state, action,
    dense row, t and the full context code at the group's padded rows.
    """
    A = next_state.shape[1]
    deterministic = True
    for x in next_prob[:, :, 0].ravel():
        if x < 1.0:
            deterministic = False
    n_groups = starts.shape[0]
    cap_g = steps + horizon
    dmap, slots, rows, sums, book_count = new_book(rule, cap_g, codes.shape[0])
    trajs = np.empty(((W + n_groups) * steps, 4), np.int64)  # touched from the start: few pages
    groups = np.empty((n_groups, 3), np.int64)
    lane = np.zeros((W, 11), np.int64)
    ring = np.zeros((W, max(K, 1)), np.int64)
    next_group = np.array([0, W * steps], np.int64)
    if not run_lanes(
        starts, seed, horizon, K, n_obs, powM, obs_of_state, next_state, next_prob, invalid,
        reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed,
        init_scale, inv_temp, steps, root_steps, rule, at_depth, deterministic, dmap, slots,
        rows, sums, book_count, trajs, groups, lane, ring, next_group, o_traj, o_step, o_action,
        o_hidden, o_ctx, o_keys,
    ):  # fmt: skip
        return -1, 0
    return compact(
        trajs, groups, steps, cap_g, K, n_obs, A, powM, obs_of_state, invalid, reward_enter,
        o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx,
        o_keys, o_success,
    )  # fmt: skip


@njit(cache=True, _nrt=False)
def run_lanes(
    starts, seed, horizon, K, n_obs, powM, obs_of_state, next_state, next_prob, invalid,
    reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
    inv_temp, steps, root_steps, rule, at_depth, deterministic, dmap, slots, rows, sums,
    book_count, trajs, groups, lane, ring, next_group, o_traj, o_step, o_action, o_hidden, o_ctx,
    o_keys,
):  # fmt: skip
    """The step loop of :func:`branch_kernel` over the lanes until every group is done;
    False when the policy table filled up. Compiled without reference counting (it allocates
    nothing), so the inlined bookkeeping costs no atomic operations."""
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    top = powM[K - 1] if K > 0 else np.int64(0)
    mask = np.uint64((htab.shape[0] >> 1) - 1)
    imask = np.int64(mask)
    cap_g = steps + horizon
    active = 0
    for w in range(W):
        active += start_group(lane, ring, rows, next_group, w, seed, starts, K, M, n_obs, powM,
                              cap_g, o_hidden, o_keys, o_step, o_traj)  # fmt: skip
    while active > 0:
        for w in range(W):
            g = lane[w, L_G]
            if g < 0:
                continue
            s = lane[w, L_S]
            t = lane[w, L_T]
            P = lane[w, L_P]
            o = obs_of_state[s]
            code = P * n_obs + o
            h = kn.slot_of(code, mask)
            c = np.int64(-2)
            while True:  # the first slot holds the code most of the time
                kc = htab[2 * h]
                if kc == code:
                    c = htab[2 * h + 1]
                    break
                if kc == -1:
                    break
                h = (h + 1) & imask
            if c == -2:
                c = kn.table_find_or_insert(
                    code, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
                    inv_temp,
                )  # fmt: skip
                if c < 0:
                    return False
            # splitmix64 draw (as rng_uniform) and inverse-cdf action (as sample_action)
            st = np.uint64(lane[w, L_ST]) + kn.GOLD
            u = np.float64(kn.mix64(st) >> kn.SH11) * kn.TO_UNIT
            a = 0
            for k in range(A - 1):
                a += cdf[c, k] <= u
            if deterministic or next_prob[s, a, 0] >= 1.0:
                s2 = next_state[s, a, 0]
            else:
                s2, sti = kn.env_next(s, a, np.int64(st), next_state, next_prob)
                st = np.uint64(np.int64(sti))
            q = g * cap_g + lane[w, L_ROW]
            o_hidden[q] = s
            o_action[q] = a
            o_ctx[q] = c
            o_step[q] = t
            o_keys[K, q] = code
            lane[w, L_ROW] += 1
            t += 1
            if terminal[s2] or t >= horizon:
                success = terminal[s2] and reward_enter[s2] > 0.0
                if not end_trajectory(
                    lane, ring, dmap, slots, rows, sums, book_count, trajs, groups, next_group, w, s2,
                    success, seed, starts, steps, root_steps, rule, at_depth, n_obs, powM,
                    cap_g, invalid, reward_enter, o_hidden, o_action, o_ctx, o_keys, o_step,
                    o_traj,
                ):  # fmt: skip
                    active -= 1
                continue
            if K > 0:
                pair = o * (A + 1) + a
                pos = lane[w, L_POS]
                lane[w, L_P] = (P - ring[w, pos] * top) * M + pair
                ring[w, pos] = pair
                lane[w, L_POS] = pos + 1 if pos + 1 < K else 0
            lane[w, L_S] = s2
            lane[w, L_ST] = np.int64(st)
            lane[w, L_T] = t
    return True


@njit(cache=True, _nrt=False)
def compact(trajs, groups, steps, cap_g, K, n_obs, n_actions, powM, obs_of_state, invalid,
            reward_enter, o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action,
            o_invalid, o_hidden, o_ctx, o_keys, o_success):  # fmt: skip
    """Second pass: move every group's rows from its padded rows to their contiguous place (in
    group order; a row never moves later and is read before anything is written over it),
    number the trajectories (group by group, in order), then fill the other columns in simple
    passes over the rows. Returns (rows, trajectories)."""
    row = 0
    tr = 0
    for g in range(groups.shape[0]):
        src = g * cap_g
        for i in range(groups[g, 1]):
            o_hidden[row + i] = o_hidden[src + i]
            o_action[row + i] = o_action[src + i]
            o_ctx[row + i] = o_ctx[src + i]
            o_step[row + i] = o_step[src + i]
            o_keys[K, row + i] = o_keys[K, src + i]
            o_group[row + i] = g
        tr0 = tr
        for j in range(groups[g, 0]):
            k = groups[g, 2] + j
            L = trajs[k, LENGTH]
            parent = tr0 + trajs[k, PARENT] if trajs[k, PARENT] >= 0 else -1
            for i in range(row, row + L):
                o_traj[i] = tr
                o_parent[i] = parent
            o_reward[row + L - 1] = reward_enter[trajs[k, FINAL]]
            o_success[tr] = trajs[k, SUCCESS] != 0
            row += L
            tr += 1
    fill_columns(row, K, n_obs, n_actions, powM, obs_of_state, invalid, reward_enter, o_traj,
                 o_reward, o_obs, o_action, o_invalid, o_hidden, o_keys)  # fmt: skip
    return row, tr


@njit(cache=True, _nrt=False)
def fill_columns(n, K, n_obs, n_actions, powM, obs_of_state, invalid, reward_enter, o_traj,
                 o_reward, o_obs, o_action, o_invalid, o_hidden, o_keys):  # fmt: skip
    """Observation, invalid flag, reward (but a trajectory's last, already set: the reward of
    entering the next own row's state) and the k-step keys, 0 <= k < K, of rows 0..n-1. Key k at
    a trajectory's first row: (P mod M^k) n_obs + o with P = code // n_obs; after it, the
    recursion of ``_kernels.context_keys_pass``."""
    for r in range(n):
        s = o_hidden[r]
        o = obs_of_state[s]
        o_obs[r] = o
        o_keys[0, r] = o
        o_invalid[r] = invalid[s, o_action[r]]
    for r in range(n - 1):
        if o_traj[r + 1] == o_traj[r]:
            o_reward[r] = reward_enter[o_hidden[r + 1]]
    M = (n_obs + 1) * (n_actions + 1)
    for k in range(1, K):
        for r in range(n):
            if r == 0 or o_traj[r] != o_traj[r - 1]:
                o_keys[k, r] = ((o_keys[K, r] // n_obs) % powM[k]) * n_obs + o_obs[r]
            else:
                o1 = o_obs[r - 1]
                pair = o1 * (n_actions + 1) + o_action[r - 1]
                o_keys[k, r] = (o_keys[k - 1, r - 1] - o1) * M + pair * n_obs + o_obs[r]
