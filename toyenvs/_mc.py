"""numba kernels of the Monte Carlo truth: Q, A and V at queried steps (common random numbers)
and REINFORCE estimates of the exact gradients. (One of the topic modules behind
``toyenvs._kernels``.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from toyenvs._context import table_find_or_insert
from toyenvs._rng import stream_seed
from toyenvs._step import env_next, sample_action
from toyenvs.core import INVALID_PENALTY


@njit(cache=True, _nrt=False)
def simulate_from(
    s, P, t, first_action, st, gamma, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
):  # fmt: skip
    """Discounted true return from z = (s, P, t), first action forced when >= 0.

    Returns (G, stream, ok); ok is False when the policy table filled up. Compiled without
    reference counting (it allocates nothing): counting its array arguments on every call
    made the Monte Carlo truth twice as slow.
    """
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    G = 0.0
    disc = 1.0
    a = first_action
    while True:
        o = obs_of_state[s]
        if a < 0:
            c = table_find_or_insert(
                P * n_obs + o,
                htab,
                codes,
                logits,
                cdf,
                count,
                init_mode,
                init_seed,
                init_scale,
                inv_temp,
            )
            if c < 0:
                return G, st, False
            a, st = sample_action(cdf, c, st)
        s2, st = env_next(s, a, st, next_state, next_prob)
        r = reward_enter[s2]
        if invalid[s, a]:
            r -= INVALID_PENALTY
        G += disc * r
        disc *= gamma
        t += 1
        if terminal[s2] or t >= horizon:
            return G, st, True
        if K > 0:
            P = (P % powM[K - 1]) * M + o * (A + 1) + a
        s = s2
        a = -1


@njit(cache=True)
def mc_state_kernel(
    zs, zP, zt, zrow, zseed, n_rollouts, gamma, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    q_mean, q_se, a_mean, a_se, v_mean, v_se,
):  # fmt: skip
    """Monte Carlo Q, A and V at the queried z = (s, P, t) with standard errors.

    For each z and each rollout j, every action b is tried with the same random stream
    (common random numbers) giving returns G_b; the paired samples V_j = sum_b pi_b G_b and
    A_j(a) = G_a - V_j are unbiased for V(z) and A*(z, a). Returns False if the table filled.
    """
    A = next_state.shape[1]
    G = np.empty(A)
    for i in range(zs.shape[0]):
        c = zrow[i]
        sq = np.zeros(A)
        sq2 = np.zeros(A)
        sa = np.zeros(A)
        sa2 = np.zeros(A)
        sv = 0.0
        sv2 = 0.0
        for j in range(n_rollouts):
            base = stream_seed(zseed[i], j)
            v = 0.0
            prev = 0.0
            for b in range(A):
                g, _, ok = simulate_from(
                    zs[i],
                    zP[i],
                    zt[i],
                    b,
                    base,
                    gamma,
                    horizon,
                    K,
                    n_obs,
                    powM,
                    obs_of_state,
                    next_state,
                    next_prob,
                    invalid,
                    reward_enter,
                    terminal,
                    htab,
                    codes,
                    logits,
                    cdf,
                    count,
                    init_mode,
                    init_seed,
                    init_scale,
                    inv_temp,
                )
                if not ok:
                    return False
                G[b] = g
                p = cdf[c, b] - prev
                prev = cdf[c, b]
                v += p * g
            sv += v
            sv2 += v * v
            for b in range(A):
                sq[b] += G[b]
                sq2[b] += G[b] * G[b]
                d = G[b] - v
                sa[b] += d
                sa2[b] += d * d
        n = np.float64(n_rollouts)
        denom = n * max(n - 1.0, 1.0)
        v_mean[i] = sv / n
        v_se[i] = np.sqrt(max(sv2 - sv * sv / n, 0.0) / denom)
        for b in range(A):
            q_mean[i, b] = sq[b] / n
            q_se[i, b] = np.sqrt(max(sq2[b] - sq[b] * sq[b] / n, 0.0) / denom)
            a_mean[i, b] = sa[b] / n
            a_se[i, b] = np.sqrt(max(sa2[b] - sa[b] * sa[b] / n, 0.0) / denom)
    return True


@njit(cache=True)
def mc_gradient_kernel(
    starts, n_rollouts, seed, gamma, inv_temp_grad, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    g_sum, g_sq, u_sum, u_sq, returns,
):  # fmt: skip
    """REINFORCE estimates of the exact gradients, with per-entry sums of squares.

    Trajectory i gives g_i[c, b] = sum_t w_t G_t (1[a_t = b] - pi(b | c_t)) / temperature with
    G_t the discounted true return from t; w_t = gamma^t (``g_*``) or 1 (``u_*``). Their means
    are unbiased for the discounted and undiscounted exact gradients. ``returns[i]`` = G_0.
    Each trajectory is played (:func:`_play`), its terms summed per context it visited
    (:func:`_trajectory_gradient`), and those sums and their squares added in
    (:func:`_add_trajectory`). Returns False when the policy table filled up.
    """
    cs = np.empty(horizon, dtype=np.int64)  # context row, action, reward of each step
    acts = np.empty(horizon, dtype=np.int64)
    rs = np.empty(horizon)
    gt = np.zeros(g_sum.shape)  # this trajectory's terms (discounted, undiscounted)
    ut = np.zeros(g_sum.shape)
    touched = np.empty(horizon, dtype=np.int64)  # the contexts it visited, once each
    mark = np.full(g_sum.shape[0], -1, dtype=np.int64)
    for gi in range(starts.shape[0]):
        for j in range(n_rollouts):
            tr = gi * n_rollouts + j
            T = _play(
                starts[gi], stream_seed(seed, tr), g_sum.shape[0], horizon, K, n_obs, powM,
                obs_of_state, next_state, next_prob, invalid, reward_enter, terminal, htab,
                codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp, cs,
                acts, rs,
            )  # fmt: skip
            if T < 0:
                return False
            returns[tr], n_touch = _trajectory_gradient(
                T, tr, gamma, inv_temp_grad, cdf, cs, acts, rs, gt, ut, touched, mark
            )
            _add_trajectory(n_touch, touched, gt, ut, g_sum, g_sq, u_sum, u_sq)
    return True


@njit(cache=True, _nrt=False)
def _play(
    s, st, n_rows, horizon, K, n_obs, powM, obs_of_state, next_state, next_prob, invalid,
    reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
    inv_temp, cs, acts, rs,
):  # fmt: skip
    """One trajectory from start state s on stream st: its steps' context rows, actions and
    rewards (invalid-action penalty included) in cs, acts, rs. Returns its length, or -1
    when the policy table filled up (or outgrew the n_rows rows of the sums)."""
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    P = np.int64(powM[K] - 1)  # all padding
    T = 0
    while True:
        o = obs_of_state[s]
        c = table_find_or_insert(P * n_obs + o, htab, codes, logits, cdf, count, init_mode,
                                 init_seed, init_scale, inv_temp)  # fmt: skip
        if c < 0 or c >= n_rows:
            return -1
        a, st = sample_action(cdf, c, st)
        s2, st = env_next(s, a, st, next_state, next_prob)
        r = reward_enter[s2]
        if invalid[s, a]:
            r -= INVALID_PENALTY
        cs[T] = c
        acts[T] = a
        rs[T] = r
        T += 1
        if terminal[s2] or horizon <= T:
            return T
        if K > 0:
            P = (P % powM[K - 1]) * M + o * (A + 1) + a
        s = s2


@njit(cache=True, _nrt=False)
def _trajectory_gradient(T, tr, gamma, inv_temp_grad, cdf, cs, acts, rs, gt, ut, touched, mark):
    """Trajectory tr's terms G_t (1[a_t = b] - pi(b | c_t)) / temperature, weighted by
    gamma^t into gt and by 1 into ut, from its last step back (G_t = r_t + gamma G_{t+1}).
    Returns (G_0, the number of contexts it visited, listed in ``touched``)."""
    A = gt.shape[1]
    G = 0.0
    n_touch = 0
    for t in range(T - 1, -1, -1):
        G = rs[t] + gamma * G
        c = cs[t]
        w = gamma**t
        prev = 0.0
        if mark[c] != tr:
            mark[c] = tr
            touched[n_touch] = c
            n_touch += 1
        for b in range(A):
            p = cdf[c, b] - prev
            prev = cdf[c, b]
            ind = 1.0 if b == acts[t] else 0.0
            x = G * (ind - p) * inv_temp_grad
            gt[c, b] += w * x
            ut[c, b] += x
    return G, n_touch


@njit(cache=True, _nrt=False)
def _add_trajectory(n_touch, touched, gt, ut, g_sum, g_sq, u_sum, u_sq):
    """Add one trajectory's terms and their squares to the sums, and clear them."""
    for i in range(n_touch):
        c = touched[i]
        for b in range(gt.shape[1]):
            g_sum[c, b] += gt[c, b]
            g_sq[c, b] += gt[c, b] * gt[c, b]
            u_sum[c, b] += ut[c, b]
            u_sq[c, b] += ut[c, b] * ut[c, b]
            gt[c, b] = 0.0
            ut[c, b] = 0.0
