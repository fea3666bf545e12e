"""numba kernels of one env step: the action draw from a cdf row and the move.
(One of the topic modules behind ``toyenvs._kernels``.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from toyenvs._rng import GOLD, SH11, TO_UNIT, U, mix64, rng_uniform


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
