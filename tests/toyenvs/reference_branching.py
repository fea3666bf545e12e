"""The one-trajectory-at-a-time branching kernel: the reference that
``toyenvs.branched_rollout.branch_kernel`` (groups in lanes, maintained branch-point structures) must
equal, row for row and bit for bit (only the dense rows of newly met contexts may be numbered
differently); only the tests use it. Same arguments as ``branch_kernel``."""

from __future__ import annotations

import numpy as np
from numba import njit

from toyenvs import _kernels as kn
from toyenvs.branched_rollout import _CHOICE, _STREAMS


@njit(cache=True)
def walk(
    s, P, t, st, row, g, tr, parent, horizon, K, n_obs, powM, hist,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx,
    o_keys, o_next,
):  # fmt: skip
    """Run one trajectory from snapshot (s, P, t) with stream ``st`` until it terminates,
    writing rows from ``row``, with the dynamics of ``_kernels.rollout_kernel`` (``o_next``:
    the observation of the state each step led to).

    Returns (next row, success, ok); ok is False when the policy table filled up.
    """
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    for k in range(K):  # the past part P = sum_k hist[k] M^k, hist[0] the latest pair
        hist[k] = (P // powM[k]) % M
    while True:
        o = obs_of_state[s]
        acc = np.int64(0)
        for k in range(K):
            o_keys[k, row] = acc * n_obs + o
            acc += hist[k] * powM[k]
        code = acc * n_obs + o
        o_keys[K, row] = code
        c = kn.table_find(code, htab)
        if c < 0:
            c = kn.table_find_or_insert(
                code, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp
            )
            if c < 0:
                return row, False, False
        a, st = kn.sample_action(cdf, c, st)
        s2, st = kn.env_next(s, a, st, next_state, next_prob)
        o_group[row] = g
        o_traj[row] = tr
        o_parent[row] = parent
        o_step[row] = t
        o_reward[row] = reward_enter[s2]
        o_obs[row] = o
        o_action[row] = a
        o_invalid[row] = invalid[s, a]
        o_hidden[row] = s
        o_ctx[row] = c
        o_next[row] = obs_of_state[s2]
        row += 1
        t += 1
        if terminal[s2]:
            return row, reward_enter[s2] > 0.0, True
        if t >= horizon:
            return row, False, True
        for k in range(K - 1, 0, -1):
            hist[k] = hist[k - 1]
        if K > 0:
            hist[0] = o * (A + 1) + a
        s = s2


@njit(cache=True)
def _slot(code, gkey):
    """Slot of a level-K code in the group's open-addressing table (inserted when absent)."""
    mask = gkey.shape[0] - 1
    h = kn.slot_of(code, np.uint64(mask))
    while gkey[h] != -1 and gkey[h] != code:
        h = (h + 1) & mask
    gkey[h] = code
    return h


@njit(cache=True)
def _pick(eligible, n_eligible, lo, hi, cst):
    """A uniformly drawn row among ``eligible[lo:hi]`` (n_eligible of them), and the stream."""
    cst, u = kn.rng_uniform(cst)
    j = min(np.int64(u * n_eligible), n_eligible - 1)
    for r in range(lo, hi):
        if eligible[r - lo]:
            if j == 0:
                return r, cst
            j -= 1
    return -1, cst


@njit(cache=True)
def spo3_counts(lo, hi, o_obs, o_traj, o_parent, o_step, o_reward, n_obs):
    """3spo's N(o), W(o) and t from the group's rows lo..hi-1 (finished trajectories), from
    the definition: each trajectory's virtual full trajectory (own rows, then its parent's
    steps before its first, climbing) counts each observation once; W: last reward > 0."""
    N = np.zeros(n_obs, dtype=np.int64)
    won = np.zeros(n_obs, dtype=np.int64)
    seen = np.zeros(n_obs, dtype=np.bool_)
    n_traj = 0
    r = lo
    while r < hi:
        end = r
        while end < hi and o_traj[end] == o_traj[r]:
            end += 1
        n_traj += 1
        seen[:] = False
        for q in range(r, end):
            seen[o_obs[q]] = True
        p, need = o_parent[r], o_step[r]
        while p >= 0 and need > 0:  # the parent's steps 0..need-1 of its virtual trajectory
            first = -1
            for q in range(lo, hi):
                if o_traj[q] == p:
                    if first < 0:
                        first = q
                    if o_step[q] < need:
                        seen[o_obs[q]] = True
            need = o_step[first]
            p = o_parent[first]
        for o in range(n_obs):
            if seen[o]:
                N[o] += 1
                won[o] += o_reward[end - 1] > 0.0
        r = end
    return N, won, n_traj + 1


@njit(cache=True)
def spo3_score(N, won, t, spo3):
    """Eq. 1 of 3SPO (alpha, xi, zeta, eps = spo3[0:4]); 1 for an unseen observation."""
    if N == 0:
        return 1.0
    rate = won / (N + spo3[3])
    lam = spo3[0] * np.log(np.float64(t))
    if N - won < spo3[1] or rate > spo3[2]:
        return np.exp(-lam * rate)
    return 0.0


@njit(cache=True)
def choose_branch_point(rule, lo, hi, o_step, slot, gcnt, gsum, gsq, nchild, at_depth, elig,
                        cst, o_obs, o_traj, o_parent, o_reward, spo3, n_obs):  # fmt: skip
    """The row to branch from among the group's rows lo..hi-1 (-1: none has t >= 1)."""
    if rule == 5:  # 3spo: counts, scores and the branches per observation so far
        N, won, t = spo3_counts(lo, hi, o_obs, o_traj, o_parent, o_step, o_reward, n_obs)
        B = np.zeros(n_obs, dtype=np.int64)
        for r in range(lo, hi):
            B[o_obs[r]] += nchild[r - lo]
        score = np.empty(n_obs)
        left = np.empty(n_obs)
        for o in range(n_obs):
            score[o] = spo3_score(N[o], won[o], t, spo3)
            left[o] = np.ceil(spo3[4] * score[o]) - 1.0 - B[o]
    n_any = 0
    n_rule = 0
    best = -1.0
    for r in range(lo, hi):
        i = r - lo
        ok = o_step[r] >= 1
        n_any += ok
        if not ok:
            elig[i] = False
            continue
        if rule == 2:  # singleton
            elig[i] = gcnt[slot[i]] == 1
        elif rule == 3:  # hard: population variance of the return-to-go in the group
            c = gcnt[slot[i]]
            m = gsum[slot[i]] / c
            v = gsq[slot[i]] / c - m * m if c >= 2 else 0.0
            best = max(best, v)
            elig[i] = True
        elif rule == 4:  # tree
            elig[i] = at_depth[o_step[r]]
        elif rule == 5:  # 3spo: rollouts left at its observation; then the highest score
            elig[i] = left[o_obs[r]] >= 1.0
            if elig[i]:
                best = max(best, score[o_obs[r]])
        else:
            elig[i] = True
    if n_any == 0:
        return -1, cst
    if rule == 3:
        for r in range(lo, hi):
            i = r - lo
            if elig[i]:
                c = gcnt[slot[i]]
                m = gsum[slot[i]] / c
                v = gsq[slot[i]] / c - m * m if c >= 2 else 0.0
                elig[i] = best > 1e-12 and v >= best - 1e-12
    if rule == 5:
        for r in range(lo, hi):
            if elig[r - lo]:
                elig[r - lo] = score[o_obs[r]] == best
    if rule == 4:  # fewest branches first, then the earliest row
        fewest = -1
        for r in range(lo, hi):
            if elig[r - lo] and (fewest < 0 or nchild[r - lo] < nchild[fewest - lo]):
                fewest = r
        if fewest >= 0:
            return fewest, cst
    for r in range(lo, hi):
        n_rule += elig[r - lo]
    if n_rule == 0:  # nothing the rule asks for: uniform over steps with t >= 1
        for r in range(lo, hi):
            elig[r - lo] = o_step[r] >= 1
        n_rule = n_any
    return _pick(elig, n_rule, lo, hi, cst)


@njit(cache=True)
def _record(lo, row0, row1, o_keys, K, o_reward, o_invalid, slot, gkey, gcnt, gsum, gsq):
    """Enter the rows of a finished trajectory in the group's level-K statistics."""
    g = 0.0
    for r in range(row1 - 1, row0 - 1, -1):
        g += o_reward[r] - kn.INVALID_PENALTY * o_invalid[r]
        h = _slot(o_keys[K, r], gkey)
        slot[r - lo] = h
        gcnt[h] += 1
        gsum[h] += g
        gsq[h] += g * g


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
    until ``steps`` rows. Returns (rows, trajectories), or (-1, 0) when the table filled up."""
    cap_g = steps + horizon
    size = 1
    while size < 2 * cap_g:
        size *= 2
    gkey = np.full(size, -1, dtype=np.int64)
    gcnt = np.zeros(size, dtype=np.int64)
    gsum = np.zeros(size)
    gsq = np.zeros(size)
    slot = np.empty(cap_g, dtype=np.int64)
    nchild = np.zeros(cap_g, dtype=np.int64)
    elig = np.empty(cap_g, dtype=np.bool_)
    hist = np.empty(max(K, 1), dtype=np.int64)
    row = 0
    tr = 0
    for g in range(starts.shape[0]):
        lo = row
        cst = kn.stream_seed(seed, g * _STREAMS + _CHOICE)
        j = 0
        while row - lo < steps:
            r = -1
            if j > 0 and row - lo >= root_steps:
                r, cst = choose_branch_point(
                    rule,
                    lo,
                    row,
                    o_step,
                    slot,
                    gcnt,
                    gsum,
                    gsq,
                    nchild,
                    at_depth,
                    elig,
                    cst,
                    o_obs,
                    o_traj,
                    o_parent,
                    o_reward,
                    spo3,
                    n_obs,
                )
            st = kn.stream_seed(seed, g * _STREAMS + j)
            if r < 0:
                s, P, t, parent = starts[g], powM[K] - 1, 0, -1
            else:
                s, P, t, parent = o_hidden[r], o_keys[K, r] // n_obs, o_step[r], o_traj[r]
                nchild[r - lo] += 1
            end, ok_success, ok = walk(
                s, P, t, st, row, g, tr, parent, horizon, K, n_obs, powM, hist,
                obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
                htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
                o_group, o_traj, o_parent, o_step, o_reward, o_obs, o_action, o_invalid,
                o_hidden, o_ctx, o_keys, o_next,
            )  # fmt: skip
            if not ok:
                return -1, 0
            o_success[tr] = ok_success
            nchild[row - lo : end - lo] = 0
            _record(lo, row, end, o_keys, K, o_reward, o_invalid, slot, gkey, gcnt, gsum, gsq)
            row = end
            tr += 1
            j += 1
        for i in range(row - lo):  # clear the group's table for the next group
            h = slot[i]
            gkey[h] = -1
            gcnt[h] = 0
            gsum[h] = 0.0
            gsq[h] = 0.0
    flat = o_keys.reshape(-1)  # the keys as one [K + 1, row] array, branch_kernel's layout
    for k in range(K + 1):
        for r in range(row):
            flat[k * row + r] = o_keys[k, r]
    return row, tr
