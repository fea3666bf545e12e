"""numba kernels: counter-based RNG, the context hash table, env steps, rollouts, Monte Carlo.

Every random draw comes from a splitmix64 stream seeded by (seed, trajectory index), so a
trajectory's draws do not depend on how many others run, on their order or on the machine:
same seed, same output, bit for bit.

Context encoding (mixed radix, collision-free): with M = (O + 1) * (A + 1), a past step's pair
is ``o * (A + 1) + a`` and the padding pair (before t = 0) is ``M - 1``. The past part of a
K-step context is ``P = sum_{j<K} pair_{t-1-j} * M^j`` (most recent pair least significant) and
the context code is ``P * O + o_t``. The k-step key of the same step is
``(P mod M^k) * O + o_t``.

The policy table is an open-addressing hash table ``htab`` (slot h: ``htab[2h]`` code or -1,
``htab[2h + 1]`` dense row) plus dense rows ``codes``, ``logits`` and ``cdf`` (cumulative action probabilities at the
rollout temperature). A kernel that meets a new context inserts it with its initial logits,
which depend only on (init seed, code); when the rows are full it returns -1 and the caller
grows the table and runs the call again.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import Dict

from toyenvs.core import INVALID_PENALTY

GOLD = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
SH30 = np.uint64(30)
SH27 = np.uint64(27)
SH31 = np.uint64(31)
SH11 = np.uint64(11)
SH32 = np.uint64(32)
TO_UNIT = 1.0 / 9007199254740992.0  # 2^-53
SEED_MAX = 2**63 - 1  # seeds travel to the kernels as int64
U = np.uint64
"""The rollout loops index arrays with ``U(i)``: numba wraps a signed index around (i < 0
counts from the end), three instructions per access; an unsigned one it does not, which makes
those loops a quarter to a third faster. Only indices are cast (uint64 mixed with int64
arithmetic would be float64). An index is never negative there; unsigned, a negative one
would read out of bounds instead of from the end (neither is checked: no boundscheck)."""
INIT_UNIFORM = 0
INIT_RANDOM = 1


@njit(cache=True)
def mix64(z):
    """splitmix64 finaliser: a bijective 64-bit mix."""
    z = (z ^ (z >> SH30)) * MIX1
    z = (z ^ (z >> SH27)) * MIX2
    return z ^ (z >> SH31)


@njit(cache=True)
def stream_seed(seed, index):
    """Start state of the random stream number ``index`` under ``seed`` (both int64 >= 0).

    Stream states travel as int64 (the same 64 bits as the uint64 splitmix state) so that the
    kernels also run through ``.py_func``, where values cross into compiled helpers as int64.
    """
    return np.int64(
        np.uint64(mix64(mix64(np.uint64(seed) + GOLD) ^ (np.uint64(index) * MIX1 + MIX2)))
    )


@njit(cache=True)
def z_seeds(seed, t, s, P):
    """int64[n] non-negative seed of each z = (t, s, P), a hash of (seed, t, s, P)."""
    out = np.empty(t.shape[0], dtype=np.int64)
    for i in range(t.shape[0]):
        h = mix64(np.uint64(seed) + GOLD)
        h = mix64(h ^ np.uint64(t[i]))
        h = mix64(h ^ np.uint64(s[i]) * MIX1)
        h = mix64(h ^ np.uint64(P[i]) * MIX2)
        out[i] = np.int64(h >> np.uint64(1))
    return out


@njit(cache=True)
def rng_uniform(state):
    """Advance a splitmix64 stream: returns (new state, uniform float64 in [0, 1))."""
    u = np.uint64(state) + GOLD
    return np.int64(u), np.float64(np.uint64(mix64(u)) >> SH11) * TO_UNIT


@njit(cache=True)
def init_logit(init_mode, init_seed, init_scale, code, a):
    """Initial logit of (context code, action): 0, or a N(0, scale^2) draw keyed by the code."""
    if init_mode == INIT_UNIFORM:
        return 0.0
    base = mix64(np.uint64(init_seed) * GOLD + mix64(np.uint64(code)))
    z1 = mix64(base + np.uint64(2 * a + 1) * GOLD)
    z2 = mix64(base + np.uint64(2 * a + 2) * GOLD)
    u1 = (np.float64(z1 >> SH11) + 1.0) * TO_UNIT  # (0, 1]
    u2 = np.float64(z2 >> SH11) * TO_UNIT
    return init_scale * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@njit(cache=True)
def init_logits_rows(codes, n_actions, init_mode, init_seed, init_scale):
    """float64[n, A] initial logits of the given context codes."""
    out = np.empty((codes.shape[0], n_actions))
    for i in range(codes.shape[0]):
        for a in range(n_actions):
            out[i, a] = init_logit(init_mode, init_seed, init_scale, codes[i], a)
    return out


@njit(cache=True)
def fill_cdf_row(logits, cdf, i, inv_temp):
    """cdf[i] = cumulative softmax(logits[i] / temperature), last entry exactly 1."""
    A = logits.shape[1]
    m = logits[i, 0]
    for a in range(1, A):
        if logits[i, a] > m:
            m = logits[i, a]
    acc = 0.0
    for a in range(A):
        acc += np.exp((logits[i, a] - m) * inv_temp)
        cdf[i, a] = acc
    for a in range(A):
        cdf[i, a] /= acc
    cdf[i, A - 1] = 1.0


@njit(cache=True)
def fill_cdf(logits, cdf, n, inv_temp):
    for i in range(n):
        fill_cdf_row(logits, cdf, i, inv_temp)


@njit(cache=True)
def slot_of(code, mask):
    """First probe slot of a context code: multiplicative hash folded to the table size.

    One multiply instead of a full mix: codes are already spread by the mixed radix, and the
    fold (high half xor low half) makes every bit of the code reach the slot.
    """
    x = np.uint64(code) * GOLD
    return np.int64((x ^ (x >> SH32)) & np.uint64(mask))


@njit(cache=True)
def table_find(code, htab):
    """Dense row of a context code, or -1 when absent (htab[2h] = code, htab[2h + 1] = row)."""
    mask = np.uint64((htab.shape[0] >> 1) - 1)
    h = slot_of(code, mask)
    while True:
        k = htab[2 * h]
        if k == code:
            return htab[2 * h + 1]
        if k == -1:
            return -1
        h = (h + 1) & np.int64(mask)


@njit(cache=True)
def table_find_or_insert(
    code, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp
):
    """Dense row of a context code, inserting it with its initial logits; -1 when full."""
    mask = np.uint64((htab.shape[0] >> 1) - 1)
    h = slot_of(code, mask)
    while True:
        k = htab[2 * h]
        if k == code:
            return htab[2 * h + 1]
        if k == -1:
            break
        h = (h + 1) & np.int64(mask)
    i = count[0]
    if i >= codes.shape[0]:
        return -1
    htab[2 * h] = code
    htab[2 * h + 1] = i
    codes[i] = code
    for a in range(logits.shape[1]):
        logits[i, a] = init_logit(init_mode, init_seed, init_scale, code, a)
    fill_cdf_row(logits, cdf, i, inv_temp)
    count[0] = i + 1
    return i


@njit(cache=True)
def table_insert_many(
    query, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp
):
    """Dense rows of many codes (inserting new ones); returns (rows, ok)."""
    out = np.empty(query.shape[0], dtype=np.int64)
    for i in range(query.shape[0]):
        r = table_find_or_insert(
            query[i],
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
        if r < 0:
            return out, False
        out[i] = r
    return out, True


@njit(cache=True)
def table_find_many(query, htab):
    out = np.empty(query.shape[0], dtype=np.int64)
    for i in range(query.shape[0]):
        out[i] = table_find(query[i], htab)
    return out


@njit(cache=True)
def rehash(codes, n, htab):
    """Insert dense rows 0..n-1 into an empty hash table."""
    mask = np.int64((htab.shape[0] >> 1) - 1)
    for i in range(n):
        h = slot_of(codes[i], mask)
        while htab[2 * h] != -1:
            h = (h + 1) & mask
        htab[2 * h] = codes[i]
        htab[2 * h + 1] = i


@njit(cache=True, _nrt=False, inline="always")
def probe(code, htab, mask, imask):
    """The rollout loops' table probe: the dense row of ``code``, or -2 when absent (then
    :func:`table_find_or_insert`); the first slot holds the code most of the time."""
    h = slot_of(code, mask)
    while True:
        kc = htab[U(2 * h)]
        if kc == code:
            return htab[U(2 * h + 1)]
        if kc == -1:
            return np.int64(-2)
        h = (h + 1) & imask


@njit(cache=True, _nrt=False, inline="always")
def draw_and_move(state, c, s, cdf, next_state, next_prob, deterministic):
    """The rollout loops' step from stream state ``state`` (int64 bits): the splitmix64 draw
    (as rng_uniform), the inverse-cdf action a = #{k < A-1 : cdf[c, k] <= u} (as
    sample_action, branch-free) and the move (as env_next). Returns (a, s2, new state)."""
    st = np.uint64(state) + GOLD
    u = np.float64(mix64(st) >> SH11) * TO_UNIT
    a = 0
    for k in range(next_state.shape[1] - 1):
        a += cdf[U(c), U(k)] <= u
    if deterministic or next_prob[U(s), U(a), 0] >= 1.0:
        return a, next_state[U(s), U(a), 0], np.int64(st)
    s2, sti = env_next(s, a, np.int64(st), next_state, next_prob)
    return a, s2, sti


@njit(cache=True)
def env_next(s, a, st, next_state, next_prob):
    """Successor of (s, a) and the advanced stream; draws only when the move is random."""
    if next_prob[s, a, 0] >= 1.0:
        return next_state[s, a, 0], st
    st, u = rng_uniform(st)
    B = next_state.shape[2]
    acc = 0.0
    for b in range(B - 1):
        acc += next_prob[s, a, b]
        if u < acc:
            return next_state[s, a, b], st
    return next_state[s, a, B - 1], st


@njit(cache=True)
def sample_action(cdf, row, st):
    """Inverse-cdf draw: the first a with u < cdf[row, a], and the advanced stream.

    Counted without branches as #{a < A - 1 : cdf[row, a] <= u} (equal to the first index
    because the cdf is non-decreasing): a data-dependent early exit mispredicts about once per
    step under a spread-out policy.
    """
    st, u = rng_uniform(st)
    A = cdf.shape[1]
    a = 0
    for k in range(A - 1):
        a += cdf[row, k] <= u
    return a, st


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


_PAIR = types.UniTuple(types.int64, 2)
_TRIPLE = types.UniTuple(types.int64, 3)


@njit(cache=True)
def expand_layer(layer_s, layer_P, last, K, n_obs, powM, obs_of_state, next_state, next_prob,
                 terminal):  # fmt: skip
    """Successors of one time layer of the (hidden state, context) chain.

    Returns (succ int64[n, A, B] index into the next layer or -1 when the episode ends there,
    next_s, next_P). ``last``: this is the final layer t = T - 1 (no successors).
    """
    n = layer_s.shape[0]
    A = next_state.shape[1]
    B = next_state.shape[2]
    M = (n_obs + 1) * (A + 1)
    succ = np.full((n, A, B), -1, dtype=np.int64)
    index = Dict.empty(key_type=_PAIR, value_type=types.int64)
    ns = np.empty(16, dtype=np.int64)
    nP = np.empty(16, dtype=np.int64)
    m = 0
    if last:
        return succ, ns[:0], nP[:0]
    for i in range(n):
        s = layer_s[i]
        o = obs_of_state[s]
        base = (layer_P[i] % powM[K - 1]) * M if K > 0 else np.int64(0)
        for a in range(A):
            P2 = base + o * (A + 1) + a if K > 0 else np.int64(0)
            for b in range(B):
                if next_prob[s, a, b] == 0.0:
                    continue
                s2 = next_state[s, a, b]
                if terminal[s2]:
                    continue
                key = (s2, P2)
                idx = index.get(key, -1)
                if idx < 0:
                    idx = m
                    index[key] = idx
                    if m == ns.shape[0]:
                        ns2 = np.empty(2 * m, dtype=np.int64)
                        nP2 = np.empty(2 * m, dtype=np.int64)
                        ns2[:m] = ns
                        nP2[:m] = nP
                        ns, nP = ns2, nP2
                    ns[m] = s2
                    nP[m] = P2
                    m += 1
                succ[i, a, b] = idx
    return succ, ns[:m].copy(), nP[:m].copy()


@njit(cache=True)
def backward_layer(layer_s, succ, pi, V_next, gamma, next_state, next_prob, invalid,
                   reward_enter):  # fmt: skip
    """Q_t(z, a) = sum_b p_b (r + gamma V_{t+1}(z'_b)); V_t(z) = sum_a pi(a | c) Q_t(z, a)."""
    n = layer_s.shape[0]
    A = next_state.shape[1]
    B = next_state.shape[2]
    Q = np.zeros((n, A))
    V = np.zeros(n)
    for i in range(n):
        s = layer_s[i]
        v = 0.0
        for a in range(A):
            q = 0.0
            pen = INVALID_PENALTY if invalid[s, a] else 0.0
            for b in range(B):
                p = next_prob[s, a, b]
                if p == 0.0:
                    continue
                x = reward_enter[next_state[s, a, b]] - pen
                k = succ[i, a, b]
                if k >= 0:
                    x += gamma * V_next[k]
                q += p * x
            Q[i, a] = q
            v += pi[i, a] * q
        V[i] = v
    return Q, V


@njit(cache=True)
def forward_layer(layer_s, d, pi, succ, next_prob, n_next):
    """d_{t+1}(z') = sum_{z, a, b} d_t(z) pi(a | c) p_b [z'_b = z']."""
    A = succ.shape[1]
    B = succ.shape[2]
    out = np.zeros(n_next)
    for i in range(layer_s.shape[0]):
        s = layer_s[i]
        for a in range(A):
            w = d[i] * pi[i, a]
            for b in range(B):
                k = succ[i, a, b]
                if k >= 0:
                    out[k] += w * next_prob[s, a, b]
    return out


@njit(cache=True)
def build_node_index(node_t, node_s, node_P):
    index = Dict.empty(key_type=_TRIPLE, value_type=types.int64)
    for i in range(node_t.shape[0]):
        index[(node_t[i], node_s[i], node_P[i])] = i
    return index


@njit(cache=True)
def lookup_nodes(index, t, s, P):
    out = np.empty(t.shape[0], dtype=np.int64)
    for i in range(t.shape[0]):
        out[i] = index.get((t[i], s[i], P[i]), -1)
    return out


LANES = 8  # trajectories in flight at once in rollout_kernel_fast


@njit(cache=True)
def fill_step_rows(n_rollouts, horizon, n_obs, n_actions, powM, K, obs_of_state, invalid,
                   reward_enter, final, o_group, o_traj, o_step, o_reward, o_obs, o_action,
                   o_invalid, o_hidden, o_ctx, o_keys, o_len):  # fmt: skip
    """Second pass of :func:`rollout_kernel_fast`: compact the rows and fill the other columns.

    On entry step t of trajectory tr sits at the padded position tr * horizon + t of
    ``o_hidden``, ``o_action`` and ``o_ctx``. Trajectory by trajectory, in order, its rows move
    forward to their contiguous place (a row never moves to a later index, and every source
    row is read before anything is written over it), and group / traj / step, observation,
    invalid flag and reward are filled in (the reward of a step is ``reward_enter`` of the next
    step's hidden state, or of ``final[tr]`` on the last step); then the k-step context keys
    come from :func:`context_keys_pass`. Returns the number of rows.
    """
    row = 0
    for tr in range(final.shape[0]):  # o_len may be longer than this call's trajectories
        g = tr // n_rollouts
        L = o_len[tr]
        src = tr * horizon
        for tt in range(L):
            r = U(row + tt)
            q = U(src + tt)
            s = o_hidden[q]
            a = o_action[q]
            c = o_ctx[q]
            s2 = o_hidden[U(src + tt + 1)] if tt + 1 < L else final[tr]
            o_hidden[r] = s
            o_action[r] = a
            o_ctx[r] = c
            o_group[r] = g
            o_traj[r] = tr
            o_step[r] = tt
            o_obs[r] = obs_of_state[U(s)]
            o_invalid[r] = invalid[U(s), U(a)]
            o_reward[r] = reward_enter[U(s2)]
            o_keys[0, r] = obs_of_state[U(s)]
        row += L
    context_keys_pass(row, K, n_obs, n_actions, powM, o_step, o_obs, o_action, o_keys)
    return row


@njit(cache=True)
def context_keys_pass(n_rows, K, n_obs, n_actions, powM, o_step, o_obs, o_action, o_keys):
    """Fill rows 1..K of ``o_keys[:, :n_rows]`` from row 0 (= o_t), the steps and the actions.

    With key_k(t) = P_k(t) n_obs + o_t and P_k(t) = P_{k-1}(t-1) M + pair_{t-1}:
    key_k(t) = (key_{k-1}(t-1) - o_{t-1}) M + pair_{t-1} n_obs + o_t, and at t = 0 (all
    padding) key_k(0) = (M^k - 1) n_obs + o_0: one loop per k with no loop-carried dependence.
    """
    M = (n_obs + 1) * (n_actions + 1)
    for k in range(1, K + 1):
        pad = (powM[k] - 1) * n_obs
        uk, um = U(k), U(k - 1)
        for r in range(n_rows):
            ur = U(r)
            if o_step[ur] == 0:
                o_keys[uk, ur] = pad + o_obs[ur]
            else:
                b = U(r - 1)
                o1 = o_obs[b]
                pair = o1 * (n_actions + 1) + o_action[b]
                o_keys[uk, ur] = (o_keys[um, b] - o1) * M + pair * n_obs + o_obs[ur]


# lanes: int64[W, 6] per lane of rollout_kernel_fast: its trajectory (-1: idle), hidden state,
# stream state, past part P, ring slot of P's oldest pair, t.
LN_TR, LN_S, LN_ST, LN_P, LN_POS, LN_T = range(6)


@njit(cache=True, _nrt=False, inline="always")
def _take_trajectory(lanes, ring, w, tr, starts, n_rollouts, seed, K, M, powM):
    """Lane w starts trajectory tr: the start state of its group, stream (seed, tr), a past
    of K padding pairs."""
    uw = U(w)
    lanes[uw, LN_TR], lanes[uw, LN_S] = tr, starts[U(tr // n_rollouts)]
    lanes[uw, LN_ST], lanes[uw, LN_P] = stream_seed(seed, tr), powM[U(K)] - 1
    lanes[uw, LN_POS], lanes[uw, LN_T] = 0, 0
    for k in range(K):
        ring[uw, U(k)] = M - 1


@njit(cache=True, _nrt=False)
def run_trajectories(
    starts, n_rollouts, seed, horizon, K, n_obs, powM, obs_of_state, next_state, next_prob,
    reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
    inv_temp, deterministic, lanes, ring, final, o_action, o_hidden, o_ctx, o_success, o_len,
):  # fmt: skip
    """The step loop of :func:`rollout_kernel_fast`: W lanes step in turn, a lane that
    finishes takes the next trajectory; False when the policy table filled up. Compiled
    without reference counting (it allocates nothing), so :func:`probe` and
    :func:`draw_and_move` inline for free."""
    A = next_state.shape[1]
    M = (n_obs + 1) * (A + 1)
    top = powM[K - 1] if K > 0 else np.int64(0)
    mask = np.uint64((htab.shape[0] >> 1) - 1)
    imask = np.int64(mask)
    W = lanes.shape[0]
    n_traj = final.shape[0]
    nxt = min(W, n_traj)
    for w in range(W):
        lanes[U(w), LN_TR] = -1
        if w < nxt:
            _take_trajectory(lanes, ring, w, w, starts, n_rollouts, seed, K, M, powM)
    active = nxt
    while active > 0:
        for w in range(W):
            uw = U(w)
            tr = lanes[uw, LN_TR]
            if tr < 0:
                continue
            s, P, t = lanes[uw, LN_S], lanes[uw, LN_P], lanes[uw, LN_T]
            o = obs_of_state[U(s)]
            code = P * n_obs + o
            c = probe(code, htab, mask, imask)
            if c == -2:
                c = table_find_or_insert(
                    code, htab, codes, logits, cdf, count, init_mode, init_seed, init_scale,
                    inv_temp,
                )  # fmt: skip
                if c < 0:
                    return False
            a, s2, st = draw_and_move(lanes[uw, LN_ST], c, s, cdf, next_state, next_prob,
                                      deterministic)  # fmt: skip
            i = U(tr * horizon + t)
            o_hidden[i] = s
            o_action[i] = a
            o_ctx[i] = c
            t += 1
            if terminal[U(s2)] or t >= horizon:
                o_len[U(tr)] = t
                final[U(tr)] = s2
                o_success[U(tr)] = terminal[U(s2)] and reward_enter[U(s2)] > 0.0
                if nxt < n_traj:  # this lane takes the next trajectory
                    _take_trajectory(lanes, ring, w, nxt, starts, n_rollouts, seed, K, M, powM)
                    nxt += 1
                else:
                    lanes[uw, LN_TR] = -1
                    active -= 1
                continue
            if K > 0:
                pair = o * (A + 1) + a
                pos = lanes[uw, LN_POS]
                lanes[uw, LN_P] = (P - ring[uw, U(pos)] * top) * M + pair
                ring[uw, U(pos)] = pair
                lanes[uw, LN_POS] = pos + 1 if pos + 1 < K else 0
            lanes[uw, LN_S], lanes[uw, LN_ST], lanes[uw, LN_T] = s2, st, t
    return True


@njit(cache=True)
def rollout_kernel_fast(
    starts, n_rollouts, seed, horizon, K, n_obs, powM,
    obs_of_state, next_state, next_prob, invalid, reward_enter, terminal,
    htab, codes, logits, cdf, count, init_mode, init_seed, init_scale, inv_temp,
    o_group, o_traj, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx, o_keys,
    o_success, o_len,
):  # fmt: skip
    """Same contract and same trajectories as the one-at-a-time ``rollout_kernel`` (kept in
    ``tests/toyenvs/reference_kernels.py``), bit for bit, faster.

    Only the dense row numbers of contexts met for the first time in this call can differ (they
    follow the order in which the table meets them); codes, actions, states and keys do not.

    How: LANES trajectories are in flight at once and step in turn, so the table lookups of
    independent trajectories overlap in the CPU instead of waiting on each other; a lane that
    finishes takes the next trajectory. The step loop does only what the next step depends on
    (context code, table probe, action draw, env move) and records hidden state, action and
    dense row at the padded position tr * horizon + t of the outputs;
    :func:`fill_step_rows` then compacts the rows and fills every other column. The context's
    past part P is updated from a ring of the last K pairs, P' = (P - oldest * M^(K-1)) * M +
    pair (no loop over k, no division). The step loop (:func:`run_trajectories`) is compiled
    without reference counting: in a function that allocates, an inlined helper that takes
    arrays counts them on every step (the table probe and the draw then made the call twice as
    slow end to end), so this function only allocates.
    """
    A = next_state.shape[1]
    deterministic = True
    for x in next_prob[:, :, 0].ravel():
        if x < 1.0:
            deterministic = False
    final = np.empty(starts.shape[0] * n_rollouts, dtype=np.int64)
    lanes = np.empty((LANES, 6), dtype=np.int64)
    ring = np.empty((LANES, max(K, 1)), dtype=np.int64)
    if not run_trajectories(
        starts, n_rollouts, seed, horizon, K, n_obs, powM, obs_of_state, next_state, next_prob,
        reward_enter, terminal, htab, codes, logits, cdf, count, init_mode, init_seed,
        init_scale, inv_temp, deterministic, lanes, ring, final, o_action, o_hidden, o_ctx,
        o_success, o_len,
    ):  # fmt: skip
        return -1
    return fill_step_rows(
        n_rollouts, horizon, n_obs, A, powM, K, obs_of_state, invalid, reward_enter, final,
        o_group, o_traj, o_step, o_reward, o_obs, o_action, o_invalid, o_hidden, o_ctx, o_keys,
        o_len,
    )  # fmt: skip


@njit(cache=True)
def reachable_contexts(starts, K, n_obs, powM, obs_of_state, next_state, next_prob, terminal):
    """Codes of every context of a (hidden state, context) pair reachable from ``starts``.

    Breadth-first over (s, P) pairs under every action and outcome of non-zero probability,
    ignoring time: a superset of the contexts any horizon reaches (the policy's softmax gives
    every action a positive probability, so reachability does not depend on the policy).
    Returns the distinct codes in order of discovery.
    """
    A = next_state.shape[1]
    B = next_state.shape[2]
    M = (n_obs + 1) * (A + 1)
    seen = Dict.empty(key_type=_PAIR, value_type=types.int64)
    code_seen = Dict.empty(key_type=types.int64, value_type=types.int64)
    qs = np.empty(16, dtype=np.int64)
    qP = np.empty(16, dtype=np.int64)
    out = np.empty(16, dtype=np.int64)
    n_q = 0
    n_out = 0
    for i in range(starts.shape[0]):
        key = (starts[i], powM[K] - 1)
        if key not in seen:
            seen[key] = 1
            if n_q == qs.shape[0]:
                qs = np.concatenate((qs, np.empty(n_q, dtype=np.int64)))
                qP = np.concatenate((qP, np.empty(n_q, dtype=np.int64)))
            qs[n_q] = starts[i]
            qP[n_q] = powM[K] - 1
            n_q += 1
    head = 0
    while head < n_q:
        s = qs[head]
        P = qP[head]
        head += 1
        o = obs_of_state[s]
        code = P * n_obs + o
        if code not in code_seen:
            code_seen[code] = 1
            if n_out == out.shape[0]:
                out = np.concatenate((out, np.empty(n_out, dtype=np.int64)))
            out[n_out] = code
            n_out += 1
        base = (P % powM[K - 1]) * M if K > 0 else np.int64(0)
        for a in range(A):
            P2 = base + o * (A + 1) + a if K > 0 else np.int64(0)
            for b in range(B):
                if next_prob[s, a, b] == 0.0:
                    continue
                s2 = next_state[s, a, b]
                if terminal[s2] or (s2, P2) in seen:
                    continue
                seen[(s2, P2)] = 1
                if n_q == qs.shape[0]:
                    qs = np.concatenate((qs, np.empty(n_q, dtype=np.int64)))
                    qP = np.concatenate((qP, np.empty(n_q, dtype=np.int64)))
                qs[n_q] = s2
                qP[n_q] = P2
                n_q += 1
    return out[:n_out].copy()
