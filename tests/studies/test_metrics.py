"""The study's figures on synthetic samples whose answers are known."""

import numpy as np
import pytest

from studies.bias_variance import proposition_41
from studies.metrics import (
    bias_variance,
    gradient_compare,
    gradient_estimate,
    mean_ci,
    sign_agreement,
    spearman,
)


def test_bias_variance_recovers_known_bias_and_noise():
    # 50 keys, truth t_k; estimates t_k + 0.5 + N(0, 2^2): bias^2 = 0.25, variance = 4.
    rng = np.random.default_rng(0)
    key = np.repeat(np.arange(50), 400)
    truth = rng.normal(size=50)[key]
    est = truth + 0.5 + rng.normal(scale=2.0, size=key.size)
    batch = np.tile(np.arange(400), 50)
    bv = bias_variance(key, est, truth, batch)
    assert abs(bv.bias2 - 0.25) < 0.05
    assert abs(bv.variance - 4.0) < 0.1
    assert bv.mse == bv.bias2 + bv.variance
    assert bv.bias2_ci[0] < 0.25 < bv.bias2_ci[1]
    assert bv.coverage == 1.0


def test_sign_spearman_ci():
    assert sign_agreement(np.array([1.0, -1, 0, 2]), np.array([2.0, -1, 1, -1])) == 0.5
    assert spearman(np.array([1.0, 2, 3]), np.array([10.0, 20, 30])) == 1.0
    m, lo, hi = mean_ci(np.array([1.0, 2, 3, 4]))
    assert m == 2.5 and lo < 2.5 < hi


def test_gradient_compare_matches_dense_estimate():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(4), 50)
    ctx, act, adv = rng.integers(0, 30, 200), rng.integers(0, 4, 200), rng.normal(size=200)
    g_true = rng.normal(size=(50, 4))
    g = gradient_estimate(ctx, act, adv, probs, 10)
    cos = (g * g_true).sum() / np.linalg.norm(g) / np.linalg.norm(g_true)
    rel = np.linalg.norm(g - g_true) / np.linalg.norm(g_true)
    np.testing.assert_allclose(gradient_compare(ctx, act, adv, probs, 10, g_true), (cos, rel))
    # the score function sums to zero over actions in every context
    np.testing.assert_allclose(g.sum(axis=1), 0.0, atol=1e-12)


def test_proposition_41_check():
    # bias falls, variance rises; H in between -> everything holds.
    p = proposition_41([1.0, 0.25], [1.0, 4.0], 0.5, 1.5, K=1, alpha=1.0)
    assert p["bias_falls"] and p["variance_rises"] and p["bias_between"]
    # sum w^2 = (1/3)^2 + (2/3)^2 = 5/9: bounds 5/9 .. 20/9
    assert p["sum_w2"] == 5 / 9 and p["variance_between"]
    q = proposition_41([0.25, 1.0], [4.0, 1.0], 0.5, 9.0, K=1, alpha=1.0)
    assert not q["bias_falls"] and not q["variance_rises"] and not q["variance_between"]


def test_variance_difference_is_paired():
    """var(2a) - var(a) = 3 var(a) exactly; an estimator against itself differs by exactly 0."""
    from studies.metrics import bias_variance, variance_difference

    rng = np.random.default_rng(0)
    key = rng.integers(0, 20, 4000)
    batch = np.repeat(np.arange(40), 100)
    truth = key * 0.1
    a = truth + rng.normal(size=key.size)
    d, lo, hi = variance_difference(key, a, 2 * a, truth, batch)
    v = bias_variance(key, a, truth, batch).variance
    assert d == pytest.approx(3 * v, rel=1e-12) and lo < d < hi
    assert variance_difference(key, a, a, truth, batch) == (0.0, 0.0, 0.0)
