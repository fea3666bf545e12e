"""Rollout schemes that branch from visited steps, at a budget counted in env steps.

A toy POMDP restarts exactly from any visited step: its *snapshot* is the hidden state s_t,
the policy's K-step context (the code of the step's full context, whose past part P holds the
last K (observation, action) pairs) and the step index t. The environment's randomness is a
stream per trajectory, so a branch draws its own future from a fresh stream. A branch shares
its parent's steps 0..b-1 and state s_b, hence its first step falls in the level-K group of the
step it branches from; it runs until it terminates (goal, trap or horizon). The batch is a
branched :class:`hgpo.StepBatch` (``parent`` column, see ``hgpo/branched_batch.py``): the shared
prefix is a sample once.

Schemes (``toyenvs.rollout(..., scheme=..., steps=S, branch_budget=beta)``), per rollout group:

- ``independent``: roots only, until the group has used S env steps (without ``steps``:
  today's N independent rollouts);
- otherwise root rollouts until (1 - beta) S steps are used (at least one), then branches until
  S steps are used, each branch point drawn by a rule among the group's steps with t >= 1:
  ``branch:uniform`` uniformly; ``branch:singleton`` among steps whose level-K group (same
  K-step context) is still a singleton (consistency-aware rollouts, the paper's future work);
  ``branch:hard`` among the steps of the level-K group whose return-to-go (true reward,
  undiscounted) varies most (3SPO-like); ``branch:3spo`` by 3SPO's rollout allocation
  (arXiv 2606.09961): among the steps whose observation o still has rollouts left,
  ceil(G_max S(o)) - 1 > the branches already started from o, those whose score S(o) (Eq. 1,
  from the group's finished trajectories' visit and success counts) is highest;
  ``tree:D1,D2,...`` at the set depths, the step with the fewest branches first
  (Tree-GRPO-like). A rule with no eligible step falls back to uniform, and to a new root
  when no step has t >= 1.

The last trajectory of a group may overshoot S by at most ``horizon - 1`` steps; the batch's
row count is the cost actually paid (compare schemes by it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.options import bad
from hgpo.schemes import RULES, SCHEMES, Scheme, check_budget, parse_scheme
from toyenvs import _kernels as kn
from toyenvs.core import POMDP

__all__ = [
    "RULES", "SCHEMES", "Scheme", "branch_arrays", "branched_rollout", "check_budget", "parse_scheme",
]  # fmt: skip

_RULE_CODE = {name: i for i, name in enumerate(RULES)}
_STREAMS = 1 << 24  # random streams per rollout group: trajectory j draws from g * 2^24 + j
_CHOICE = _STREAMS - 1  # the group's stream for drawing branch points


def branched_rollout(
    env: POMDP,
    pol: object,
    tasks: np.ndarray,
    seed: int,
    scheme: Scheme,
    steps: int,
    branch_budget: float,
    spo3_config: EstimatorConfig | None = None,
) -> tuple[dict[str, np.ndarray], StepBatch]:
    """Run ``scheme`` on every task with ``steps`` env steps per group (checked arguments).

    Returns the raw columns (:func:`branch_arrays`) and the branched StepBatch. Trajectory j of
    group g draws from stream (seed, g * 2^24 + j). ``spo3_config``: the ``spo3_*`` options of
    ``branch:3spo`` (default ``EstimatorConfig()``'s).
    """
    res = branch_arrays(env, pol, tasks, seed, scheme, steps, branch_budget,
                        spo3_config=spo3_config)  # fmt: skip
    batch = StepBatch(
        group=res["group"], traj=res["traj"], step=res["step"], reward=res["reward"],
        state=res["state"], action=res["action"], invalid=res["invalid"], parent=res["parent"],
        next_state=res["next_state"],
    )  # fmt: skip
    return res, batch


_COLUMNS = (
    ("group", np.int64), ("traj", np.int64), ("parent", np.int64), ("step", np.int64),
    ("reward", np.float64), ("state", np.int64), ("action", np.int64), ("invalid", np.bool_),
    ("hidden", np.int64), ("context", np.int64), ("next_state", np.int64),
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
    spo3_config: EstimatorConfig | None = None,
) -> dict[str, np.ndarray]:
    """The raw kernel output of :func:`branched_rollout` (the columns of
    :func:`toyenvs.rollout.rollout_arrays` plus ``parent``), without building a StepBatch.
    ``kernel``: :func:`branch_kernel` by default; the tests pass the one-at-a-time reference."""
    kernel = branch_kernel if kernel is None else kernel
    spo3 = spo3_params(EstimatorConfig() if spo3_config is None else spo3_config)
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
            env.terminal, *tables, steps, root_steps, _RULE_CODE[scheme.rule], at_depth, spo3,
            *out.values(), keys, success,
        )  # fmt: skip

    n, n_traj = pol.run_visited(call, lambda got: out["context"][: got[0]])  # type: ignore[attr-defined]
    res = {k: v[:n] for k, v in out.items()}
    res["context_keys"] = keys.reshape(-1)[: (K + 1) * n].reshape(K + 1, n)  # the kernel's layout
    res["success"] = success[:n_traj]
    return res


def spo3_params(cfg: EstimatorConfig) -> np.ndarray:
    """float64[5] (alpha, xi, zeta, eps, G_max) of ``branch:3spo`` from ``cfg``'s spo3_* options
    (a ValueError naming the type if ``cfg`` is not an EstimatorConfig)."""
    if not isinstance(cfg, EstimatorConfig):
        raise bad("spo3_config", "an hgpo.EstimatorConfig", type(cfg).__name__)
    return np.array(
        [cfg.spo3_alpha, cfg.spo3_xi, cfg.spo3_zeta, cfg.spo3_eps, float(cfg.spo3_g_max)]
    )


# --------------------------------------------------------------------------- kernels
#
# How the kernel is fast (same batch as the one-trajectory-at-a-time reference in
# tests/toyenvs/reference_branching.py, bit for bit):
# - Lanes. A group's trajectories run one after another (the next branch point depends on the
#   finished ones), but groups are independent: W groups are in flight at once and step in
#   turn, as in ``_rollout_kernel.rollout_kernel_fast``, so the table probes of different groups
#   overlap in the CPU. The step loop only steps; the lanes whose trajectory ended in a sweep
#   are handled after it. Group g writes its rows at the padded rows g * cap_g + i (hidden
#   state, action, policy row and the context's past part P); :func:`compact` then moves them
#   to their place in group order and fills every other column, in a few passes per group.
# - No per-row work where a rule needs none. A step's t is its trajectory's first t plus its
#   offset, and the steps with t = 0 are exactly the first rows of the roots, which all come
#   before the first branch: ``uniform`` (and every fallback) finds the j-th step with t >= 1
#   by skipping the roots' first rows; ``tree`` notes a trajectory's rows at the set depths
#   (a few per trajectory); a branch finds the trajectory that owns its row by a search over
#   the group's trajectories, and undoes P into its ring with float quotients.
# - ``singleton`` and ``hard`` count each step in its level-K group when its trajectory ends,
#   in a tight branch-free loop. A step's level-K group is its full K-step context, which the
#   step loop has already looked up in the policy's table: its row c there names the group
#   (``dmap``: c -> the group's slot d, slots numbered in the order they are met, so a slot's
#   first row rises with d). ``singleton`` draws the j-th slot d >= 1 with one step in slot
#   order (a flag bit per slot), which is row order. ``hard`` keeps each slot's sums of the
#   return-to-go and of its square and its variance, and the slot's rows with t >= 1 in a
#   list; the largest variance is found by a pass over the variances as ordered integers, its
#   ties by a second (both vectorise).
# - Array indices in the hot loops are unsigned (``U``, see ``toyenvs._rng.U``).
# - The draws are the reference's: u from the group's choice stream, the j = floor(u n)-th
#   eligible row in row order, trajectory j of group g from stream (seed, g * 2^24 + j).
#
# The kernels' state lives in a few plain arrays with named fields, and the helpers are
# compiled without reference counting (_nrt=False) and inlined: numba pays an atomic
# increment and decrement for every array bound in a helper, which made the bookkeeping cost
# more than the env steps in a first version.

W = kn.LANES  # groups in flight at once
INDEPENDENT, UNIFORM, SINGLETON, HARD, TREE, SPO3 = range(6)  # rule codes, the order of RULES
_TIE = 1e-12  # hard: level-K groups whose variance is within this of the largest tie
_EXACT = 1 << 52  # below this a float quotient is off by at most one
U = kn.U  # unsigned array indices in the hot loops (see toyenvs._rng.U)

# ------------------------------------------------------------------ the kernels' array layout
# The kernels' state is a few plain int64/float64 arrays; the constants below name the fields
# of their last axis (numba compiles each to its integer). "Local rows" are a group's rows
# numbered from 0 in the order they are played; a *slot* d is one level-K group of the lane's
# current rollout group (slots numbered in the order they are met).
#
# lane: int64[W, 16], one row per lane (a rollout group in flight) -----------------------------
LANE_GROUP = 0  # its rollout group g (-1: the lane is idle)
LANE_TRAJ = 1  # the trajectory j of the group being run
LANE_ROWS = 2  # the group's local rows so far
LANE_TRAJ_ROW = 3  # the local row where trajectory j started
LANE_TRAJ_T = 4  # the step t where trajectory j started (0 for a root, b for a branch)
LANE_T = 5  # trajectory j's current step t
LANE_HIDDEN = 6  # its current hidden state
LANE_STREAM = 7  # its random stream's state
LANE_PAST = 8  # its context's past part P (the last K (observation, action) pairs)
LANE_RING_POS = 9  # the ring slot of P's oldest pair
LANE_PARENT = 10  # its parent trajectory in the group (-1: a root)
LANE_CHOICE_STREAM = 11  # the group's stream for drawing branch points
LANE_ROOTS = 12  # roots started so far
LANE_SLOTS = 13  # slots (level-K groups) met so far: nd
LANE_SINGLETONS = 14  # slots d >= 1 with exactly one step
LANE_DEEP_ROWS = 15  # rows at the tree depths so far
# ring: int64[W, max(K, 1)] the last K (observation, action) pairs, ring[w, pos] the oldest.
#
# rec: int64[W, steps, 8], trajectory j of lane w's group; trajs: int64[n_groups * steps + 1,
# 7], the records of the groups done, in the order they finish ---------------------------------
REC_LENGTH = 0  # its rows
REC_PARENT = 1  # its parent trajectory j (-1: a root)
REC_FINAL = 2  # the hidden state it ended in
REC_SUCCESS = 3  # it ended at the goal
REC_FIRST_T = 4  # its first step t
REC_FIRST_ROW = 5  # its first local row
REC_FIRST_PAST = 6  # (trajs only) the compaction's note of the past part P at its first row
# groups: int64[n_groups, 3] each group's trajectories, rows and first record in trajs;
# next_group: int64[2] the next group to start and the next free record.
#
# The book of each lane's group, read by the singleton and hard rules:
# dmap: int32[W, table capacity] the slot d of policy row c (-1: not met yet); clear() resets
#   only the entries it set.
# cnt: int64[W, cap_g] the steps in slot d (contiguous: singleton counts its slots with one).
# slots: int64[W, cap_g, 4], per slot d -------------------------------------------------------
SLOT_CODE = 0  # its policy row c (its full K-step context)
SLOT_FIRST_ROW = 1  # its first local row
SLOT_BRANCHABLE = 2  # its steps with t >= 1 (hard)
SLOT_TAIL = 3  # the last entry of its list of those rows, in row order (hard; see ROWS_NEXT)
# rows: int64[W, 5, 2 cap_g], planes over the local rows (or slots) ----------------------------
ROWS_SLOT = 0  # (hard) each row's slot d
ROWS_NEXT = 1  # (hard) the next row of the same slot's list; entry cap_g + d heads slot d's
ROWS_TIED = 2  # (hard, scratch) the slots tied for the largest variance
ROWS_MERGED = 3  # (hard, scratch) the tied slots' rows merged in row order
ROWS_SINGLE_BITS = 4  # (singleton) one bit per slot, 64 to a word: "d >= 1 and one step"
# sums: float64[W, cap_g, 2], per slot d, over its steps' return-to-go G -----------------------
SUMS_R = 0  # the sum of G
SUMS_R2 = 1  # the sum of G^2
# var: float64[W, cap_g] slot d's population variance as the reference computes it, -inf while
#   it has no step with t >= 1; read through its int64 view as ordered integers (see _order).
# deep: int64[W, cap_g, 2], per row at a tree depth, in row order ------------------------------
DEEP_ROW = 0  # the local row
DEEP_BRANCHES = 1  # the branches started from it so far
# 3spo keeps per *observation* o what the level-K rules keep per slot, in the same arrays
# (allocated for the rule by new_book; nothing else of them is used under 3spo):
OBS_N = 0  # slots[w, o, .]: N(o), the group's finished trajectories that visited o
OBS_WINS = 1  # W(o), those of them that succeeded (last reward > 0)
OBS_SEEN = 2  # the stamp (j + 1) of the last trajectory j that counted o (once per trajectory)
OBS_BRANCHES = 3  # B(o), the branches started from steps with observation o
OBS_ROWS = 4  # the group's steps with t >= 1 and observation o (its branch points)
SC_SCORE = 0  # sums[w, o, .]: S(o) at the draw cnt[w, o] (Eq. 1)
SC_ROLLOUTS = 1  # n(o) = ceil(G_max S(o)) at that draw (Eq. 3)
ROWS_OBS_MET = 0  # rows[w, 0, i]: the observations counted in the group (to clear them)
LANE_OBS_MET = LANE_SLOTS  # (3spo) observations counted in the group so far
LANE_DRAWS = LANE_SINGLETONS  # (3spo) branch draws in the group so far: stamps cnt[w, o]
# spo3: float64[5] (alpha, xi, zeta, eps, G_max), :func:`spo3_params`
SPO3_ALPHA, SPO3_XI, SPO3_ZETA, SPO3_EPS, SPO3_G_MAX = range(5)
#
# cfg: int64[6], the kernel's scalars (numba inlines calls of at most 30 arguments) -----------
CFG_SEED = 0
CFG_STEPS = 1  # env steps per group
CFG_ROOT_STEPS = 2  # roots until this many rows
CFG_RULE = 3  # the rule code
CFG_RADIX = 4  # M = (n_obs + 1) * (n_actions + 1), the radix of the context code
CFG_CAP_G = 5  # cap_g = steps + horizon, the padded rows of one group
#
# The steps with t = 0 are the roots' first rows; they share one context (the start state's
# observation after K padding pairs), hence slot 0, and for K >= 1 slot 0 holds nothing else.
# So a slot d >= 1 with one step is a singleton branch point, and slot 0 never is (for K = 0
# it may hold later steps, but then it has two or more). The branch-free loops below write
# what a new slot needs at slot nd on every row (kept only if the row opens it): a select
# between two loaded values compiles to a branch, which mispredicts on half the rows.

# bit tricks: _order (floats as ordered integers) and _popcount (SWAR)
_LOW63 = np.int64(0x7FFFFFFFFFFFFFFF)
_S63 = np.int64(63)


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
def _order(bits):
    """The float64 whose bits these are as an int64 that orders as the float does."""
    return bits ^ ((bits >> _S63) & _LOW63)


@njit(cache=True, _nrt=False, inline="always")
def _quotient(x, d, inv):
    """x // d (0 <= x, 1 <= d) without an integer division below 2^52: the float quotient
    x * (1 / d) is then off by at most one, corrected both ways."""
    if x >= _EXACT:
        return x // d
    q = np.int64(np.float64(x) * inv)
    q -= np.int64(q * d > x)
    q += np.int64((q + 1) * d <= x)
    return q


@njit(cache=True, _nrt=False, inline="always")
def _count_rows(dmap, cnt, slots, rows, lane, w, base, r0, L, o_ctx, hard):
    """Enter rows r0..r0+L-1 in their level-K groups: slot d of policy row c (a new one when
    c is met for the first time), its count, its first row; the singletons among d >= 1."""
    uw = U(w)
    nd = lane[uw, LANE_SLOTS]
    ns = lane[uw, LANE_SINGLETONS]
    for i in range(L):
        r = r0 + i
        c = o_ctx[U(base + r)]
        slots[uw, U(nd), SLOT_CODE] = c  # what slot nd needs if row r opens it
        slots[uw, U(nd), SLOT_FIRST_ROW] = r
        d = np.int64(dmap[uw, U(c)])
        new = np.int64(d < 0)
        d += (nd - d) * new
        nd += new
        dmap[uw, U(c)] = d
        k = cnt[uw, U(d)]
        cnt[uw, U(d)] = k + 1
        # slot d >= 1 becomes a singleton (k = 0) or stops being one (k = 1): its bit flips
        flip = U((k <= 1) & (d != 0))
        ns += (np.int64(k == 0) - np.int64(k == 1)) * np.int64(d != 0)
        rows[uw, ROWS_SINGLE_BITS, U(d >> 6)] ^= np.int64(flip << U(d & 63))
        if hard:
            rows[uw, ROWS_SLOT, U(r)] = d
    lane[uw, LANE_SLOTS] = nd
    lane[uw, LANE_SINGLETONS] = ns


@njit(cache=True, _nrt=False, inline="always")
def _record_hard(cnt, slots, rows, sums, var, w, base, r0, L, t0, final, o_hidden, o_action,
                 invalid, reward_enter):  # fmt: skip
    """Enter rows r0..r0+L-1's return-to-go G_t = sum_{j >= t} (r_j - 0.1 invalid_j) in their
    groups (last row first: the reference's order of summation), then append the rows with
    t >= 1 to their groups' lists and refresh the groups' variances."""
    uw = U(w)
    g = 0.0
    s2 = final
    for i in range(L - 1, -1, -1):
        q = U(base + r0 + i)
        s = o_hidden[q]
        g += reward_enter[U(s2)] - kn.INVALID_PENALTY * invalid[U(s), U(o_action[q])]
        s2 = s
        d = U(rows[uw, ROWS_SLOT, U(r0 + i)])
        sums[uw, d, SUMS_R] += g
        sums[uw, d, SUMS_R2] += g * g
    for i in range(L):
        r = r0 + i
        d = U(rows[uw, ROWS_SLOT, U(r)])
        if t0 + i >= 1:  # false only on a root's first row
            rows[uw, ROWS_NEXT, U(slots[uw, d, SLOT_TAIL])] = r
            slots[uw, d, SLOT_TAIL] = r
            slots[uw, d, SLOT_BRANCHABLE] += 1
        c = cnt[uw, d]
        m = sums[uw, d, SUMS_R] / c
        v = sums[uw, d, SUMS_R2] / c - m * m if c >= 2 else 0.0
        var[uw, d] = v if slots[uw, d, SLOT_BRANCHABLE] > 0 else -np.inf


@njit(cache=True, _nrt=False, inline="always")
def _choose_hard(cnt, slots, rows, var, vbits, lane, w, cst):
    """hard: (row, stream, True) drawn uniformly among the steps with t >= 1 of the level-K
    groups whose variance is within _TIE of the largest; (-1, stream, False) when the largest
    is <= _TIE (no draw: the caller falls back to uniform)."""
    uw = U(w)
    nd = lane[uw, LANE_SLOTS]
    top = _order(vbits[uw, 0])
    for d in range(1, nd):  # the largest variance, over ordered integers (no float max)
        top = max(top, _order(vbits[uw, U(d)]))
    vbits[uw, U(nd)] = _order(top)  # back to its float (_order is its own inverse), via the
    best = var[uw, U(nd)]  # spare slot nd
    if not best > _TIE:
        return -1, cst, False
    thr = best - _TIE
    n_slots = 0
    only = 0
    for d in range(nd):  # the groups within _TIE of the largest: how many, and (if one) which
        x = np.int64(var[uw, U(d)] >= thr)
        n_slots += x
        only += x * d
    if n_slots == 1:
        n = slots[uw, U(only), SLOT_BRANCHABLE]
    else:  # ties: list them
        n = 0
        n_slots = 0
        for d in range(nd):
            if var[uw, U(d)] >= thr:
                rows[uw, ROWS_TIED, U(n_slots)] = d
                only = d
                n += slots[uw, U(d), SLOT_BRANCHABLE]
                n_slots += 1
    cst, u = kn.rng_uniform(cst)
    j = min(np.int64(u * n), n - 1)
    cap_g = cnt.shape[1]
    r = rows[uw, ROWS_NEXT, U(cap_g + only)]
    if n_slots == 1:  # the usual case: walk the one group's list
        for _ in range(j):
            r = rows[uw, ROWS_NEXT, U(r)]
        return r, cst, True
    m = 0  # tied groups: their rows merged in row order (insertion sort into ROWS_MERGED)
    for i in range(n_slots):
        d = rows[w, ROWS_TIED, i]
        r = rows[w, ROWS_NEXT, cap_g + d]
        for _ in range(slots[w, d, SLOT_BRANCHABLE]):
            p = m
            while p > 0 and rows[w, ROWS_MERGED, p - 1] > r:
                rows[w, ROWS_MERGED, p] = rows[w, ROWS_MERGED, p - 1]
                p -= 1
            rows[w, ROWS_MERGED, p] = r
            m += 1
            r = rows[w, ROWS_NEXT, r]
    return rows[w, ROWS_MERGED, j], cst, True


@njit(cache=True, _nrt=False, inline="always")
def _nth_one(rec, lane, w, j):
    """The j-th (from 0) row with t >= 1 in row order: every row but the roots' first rows,
    which come first and rise."""
    uw = U(w)
    r = j
    for i in range(lane[uw, LANE_ROOTS]):  # (no early exit: the rows past r add nothing)
        r += np.int64(rec[uw, U(i), REC_FIRST_ROW] <= r)
    return r


@njit(cache=True, _nrt=False, inline="always")
def _nth_single(rows, w, j):
    """The j-th (from 0) slot d >= 1 with one step, in slot order (= row order): whole words
    of ROWS_SINGLE_BITS by their popcount, then the lowest set bits of the word that holds it."""
    i = 0
    while True:
        x = np.uint64(rows[w, ROWS_SINGLE_BITS, i])
        c = _popcount(x)
        if j < c:
            for _ in range(j):
                x &= x - _ONE
            return i * 64 + _popcount((x & (~x + _ONE)) - _ONE)
        j -= c
        i += 1


@njit(cache=True, _nrt=False, inline="always")
def _visit(slots, rows, lane, uw, o, stamp, won):
    """3spo: count observation o for the trajectory with ``stamp`` (once per trajectory)."""
    uo = U(o)
    if slots[uw, uo, OBS_SEEN] != stamp:
        slots[uw, uo, OBS_SEEN] = stamp
        if slots[uw, uo, OBS_N] == 0:  # first met in the group: listed, to clear it
            k = lane[uw, LANE_OBS_MET]
            rows[uw, ROWS_OBS_MET, U(k)] = o
            lane[uw, LANE_OBS_MET] = k + 1
        slots[uw, uo, OBS_N] += 1
        slots[uw, uo, OBS_WINS] += won


@njit(cache=True, _nrt=False, inline="always")
def _count_spo3(slots, rows, rec, lane, w, j, r0, L, t0, won, base, obs_of_state, o_hidden):
    """3spo: count trajectory j's virtual full trajectory in N(o) and W(o): its own rows
    r0..r0+L-1, then steps 0..t0-1 of its parent's (that parent's own rows from its first step
    on, then the grandparent's before that, ...), each observation once; and its own rows with
    t >= 1 as branch points of their observation."""
    uw = U(w)
    stamp = j + 1
    for i in range(L):
        o = obs_of_state[U(o_hidden[U(base + r0 + i)])]
        _visit(slots, rows, lane, uw, o, stamp, won)
        slots[uw, U(o), OBS_ROWS] += np.int64(t0 + i >= 1)
    need = t0
    p = rec[uw, U(j), REC_PARENT]
    while need > 0:
        ft = rec[uw, U(p), REC_FIRST_T]
        fr = rec[uw, U(p), REC_FIRST_ROW]
        for t in range(ft, need):
            o = obs_of_state[U(o_hidden[U(base + fr + t - ft)])]
            _visit(slots, rows, lane, uw, o, stamp, won)
        need = ft
        p = rec[uw, U(p), REC_PARENT]


@njit(cache=True, _nrt=False, inline="always")
def _score_spo3(slots, sums, cnt, uw, o, draw, lam, spo3):
    """3spo: (S(o), rollouts left n(o) - 1 - B(o)) at this draw, computed once per draw (the
    operations of hgpo.threespo.state_score and rollout_allocation, in their order)."""
    uo = U(o)
    if cnt[uw, uo] != draw:
        N = np.float64(slots[uw, uo, OBS_N])
        won = np.float64(slots[uw, uo, OBS_WINS])
        sc = 1.0
        if N > 0.0:
            rate = won / (N + spo3[SPO3_EPS])
            sc = np.exp(-lam * rate) if (N - won < spo3[SPO3_XI] or rate > spo3[SPO3_ZETA]) else 0.0
        sums[uw, uo, SC_SCORE] = sc
        sums[uw, uo, SC_ROLLOUTS] = np.ceil(spo3[SPO3_G_MAX] * sc)
        cnt[uw, uo] = draw
    left = sums[uw, uo, SC_ROLLOUTS] - 1.0 - np.float64(slots[uw, uo, OBS_BRANCHES])
    return sums[uw, uo, SC_SCORE], left


@njit(cache=True, _nrt=False, inline="always")
def _choose_spo3(slots, sums, cnt, rows, rec, lane, w, cst, spo3, obs_of_state, o_hidden, base):
    """3spo: (row, stream, True) drawn uniformly among the steps with t >= 1 whose observation
    has rollouts left and the highest score, in row order; (-1, stream, False) when no step
    has rollouts left (no draw: the caller falls back to uniform). Scores from the group's
    finished trajectories, t = 1 + their number. The best score and the number of steps that
    have it come from a pass over the observations met (each with its count of branch
    points), the j-th of those steps from a pass over the rows that stops there."""
    uw = U(w)
    draw = lane[uw, LANE_DRAWS] + 1
    lane[uw, LANE_DRAWS] = draw
    n_tr = lane[uw, LANE_TRAJ]
    lam = spo3[SPO3_ALPHA] * np.log(np.float64(1 + n_tr))
    best = -1.0
    m = 0
    for i in range(lane[uw, LANE_OBS_MET]):
        o = rows[uw, ROWS_OBS_MET, U(i)]
        n_rows = slots[uw, U(o), OBS_ROWS]
        if n_rows == 0:
            continue
        sc, left = _score_spo3(slots, sums, cnt, uw, o, draw, lam, spo3)
        if left >= 1.0:
            if sc > best:
                best = sc
                m = n_rows
            elif sc == best:
                m += n_rows
    if m == 0:
        return -1, cst, False
    cst, u = kn.rng_uniform(cst)
    jth = min(np.int64(u * m), m - 1)
    for i in range(n_tr):
        fr, ft, L = (
            rec[uw, U(i), REC_FIRST_ROW],
            rec[uw, U(i), REC_FIRST_T],
            rec[uw, U(i), REC_LENGTH],
        )
        for k in range(max(0, 1 - ft), L):
            o = obs_of_state[U(o_hidden[U(base + fr + k)])]
            sc, left = _score_spo3(slots, sums, cnt, uw, o, draw, lam, spo3)
            if left >= 1.0 and sc == best:
                if jth == 0:
                    return fr + k, cst, True
                jth -= 1
    return -1, cst, False  # (not reached: m rows qualify)


@njit(cache=True, _nrt=False, inline="always")
def choose(cnt, slots, rows, var, vbits, deep, rec, lane, w, rule, sums, spo3, obs_of_state,
           o_hidden, base):  # fmt: skip
    """The group's row to branch from by ``rule`` (-1: no step with t >= 1 yet, a new root)
    and the tree entry it came from (-1: none); advances the choice stream. A rule with no
    eligible step falls back to uniform."""
    n_any = lane[w, LANE_ROWS] - lane[w, LANE_ROOTS]  # the rows with t >= 1
    if n_any == 0:
        return -1, -1
    cst = lane[w, LANE_CHOICE_STREAM]
    if rule == TREE:  # the fewest branches first, then the earliest row; no draw
        fewest = -1
        for i in range(lane[w, LANE_DEEP_ROWS]):
            if fewest < 0 or deep[w, i, DEEP_BRANCHES] < deep[w, fewest, DEEP_BRANCHES]:
                fewest = i
        if fewest >= 0:
            return deep[w, fewest, DEEP_ROW], fewest
    elif rule == SINGLETON and lane[w, LANE_SINGLETONS] > 0:
        n = lane[w, LANE_SINGLETONS]
        cst, u = kn.rng_uniform(cst)
        lane[w, LANE_CHOICE_STREAM] = cst
        d = _nth_single(rows, w, min(np.int64(u * n), n - 1))
        return slots[w, d, SLOT_FIRST_ROW], -1
    elif rule == HARD:
        r, cst, ok = _choose_hard(cnt, slots, rows, var, vbits, lane, w, cst)
        if ok:
            lane[w, LANE_CHOICE_STREAM] = cst
            return r, -1
    elif rule == SPO3:
        r, cst, ok = _choose_spo3(slots, sums, cnt, rows, rec, lane, w, cst, spo3, obs_of_state,
                                  o_hidden, base)  # fmt: skip
        if ok:
            lane[w, LANE_CHOICE_STREAM] = cst
            return r, -1
    cst, u = kn.rng_uniform(cst)
    lane[w, LANE_CHOICE_STREAM] = cst
    return _nth_one(rec, lane, w, min(np.int64(u * n_any), n_any - 1)), -1


@njit(cache=True, _nrt=False, inline="always")
def clear(dmap, cnt, slots, rows, sums, deep, lane, w, rule):
    """Empty lane w's book for its next group: the dmap entries it set and its slots."""
    if rule in (SINGLETON, HARD):
        for d in range(lane[w, LANE_SLOTS]):
            dmap[w, slots[w, d, SLOT_CODE]] = -1
            cnt[w, d] = 0
        for i in range(lane[w, LANE_SLOTS] // 64 + 1):
            rows[w, ROWS_SINGLE_BITS, i] = 0
    if rule == SPO3:  # the observations the group counted
        for i in range(lane[w, LANE_OBS_MET]):
            o = rows[w, ROWS_OBS_MET, i]
            for f in range(5):
                slots[w, o, f] = 0
            cnt[w, o] = 0
    if rule == HARD:
        cap_g = cnt.shape[1]
        for d in range(lane[w, LANE_SLOTS]):
            slots[w, d, SLOT_BRANCHABLE] = 0
            slots[w, d, SLOT_TAIL] = cap_g + d
            sums[w, d, SUMS_R] = 0.0
            sums[w, d, SUMS_R2] = 0.0
    lane[w, LANE_SLOTS] = 0
    lane[w, LANE_SINGLETONS] = 0
    lane[w, LANE_DEEP_ROWS] = 0
    lane[w, LANE_ROOTS] = 0


@njit(cache=True, _nrt=False, inline="always")
def begin(lane, ring, rec, deep, w, r, i_deep, seed, starts, K, M, powM, inv_powM, cap_g,
          o_hidden, o_pp):  # fmt: skip
    """Start lane w's next trajectory j of its group g from stream (seed, g * 2^24 + j): a
    root at the group's start state (r = -1) or a branch from the snapshot of local row r
    (hidden state, past part P of the full context, t), found in the trajectory that owns r."""
    uw = U(w)
    g = lane[uw, LANE_GROUP]
    lane[uw, LANE_STREAM] = kn.stream_seed(seed, g * _STREAMS + lane[uw, LANE_TRAJ])
    lane[uw, LANE_TRAJ_ROW] = lane[uw, LANE_ROWS]
    lane[uw, LANE_RING_POS] = 0
    if r < 0:
        lane[uw, LANE_HIDDEN], lane[uw, LANE_PAST] = starts[U(g)], powM[U(K)] - 1
        lane[uw, LANE_T], lane[uw, LANE_PARENT], lane[uw, LANE_TRAJ_T] = 0, -1, 0
        lane[uw, LANE_ROOTS] += 1
        for k in range(K):
            ring[uw, U(k)] = M - 1
        return
    lo = 0  # the last trajectory that starts at or before r (branch-free search)
    n = lane[uw, LANE_TRAJ]
    while n > 1:
        half = n >> 1
        lo = lo + half if rec[uw, U(lo + half), REC_FIRST_ROW] <= r else lo
        n -= half
    q = U(g * cap_g + r)
    t = rec[uw, U(lo), REC_FIRST_T] + r - rec[uw, U(lo), REC_FIRST_ROW]
    P = o_pp[q]
    lane[uw, LANE_HIDDEN], lane[uw, LANE_PAST], lane[uw, LANE_T], lane[uw, LANE_PARENT] = (
        o_hidden[q],
        P,
        t,
        lo,
    )
    lane[uw, LANE_TRAJ_T] = t
    if i_deep >= 0:
        deep[uw, U(i_deep), DEEP_BRANCHES] += 1
    for k in range(K):  # ring[w, k] is pair t-K+k: the oldest, most significant digit first
        D = powM[U(K - 1 - k)]
        x = _quotient(P, D, inv_powM[U(K - 1 - k)])
        ring[uw, U(k)] = x
        P -= x * D


@njit(cache=True, _nrt=False, inline="always")
def start_group(lane, ring, rec, deep, next_group, w, seed, starts, K, M, powM, inv_powM,
                cap_g, o_hidden, o_pp):  # fmt: skip
    """Give lane w the next group (its first root); False when none is left."""
    g = next_group[0]
    if g >= starts.shape[0]:
        lane[w, LANE_GROUP] = -1
        return False
    next_group[0] = g + 1
    lane[w, LANE_GROUP], lane[w, LANE_TRAJ], lane[w, LANE_ROWS] = g, 0, 0
    lane[w, LANE_CHOICE_STREAM] = kn.stream_seed(seed, g * _STREAMS + _CHOICE)
    begin(lane, ring, rec, deep, w, -1, -1, seed, starts, K, M, powM, inv_powM, cap_g,
          o_hidden, o_pp)  # fmt: skip
    return True


@njit(cache=True, _nrt=False, inline="always")
def file_group(rec, trajs, groups, next_group, w, g, n_traj, n_rows):
    """Lane w's group g is done: copy its trajectory records to trajs after those of the
    groups done before it, and note where."""
    n_done = next_group[1]
    groups[g, 0], groups[g, 1], groups[g, 2] = n_traj, n_rows, n_done
    for i in range(n_traj):
        for f in range(6):
            trajs[n_done + i, f] = rec[w, i, f]
    next_group[1] = n_done + n_traj


@njit(cache=True, _nrt=False, inline="always")
def end_trajectory(lane, ring, rec, dmap, cnt, slots, rows, sums, var, vbits, deep, trajs, groups,
                   next_group, w, s2, success, cfg, starts, at_depth, powM, inv_powM, invalid,
                   reward_enter, o_hidden, o_action, o_ctx, o_pp, obs_of_state, spo3):  # fmt: skip
    """Lane w's trajectory ended in s2: record it and enter its rows in the book its rule
    reads, then start the group's next trajectory (roots until root_steps rows, then
    branches until steps) or the next group. Returns False when the lane has nothing left.
    (The scalars come in ``cfg``: numba inlines calls of at most 30 arguments.)"""
    K = powM.shape[0] - 1
    seed, steps, root_steps, rule, M, cap_g = (
        cfg[CFG_SEED], cfg[CFG_STEPS], cfg[CFG_ROOT_STEPS], cfg[CFG_RULE], cfg[CFG_RADIX],
        cfg[CFG_CAP_G],
    )  # fmt: skip
    g, j, r0, r1, t0 = (
        lane[w, LANE_GROUP],
        lane[w, LANE_TRAJ],
        lane[w, LANE_TRAJ_ROW],
        lane[w, LANE_ROWS],
        lane[w, LANE_TRAJ_T],
    )
    L = r1 - r0
    rec[w, j, REC_LENGTH], rec[w, j, REC_PARENT], rec[w, j, REC_FINAL] = L, lane[w, LANE_PARENT], s2
    rec[w, j, REC_SUCCESS], rec[w, j, REC_FIRST_T], rec[w, j, REC_FIRST_ROW] = success, t0, r0
    base = g * cap_g
    if rule in (SINGLETON, HARD):
        _count_rows(dmap, cnt, slots, rows, lane, w, base, r0, L, o_ctx, rule == HARD)
        if rule == HARD:
            _record_hard(cnt, slots, rows, sums, var, w, base, r0, L, t0, s2, o_hidden,
                         o_action, invalid, reward_enter)  # fmt: skip
    elif rule == SPO3:  # success: the last reward is > 0 (hgpo.threespo.trajectory_success)
        won = np.int64(reward_enter[s2] > 0.0)
        _count_spo3(slots, rows, rec, lane, w, j, r0, L, t0, won, base, obs_of_state, o_hidden)
    elif rule == TREE:
        for t in range(max(t0, 1), t0 + L):  # the rows at the set depths, in row order
            if at_depth[t]:
                i = lane[w, LANE_DEEP_ROWS]
                deep[w, i, DEEP_ROW], deep[w, i, DEEP_BRANCHES] = r0 + t - t0, 0
                lane[w, LANE_DEEP_ROWS] = i + 1
    lane[w, LANE_TRAJ] = j + 1
    if r1 < steps:
        r = -1
        i_deep = -1
        if r1 >= root_steps:
            r, i_deep = choose(cnt, slots, rows, var, vbits, deep, rec, lane, w, rule, sums,
                               spo3, obs_of_state, o_hidden, base)  # fmt: skip
            if rule == SPO3 and r >= 0:  # B(o): every branch from o, by the rule or fallback
                slots[w, obs_of_state[o_hidden[base + r]], OBS_BRANCHES] += 1
        begin(lane, ring, rec, deep, w, r, i_deep, seed, starts, K, M, powM, inv_powM, cap_g,
              o_hidden, o_pp)  # fmt: skip
        return True
    file_group(rec, trajs, groups, next_group, w, g, j + 1, r1)
    clear(dmap, cnt, slots, rows, sums, deep, lane, w, rule)
    return start_group(lane, ring, rec, deep, next_group, w, seed, starts, K, M, powM,
                       inv_powM, cap_g, o_hidden, o_pp)  # fmt: skip


@njit(cache=True)
def new_book(rule, cap_g, capacity, n_obs):
    """(dmap, cnt, slots, rows, sums, var, vbits, deep) of every lane, empty; the level-K
    structures only for the rules that read them (capacity: the policy table's rows), the
    per-observation ones of 3spo for it (n_obs observations)."""
    if rule == SPO3:
        var = np.empty((W, 1))
        return (np.full((W, 1), -1, np.int32), np.zeros((W, n_obs), np.int64),
                np.zeros((W, n_obs, 5), np.int64), np.zeros((W, 5, n_obs), np.int64),
                np.zeros((W, n_obs, 2)), var, var.view(np.int64),
                np.empty((W, 1, 2), np.int64))  # fmt: skip
    counted = rule in (SINGLETON, HARD)
    hard = rule == HARD
    n_slots = cap_g if counted else 1
    dmap = np.full((W, capacity if counted else 1), -1, np.int32)
    cnt = np.zeros((W, n_slots), np.int64)
    slots = np.zeros((W, n_slots, 4), np.int64)
    slots[:, :, SLOT_TAIL] = np.arange(n_slots, 2 * n_slots)  # slot d's empty list: its head entry
    rows = np.empty((W, 5, 2 * cap_g if hard else cap_g // 64 + 1), np.int64)
    rows[:, ROWS_SINGLE_BITS] = 0
    sums = np.zeros((W, cap_g if hard else 1, 2))
    var = np.empty((W, cap_g if hard else 1))
    deep = np.empty((W, cap_g if rule == TREE else 1, 2), np.int64)
    return dmap, cnt, slots, rows, sums, var, var.view(np.int64), deep


@njit(cache=True)
def branch_kernel(
    starts, seed, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    steps, root_steps, rule, at_depth, spo3,
    o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx,
    o_next, o_keys, o_success,
):  # fmt: skip
    """Every group: roots until ``root_steps`` rows (at least one), then branches by ``rule``
    until ``steps`` rows. Returns (rows, trajectories), or (-1, 0) when the table filled up.
    ``spo3``: float64[5] the options of ``branch:3spo`` (:func:`spo3_params`).

    Outputs (capacity n_groups * (steps + horizon) rows) as ``rollout_kernel_fast``'s (``o_next``
    the observation each step led to), plus ``o_parent`` (the parent's traj id, -1 for a
    root); the keys of the n rows fill the first
    (K + 1) n entries of ``o_keys`` as one C-ordered [K + 1, n] array. The step loop is
    ``rollout_kernel_fast``'s (inline probe, draw and move; past part P from a ring of the last
    K pairs) over groups in lanes instead of trajectories; it records hidden state, action,
    dense row and P (in ``o_obs``, filled last) at the group's padded rows.
    """
    deterministic = True
    for x in next_prob[:, :, 0].ravel():
        if x < 1.0:
            deterministic = False
    n_groups = starts.shape[0]
    cap_g = steps + horizon
    dmap, cnt, slots, rows, sums, var, vbits, deep = new_book(rule, cap_g, codes.shape[0], n_obs)
    rec = np.empty((W, steps, 8), np.int64)
    trajs = np.empty((n_groups * steps + 1, 7), np.int64)  # touched from the start: few pages
    groups = np.empty((n_groups, 3), np.int64)
    lane = np.zeros((W, 16), np.int64)
    ring = np.zeros((W, max(K, 1)), np.int64)
    next_group = np.array([0, 0], np.int64)
    ended = np.empty((W, 2), np.int64)
    cfg = np.array([seed, steps, root_steps, rule, (n_obs + 1) * (next_state.shape[1] + 1), cap_g])
    inv_powM = 1.0 / powM.astype(np.float64)
    if not run_lanes(
        starts, seed, horizon, K, n_obs, powM, inv_powM, obs_of_state, next_state, next_prob,
        invalid, reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed,
        init_scale, inv_temp, steps, root_steps, rule, at_depth, deterministic, dmap, cnt, slots,
        rows, sums, var, vbits, deep, rec, trajs, groups, lane, ring, next_group, ended,
        cfg, o_action, o_hidden, o_ctx, o_obs, spo3,
    ):  # fmt: skip
        return -1, 0
    # the keys of the n rows go straight to their place in one [K + 1, n] array (no copy)
    n = groups[:, 1].sum()
    keys = o_keys.reshape(-1)[: (K + 1) * n].reshape((K + 1, n))
    return compact(
        trajs, groups, cap_g, K, n_obs, next_state.shape[1], powM, inv_powM, obs_of_state,
        invalid, reward_enter, o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action,
        o_invalid, o_hidden, o_ctx, keys, o_success, o_next,
    )  # fmt: skip


@njit(cache=True, _nrt=False)
def run_lanes(
    starts, seed, horizon, K, n_obs, powM, inv_powM, obs_of_state, next_state, next_prob,
    invalid, reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed,
    init_scale, inv_temp, steps, root_steps, rule, at_depth, deterministic, dmap, cnt, slots, rows,
    sums, var, vbits, deep, rec, trajs, groups, lane, ring, next_group, ended, cfg, o_action,
    o_hidden, o_ctx, o_pp, spo3,
):  # fmt: skip
    """The step loop of :func:`branch_kernel` over the lanes until every group is done;
    False when the policy table filled up. A sweep steps every lane once; the lanes whose
    trajectory ended are then recorded and restarted. Compiled without reference counting (it
    allocates nothing), so the inlined bookkeeping costs no atomic operations."""
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    top = powM[K - 1] if K > 0 else np.int64(0)
    mask = np.uint64((htab.shape[0] >> 1) - 1)
    imask = np.int64(mask)
    cap_g = steps + horizon
    active = 0
    for w in range(W):
        active += start_group(lane, ring, rec, deep, next_group, w, seed, starts, K, M, powM,
                              inv_powM, cap_g, o_hidden, o_pp)  # fmt: skip
    while active > 0:
        n_ended = 0
        for w in range(W):
            uw = U(w)
            g = lane[uw, LANE_GROUP]
            if g < 0:
                continue
            s = lane[uw, LANE_HIDDEN]
            P = lane[uw, LANE_PAST]
            o = obs_of_state[U(s)]
            code = P * n_obs + o
            c = kn.probe(code, htab, mask, imask)
            if c == -2:
                c = kn.table_find_or_insert(
                    code, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
                    inv_temp,
                )  # fmt: skip
                if c < 0:
                    return False
            a, s2, st = kn.draw_and_move(lane[uw, LANE_STREAM], c, s, cdf, next_state, next_prob,
                                         deterministic)  # fmt: skip
            q = U(g * cap_g + lane[uw, LANE_ROWS])
            o_hidden[q] = s
            o_action[q] = a
            o_ctx[q] = c
            o_pp[q] = P
            lane[uw, LANE_ROWS] += 1
            t = lane[uw, LANE_T] + 1
            if terminal[U(s2)] or t >= horizon:
                ended[U(n_ended), 0] = w
                ended[U(n_ended), 1] = s2
                n_ended += 1
                continue
            if K > 0:
                pair = o * (A + 1) + a
                pos = U(lane[uw, LANE_RING_POS])
                lane[uw, LANE_PAST] = (P - ring[uw, pos] * top) * M + pair
                ring[uw, pos] = pair
                lane[uw, LANE_RING_POS] = (
                    lane[uw, LANE_RING_POS] + 1 if lane[uw, LANE_RING_POS] + 1 < K else 0
                )
            lane[uw, LANE_HIDDEN] = s2
            lane[uw, LANE_STREAM] = st
            lane[uw, LANE_T] = t
        for i in range(n_ended):
            w = ended[i, 0]
            s2 = ended[i, 1]
            success = terminal[s2] and reward_enter[s2] > 0.0
            if not end_trajectory(
                lane, ring, rec, dmap, cnt, slots, rows, sums, var, vbits, deep, trajs, groups,
                next_group, w, s2, success, cfg, starts, at_depth, powM, inv_powM, invalid,
                reward_enter, o_hidden, o_action, o_ctx, o_pp, obs_of_state, spo3,
            ):  # fmt: skip
                active -= 1
    return True


@njit(cache=True, _nrt=False)
def compact(trajs, groups, cap_g, K, n_obs, n_actions, powM, inv_powM, obs_of_state, invalid,
            reward_enter, o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action,
            o_invalid, o_hidden, o_ctx, o_keys, o_success, o_next):  # fmt: skip
    """Second pass, group by group: move the group's rows from its padded rows to their
    contiguous place (a row never moves later and is read before anything is written over
    it), then fill the columns in a few simple passes over the group's rows (a loop that
    touches few arrays keeps them in registers) and over its trajectories. Returns (rows,
    trajectories). ``o_next``: the next row's observation within a trajectory, the observation
    of its final state on its last row.

    Keys: key_K = P n_obs + o; key_k, 0 < k < K, by the recursion of
    ``_rollout_kernel.context_keys_pass`` from the row before, and at a trajectory's first row
    (P mod M^k) n_obs + o."""
    M = (n_obs + 1) * (n_actions + 1)
    uK = U(K)
    row = 0
    tr = 0
    for g in range(groups.shape[0]):
        n_tr, n_rows, rec0 = groups[g, 0], groups[g, 1], groups[g, 2]
        lo, hi, src = row, row + n_rows, g * cap_g
        for i in range(n_rows):
            a, b = U(lo + i), U(src + i)
            o_hidden[a] = o_hidden[b]
            o_action[a] = o_action[b]
            o_ctx[a] = o_ctx[b]
            o_keys[uK, a] = o_obs[b]  # P
        for r in range(lo, hi - 1):  # a row's reward: entering the next row's state ...
            o_reward[U(r)] = reward_enter[U(o_hidden[U(r + 1)])]
        r = lo
        for jj in range(n_tr):  # trajectory, parent and step of each row; P at its first
            k = U(rec0 + jj)
            L, p, t0 = trajs[k, REC_LENGTH], trajs[k, REC_PARENT], trajs[k, REC_FIRST_T]
            parent = tr - jj + p if p >= 0 else -1
            for i in range(L):
                a = U(r + i)
                o_traj[a] = tr
                o_parent[a] = parent
                o_step[a] = t0 + i
            trajs[k, REC_FIRST_PAST] = o_keys[uK, U(r)]
            o_success[U(tr)] = trajs[k, REC_SUCCESS] != 0
            r += L
            tr += 1
            o_reward[U(r - 1)] = reward_enter[
                U(trajs[k, REC_FINAL])
            ]  # ... its last: its final state
        for r in range(lo, hi):
            a = U(r)
            s = o_hidden[a]
            o = obs_of_state[U(s)]
            o_group[a] = g
            o_obs[a] = o
            o_invalid[a] = invalid[U(s), U(o_action[a])]
            o_keys[uK, a] = o_keys[uK, a] * n_obs + o  # P -> the full context code
            o_keys[0, a] = o  # (after: for K = 0 it is the same row, and P = 0)
        for r in range(lo, hi - 1):  # the observation each step led to: the next row's ...
            o_next[U(r)] = o_obs[U(r + 1)]
        r = lo
        for jj in range(n_tr):  # ... a trajectory's last: its final state's
            k = U(rec0 + jj)
            r += trajs[k, REC_LENGTH]
            o_next[U(r - 1)] = obs_of_state[U(trajs[k, REC_FINAL])]
        for kk in range(1, K):
            for r in range(lo + 1, hi):
                a, b = U(r), U(r - 1)
                o1 = o_obs[b]
                pair = o1 * (n_actions + 1) + o_action[b]
                o_keys[U(kk), a] = (o_keys[U(kk - 1), b] - o1) * M + pair * n_obs + o_obs[a]
            r = lo
            for jj in range(n_tr):  # a trajectory's first row: from its P
                k = U(rec0 + jj)
                P0 = trajs[k, REC_FIRST_PAST]
                x = P0 - _quotient(P0, powM[kk], inv_powM[kk]) * powM[kk]
                o_keys[U(kk), U(r)] = x * n_obs + o_obs[U(r)]
                r += trajs[k, REC_LENGTH]
        row = hi
    return row, tr
