"""Figures that compare estimated advantages with the true ones: the statistics of the studies
(intervals, bias / variance decompositions, rank correlation).

The comparisons the trainer needs too (sign agreement, the batch policy gradient and its
cosine with the exact one) live in the core, :mod:`hgpo.compare` (pure numpy); they are
re-exported here under their names.

Conventions: a *sample* is one step of one batch; its *key* identifies the pair (z, a) =
(hidden state, context, t, action) whose true advantage A*(z, a) it estimates. Averages over
samples weight each (z, a) by how often the policy visits it: the on-policy occupancy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from hgpo.compare import (
    cosine_relerr,
    gradient_compare,
    gradient_estimate,
    sign_agreement,
    visited_gradient_estimate,
)

__all__ = [
    "BiasVariance",
    "bias_variance",
    "cosine_relerr",
    "gradient_compare",
    "gradient_estimate",
    "mean_ci",
    "sign_agreement",
    "spearman",
    "variance_difference",
    "visited_gradient_estimate",
]


@functools.cache
def _scipy_stats() -> ModuleType:
    """``scipy.stats``, imported on first use, as is statsmodels (:func:`_descr_stats`): the two
    are half of a study's start-up (1.0 of 2.0 s, ``python -X importtime``), which ``--help``
    and a bad flag need not pay. Both are core dependencies, not optional extras."""
    from scipy import stats

    return stats


def _descr_stats(x: np.ndarray) -> Any:
    """``statsmodels``' ``DescrStatsW(x)``, statsmodels imported on first use (see
    :func:`_scipy_stats`)."""
    from statsmodels.stats.weightstats import DescrStatsW

    return DescrStatsW(x)


def mean_ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of per-batch figures and its t interval (statsmodels)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    if x.size == 1 or np.all(x == x[0]):
        return float(x[0]), float(x[0]), float(x[0])
    d = _descr_stats(x)
    lo, hi = d.tconfint_mean(alpha=1 - level)
    return float(d.mean), float(lo), float(hi)


@dataclass(frozen=True)
class BiasVariance:
    """Occupancy-weighted squared bias, variance and MSE of an estimator against A*.

    Each figure is an average over the samples whose (z, a) was met at least twice (so a
    variance exists); ``coverage`` is their share of all samples. mse = bias2 + variance
    exactly. The intervals are delete-one-block jackknife 95% intervals over batch blocks.
    """

    bias2: float
    variance: float
    mse: float
    coverage: float
    bias2_ci: tuple[float, float]
    variance_ci: tuple[float, float]
    mse_ci: tuple[float, float]


def _bv_from_sums(
    n: np.ndarray, s1: np.ndarray, s2: np.ndarray, se: np.ndarray
) -> tuple[float, float, float]:
    """bias^2, variance, mse from per-key count, sum of estimates, sum of squares, sum of
    squared errors; keys met fewer than twice are left out."""
    ok = n >= 2
    N = n[ok].sum()
    if N == 0:
        return float("nan"), float("nan"), float("nan")
    mean = s1[ok] / n[ok]
    # unbiased within-key variance, weighted by visits
    var_k = (s2[ok] - n[ok] * mean * mean) / (n[ok] - 1)
    variance = float((n[ok] * np.maximum(var_k, 0.0)).sum() / N)
    mse = float(se[ok].sum() / N)
    return mse - variance, variance, mse


def bias_variance(
    key: np.ndarray, estimate: np.ndarray, truth: np.ndarray, batch: np.ndarray, n_blocks: int = 10
) -> BiasVariance:
    """Bias/variance decomposition of ``estimate`` around ``truth``, grouped by ``key``.

    Args:
        key: int64[m] dense id of each sample's (z, a).
        estimate: float64[m] the estimator's advantage of each sample.
        truth: float64[m] A*(z, a) of each sample.
        batch: int64[m] the batch each sample came from (blocks of batches give the intervals).
        n_blocks: jackknife blocks.
    """
    per_block = _block_sums(key, estimate, truth, batch, n_blocks)
    tot = [sum(p[i] for p in per_block) for i in range(4)]
    full = _bv_from_sums(*tot)
    coverage = float(tot[0][tot[0] >= 2].sum() / max(key.size, 1))
    jack = np.array([_bv_from_sums(*(tot[i] - p[i] for i in range(4))) for p in per_block])
    cis = _jackknife_ci(np.asarray(full), jack)
    return BiasVariance(full[0], full[1], full[2], coverage, cis[0], cis[1], cis[2])


def _block_sums(
    key: np.ndarray, estimate: np.ndarray, truth: np.ndarray, batch: np.ndarray, n_blocks: int
) -> list[tuple[np.ndarray, ...]]:
    """Per block of batches: per-key count, sum of estimates, of squares, of squared errors."""
    m_keys = int(key.max()) + 1 if key.size else 0
    blocks = np.minimum(batch * n_blocks // (int(batch.max()) + 1), n_blocks - 1)
    err2 = (estimate - truth) ** 2
    per_block = []
    for b in range(n_blocks):
        sel = blocks == b
        per_block.append(
            (
                np.bincount(key[sel], minlength=m_keys).astype(np.float64),
                np.bincount(key[sel], weights=estimate[sel], minlength=m_keys),
                np.bincount(key[sel], weights=estimate[sel] ** 2, minlength=m_keys),
                np.bincount(key[sel], weights=err2[sel], minlength=m_keys),
            )
        )
    return per_block


def _jackknife_ci(full: np.ndarray, jack: np.ndarray) -> list[tuple[float, float]]:
    """95% t intervals full +- t se, se the delete-one-block jackknife's (jack: [blocks, m])."""
    nb = jack.shape[0]
    se = np.sqrt((nb - 1) / nb * ((jack - jack.mean(axis=0)) ** 2).sum(axis=0))
    t = _scipy_stats().t.ppf(0.975, nb - 1)
    return [(float(f - t * e), float(f + t * e)) for f, e in zip(full, se, strict=True)]


def variance_difference(
    key: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    truth: np.ndarray,
    batch: np.ndarray,
    n_blocks: int = 10,
) -> tuple[float, float, float]:
    """(var_b - var_a, lo, hi): the difference of two estimators' variances (as
    :func:`bias_variance` defines them) on the same samples, with a paired delete-one-block
    jackknife 95% interval (both from the same batches, so their shared noise cancels)."""
    pa = _block_sums(key, a, truth, batch, n_blocks)
    pb = _block_sums(key, b, truth, batch, n_blocks)
    ta = [sum(p[i] for p in pa) for i in range(4)]
    tb = [sum(p[i] for p in pb) for i in range(4)]
    full = _bv_from_sums(*tb)[1] - _bv_from_sums(*ta)[1]
    jack = np.array(
        [
            _bv_from_sums(*(tb[i] - qb[i] for i in range(4)))[1]
            - _bv_from_sums(*(ta[i] - qa[i] for i in range(4)))[1]
            for qa, qb in zip(pa, pb, strict=True)
        ]
    )
    ((lo, hi),) = _jackknife_ci(np.array([full]), jack[:, None])
    return float(full), lo, hi


def spearman(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Spearman rank correlation of estimates and true advantages (nan if either is constant)."""
    if np.all(estimate == estimate[0]) or np.all(truth == truth[0]):
        return float("nan")
    return float(_scipy_stats().spearmanr(estimate, truth).statistic)
