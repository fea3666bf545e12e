"""Segment arithmetic shared by every estimator: dense grouping and in-group normalisation.

A *grouping* assigns each step row a group (or excludes it). Everything is done with one
argsort per grouping and ``ufunc.reduceat`` over the sorted rows, so a batch of n steps costs
O(n log n) with a small constant and no Python loop over groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "Grouping",
    "dense_rank",
    "group_by",
    "key_means",
    "normalise",
    "segment_normalise",
    "sorted_within",
]

# Deviations below _SNAP * (|G| + 1) * spread are rounding residue (4 float64 ulps per member).
_SNAP = 4.0 * np.finfo(np.float64).eps


def dense_rank(values: np.ndarray) -> tuple[np.ndarray, int]:
    """int64 dense ranks of ``values`` (0..m-1, equal values equal ranks) and m.

    Unlike ``np.unique(return_inverse=True)`` the ranks follow the sorted order of the values
    but skip the extra sort numpy does to build its unique array.
    """
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    order = np.argsort(values)
    vs = values[order]
    boundary = np.empty(vs.size, dtype=np.bool_)
    boundary[0] = True
    np.not_equal(vs[1:], vs[:-1], out=boundary[1:])
    ranks = np.empty(values.size, dtype=np.int64)
    ranks[order] = np.cumsum(boundary) - 1
    return ranks, int(ranks[order[-1]]) + 1


def key_means(keys: np.ndarray, n_keys: int, x: np.ndarray) -> np.ndarray:
    """float64[n_keys] the mean of ``x`` over the rows of each key (0..n_keys-1; a key without
    rows gives NaN), each sum taken over the key's values in ascending order, so the result
    does not depend on the order of the rows (verl's batches and ours order them apart)."""
    order = np.lexsort((x, keys))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(keys[order], x[order], n_keys) / np.bincount(keys, minlength=n_keys)


@dataclass(frozen=True)
class Grouping:
    """Rows grouped by an integer key.

    Attributes:
        ids: int64[n] dense group id of each row (0..n_groups-1), -1 for rows left out.
        order: int64[m] the member rows (m <= n), sorted so each group is contiguous.
        starts: int64[n_groups] offset of each group in ``order``.
        sizes: int64[n_groups] members per group.
    """

    ids: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray

    @property
    def n_groups(self) -> int:
        return int(self.starts.shape[0])

    def size_of_row(self) -> np.ndarray:
        """int64[n] size of each row's group, 0 for rows left out."""
        out = np.zeros(self.ids.shape[0], dtype=np.int64)
        member = self.ids >= 0
        out[member] = self.sizes[self.ids[member]]
        return out


def group_by(keys: np.ndarray) -> Grouping:
    """Group rows by int64 ``keys``; rows with a negative key are left out of every group."""
    keys = np.asarray(keys, dtype=np.int64)
    n = keys.shape[0]
    members = np.flatnonzero(keys >= 0) if (keys < 0).any() else np.arange(n, dtype=np.int64)
    k = keys[members]
    # Any order within a group will do: the introsort (SIMD on x86) is 2x faster than "stable".
    local = np.argsort(k)
    order = members[local]
    ks = k[local]
    if ks.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Grouping(np.full(n, -1, dtype=np.int64), empty, empty, empty)
    boundary = np.empty(ks.size, dtype=np.bool_)
    boundary[0] = True
    np.not_equal(ks[1:], ks[:-1], out=boundary[1:])
    starts = np.flatnonzero(boundary)
    sizes = np.diff(np.append(starts, ks.size))
    ids = np.full(n, -1, dtype=np.int64)
    ids[order] = np.cumsum(boundary) - 1
    return Grouping(ids, order, starts.astype(np.int64), sizes.astype(np.int64))


def sorted_within(grouping: Grouping, x: np.ndarray) -> Grouping:
    """``grouping`` (every row a member) with each group's rows in ascending order of ``x``:
    :func:`normalise` then sums each group's values in an order that does not depend on the
    order of the rows, so that a permuted batch gives the same advantages bit for bit."""
    order = np.lexsort((x, grouping.ids))
    return Grouping(grouping.ids, order, grouping.starts, grouping.sizes)


def normalise(
    grouping: Grouping,
    x: np.ndarray,
    mode: str,
    std: str,
    eps: float,
    singleton_value: str = "zero",
) -> tuple[np.ndarray, np.ndarray]:
    """Group-relative values of ``x``: (x - mean_G) [/ (std_G + eps)] within each group.

    Args:
        grouping: the groups (rows left out get 0).
        x: float64[n] the values (returns).
        mode: "mean_std" ((x - mean) / (std + eps)) or "mean" (x - mean).
        std: "population" (divide by |G|) or "sample" (divide by |G| - 1).
        eps: added to the std.
        singleton_value: "zero" (a one-member group yields 0, the paper) or "raw" (mean 0 and
            std 1, so the value passes through: verl-agent's GiGPO episode term).

    Returns:
        (values, informative): float64[n] and bool[n], informative = the row is in a group of
        >= 2 members whose values are not all equal (or a passed-through singleton). A group
        whose members are all exactly equal yields exactly 0 (see :func:`segment_normalise`).
    """
    n = x.shape[0]
    out = np.zeros(n, dtype=np.float64)
    informative = np.zeros(n, dtype=np.bool_)
    order, starts, sizes = grouping.order, grouping.starts, grouping.sizes
    if singleton_value == "raw" and (sizes == 1).any():
        single_rows = order[starts[sizes == 1]]
        out[single_rows] = x[single_rows] if mode == "mean" else x[single_rows] / (1.0 + eps)
        informative[single_rows] = True
    # Only groups of >= 2 members carry a comparison; deep levels are mostly singletons, so
    # dropping those first keeps the segment reductions small.
    multi = sizes >= 2
    if not multi.any():
        return out, informative
    if not multi.all():
        order = order[np.repeat(multi, sizes)]
        sizes = sizes[multi]
        starts = np.zeros(sizes.shape[0], dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
    seg = np.repeat(np.arange(starts.shape[0]), sizes)
    vals, tied = segment_normalise(x[order], seg, starts, sizes, mode, std, eps)
    out[order] = vals
    informative[order] = ~tied[seg]
    return out, informative


def segment_normalise(
    xs: np.ndarray,
    seg: np.ndarray,
    starts: np.ndarray,
    sizes: np.ndarray,
    mode: str,
    std: str,
    eps: float,
    leave_one_out: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Normalise contiguous groups of >= 2 members: (x - mean) [/ (std + eps)] per group.

    Args:
        xs: float64[m] the values, each group's members contiguous (finite).
        seg: int64[m] the group of each value (0..G-1, non-decreasing).
        starts, sizes: int64[G] offset and size (>= 2) of each group.
        mode, std, eps: as :func:`normalise`.
        leave_one_out: compare each member with the mean of the *other* members instead of the
            group mean: x_i - mean_{j != i} x_j = n / (n - 1) (x_i - mean_G x), n = |G|; the std
            (if any) stays the whole group's.

    Returns:
        (float64[m] values, bool[G] tied). A tied group (all members equal) gives exactly 0:
        deviations are taken from the group's minimum, so they are exact for equal members and
        sum to 0 exactly when the group is tied; near-ties keep full precision. A member at its
        group's mean in exact arithmetic can keep a rounding residue of about |G| ulps of the
        group's spread: it is snapped to 0, so that "A_k == 0" (zero_rule="value") means what it
        means in exact arithmetic and in the public reference code.

    Every group is first scaled by a power of two, 2^-e with e the exponent of its largest |x|,
    so its values lie in (-1, 1): x - min, the squares and their sums can then neither overflow
    (returns of 1e155 or more used to give an infinite std and all-zero advantages) nor
    underflow (returns of 1e-170 or less gave a zero std). Scaling by a power of two is exact,
    so the result is bit for bit the unscaled arithmetic's wherever that did not overflow or
    underflow; eps is scaled with the values, and "mean" deviations are scaled back. When
    every group's largest |x| lies in [2^-400, 2^400] the scaling would change no bit and is
    skipped.
    """
    e = _scale_exponents(xs, starts)
    if e is not None:
        xs = np.ldexp(xs, -e[seg])
    d = xs - np.minimum.reduceat(xs, starts)[seg]
    spread = np.maximum.reduceat(d, starts)
    tied = spread == 0.0
    dev = d - (np.add.reduceat(d, starts) / sizes)[seg]
    dev[np.abs(dev) <= (_SNAP * (sizes + 1) * spread)[seg]] = 0.0
    if mode == "mean_std":
        ddof = 0 if std == "population" else 1
        sd = np.sqrt(np.add.reduceat(dev * dev, starts) / (sizes - ddof))
        if leave_one_out:
            dev *= (sizes / (sizes - 1.0))[seg]
        # eps in the scaled units; 2^-e eps may be inf (a group of 1e-320s), giving 0: right to
        # within 1e-314 of the exact (x - mean) / (std + eps).
        # A tied group has sd = 0 and dev = 0; keep 0 / eps (or 0 / 1 when eps = 0) at 0.
        with np.errstate(over="ignore"):
            den = sd + (eps if e is None else np.ldexp(eps, -e))
        dev /= np.where(tied, 1.0, den)[seg]
        return dev, tied
    if leave_one_out:
        dev *= (sizes / (sizes - 1.0))[seg]
    if e is None:
        return dev, tied
    with np.errstate(over="ignore"):  # a deviation past 1.8e308: compute_advantages names it
        return np.ldexp(dev, e[seg]), tied


# Groups whose largest |x| lies in [2^-400, 2^400] (or is 0) need no scaling: deviations, their
# squares and sums stay normal float64 numbers, so the arithmetic is the scaled one's bit for bit.
_SAFE_LO, _SAFE_HI = 2.0**-400, 2.0**400


def _scale_exponents(xs: np.ndarray, starts: np.ndarray) -> np.ndarray | None:
    """Per group, e with max |x| = f 2^e, f in [0.5, 1); None when no group needs scaling."""
    top = np.maximum.reduceat(np.abs(xs), starts)
    if ((top > _SAFE_HI) | ((top < _SAFE_LO) & (top > 0.0))).any():
        return np.frexp(top)[1]
    return None
