"""numba kernels of the exact (hidden state, context) chain: its time layers (successors,
backward values, forward occupancies), the node index, and every reachable context.
(One of the topic modules behind ``toyenvs._kernels``.)
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import Dict

from toyenvs.core import INVALID_PENALTY

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
