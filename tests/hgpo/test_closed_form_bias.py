"""hgpo.closed_form_bias against exhaustive enumeration of small groups (exact, no sampling) and
hand-worked values."""

import itertools

import numpy as np
import pytest
from scipy import stats

from hgpo import closed_form_bias as cf


def _enumerate(p: float, G: int):
    """Every reward vector of a group of G Bernoulli(p) rewards, with its probability."""
    for r in itertools.product((0, 1), repeat=G):
        k = sum(r)
        yield np.array(r, dtype=float), p**k * (1 - p) ** (G - k)


@pytest.mark.parametrize("G", [2, 3, 5])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_baseline_and_advantages_equal_enumeration(p, G):
    w_nd = base = adv_bias = s1 = w1 = s0 = w0 = 0.0
    for r, w in _enumerate(p, G):
        if r.sum() in (0, G):
            continue
        p_hat = r.mean()
        w_nd += w
        base += w * p_hat
        adv_bias += w * ((r[0] - p_hat) - (r[0] - p))  # response 1's A_hat - A
        if r[0] == 1:
            s1, w1 = s1 + w * (1 - p_hat), w1 + w
        else:
            s0, w0 = s0 + w * (0 - p_hat), w0 + w
    assert cf.nondegenerate_probability(p, G) == pytest.approx(w_nd, abs=1e-14)
    assert cf.baseline_mean(p, G) == pytest.approx(base / w_nd, abs=1e-14)
    assert cf.advantage_bias(p, G) == pytest.approx(adv_bias / w_nd, abs=1e-14)
    assert cf.conditional_advantage(p, G, 1) == pytest.approx(s1 / w1, abs=1e-14)
    assert cf.conditional_advantage(p, G, 0) == pytest.approx(s0 / w0, abs=1e-14)


def test_hand_worked_values():
    # G = 2: a non-degenerate group holds one success, p_hat = 1/2 whatever p
    assert cf.baseline_mean(0.2, 2) == pytest.approx(0.5)
    assert cf.advantage_bias(0.2, 2) == pytest.approx(-0.3)
    assert cf.conditional_advantage(0.2, 2, 1) == pytest.approx(0.5)  # truth 0.8
    # G = 3, p = 1/2: P(S) = 3/4, E[R 1_S] = 3 (1/2 - 1/8) = 9/8 -> E[p_hat | S] = 1/2
    assert cf.baseline_mean(0.5, 3) == pytest.approx(0.5)
    # G = 4, p = 1/4: (1/4 - 1/256) / (1 - 1/256 - 81/256) = 63/174
    assert cf.baseline_mean(0.25, 4) == pytest.approx(63 / 174)


def test_paper_direction():
    """Hard prompts (p < 1/2) are underestimated, easy ones overestimated, none at 1/2."""
    for G in (3, 8, 16):  # (the bias falls like 0.55^G: 0 in float64 at G = 64, p = 0.45)
        assert (cf.advantage_bias(np.array([0.01, 0.2, 0.45]), G) < 0).all()
        assert (cf.advantage_bias(np.array([0.55, 0.8, 0.99]), G) > 0).all()
        assert cf.advantage_bias(0.5, G) == pytest.approx(0.0, abs=1e-15)
    assert np.isnan(cf.baseline_mean(0.0, 4)) and np.isnan(cf.baseline_mean(1.0, 4))


@pytest.mark.parametrize("G", [2, 3, 8])
def test_turn_weights_equal_the_binomial_sums(G):
    S = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    x = np.arange(G)  # the other rollouts still running, Binomial(G - 1, S)
    pmf = stats.binom.pmf(x[None, :], G - 1, S[:, None])
    np.testing.assert_allclose(
        cf.mtgrpo_turn_weights(S, G), (pmf * (x / (x + 1.0))).sum(axis=1), atol=1e-14
    )
    np.testing.assert_allclose(
        cf.mtgrpo_turn_weights(S, G, leave_one_out=True), (pmf * (x >= 1)).sum(axis=1)
    )
    assert cf.fix_scale(G) == (G - 1) / G and cf.fix_scale(G, True) == 1.0


@pytest.mark.parametrize(
    ("call", "msg"),
    [(lambda: cf.baseline_mean(1.5, 4), "p: must be probabilities in [0, 1], got 1.5"),
     (lambda: cf.baseline_mean(float("nan"), 4), "p: must be probabilities"),
     (lambda: cf.advantage_bias(0.3, 1), "G: must be an integer in 2..1000000, got 1"),
     (lambda: cf.conditional_advantage(0.3, 4, 2), "r: must be 0 or 1, got 2"),
     (lambda: cf.mtgrpo_turn_weights([0.5, -0.1], 4), "alive: must be probabilities")],
)  # fmt: skip
def test_bad_input_is_one_line(call, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        call()
