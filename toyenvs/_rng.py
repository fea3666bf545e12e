"""numba kernels' counter-based random numbers: splitmix64 streams keyed by (seed, index).

Every random draw comes from a splitmix64 stream seeded by (seed, trajectory index), so a
trajectory's draws do not depend on how many others run, on their order or on the machine:
same seed, same output, bit for bit. (One of the topic modules behind ``toyenvs._kernels``.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
