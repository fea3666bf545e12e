"""numba kernels of the policy's context table: initial logits, cdf rows, the hash table.

Context encoding (mixed radix, collision-free): with M = (O + 1) * (A + 1), a past step's pair
is ``o * (A + 1) + a`` and the padding pair (before t = 0) is ``M - 1``. The past part of a
K-step context is ``P = sum_{j<K} pair_{t-1-j} * M^j`` (most recent pair least significant) and
the context code is ``P * O + o_t``. The k-step key of the same step is
``(P mod M^k) * O + o_t``.

The policy table is an open-addressing hash table ``htab`` (slot h: ``htab[2h]`` code or -1,
``htab[2h + 1]`` dense row) plus dense rows ``codes``, ``logits`` and ``cdf`` (cumulative
action probabilities at the rollout temperature). A kernel that meets a new context inserts it
with its initial logits, which depend only on (init seed, code); when the rows are full it
returns -1 and the caller grows the table and runs the call again. (One of the topic modules
behind ``toyenvs._kernels``.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from toyenvs._rng import GOLD, SH11, SH32, TO_UNIT, U, mix64

INIT_UNIFORM = 0
INIT_RANDOM = 1


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
