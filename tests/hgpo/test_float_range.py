"""Extreme but finite rewards: a named ValueError, or the advantages of the same batch scaled down.

Scaling every reward (and the invalid penalty) by 2^E changes nothing in exact arithmetic but
the unit: standardised advantages (eps = 0) are the same, "mean" ones are 2^E times larger.
The estimators scale each group by a power of two before squaring, so this holds in floating
point too, over the whole float64 range; only a return or advantage that is itself past
1.8e308 may fail, and it must fail with a ValueError that says so.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hgpo import ESTIMATORS, StepBatch, compute_advantages
from tests.hgpo.strategies import configs, default_inputs, step_batches

# graphgpo's step returns 10 gamma^d are in their own unit, not the rewards' (only its invalid
# penalty and episode term scale): tests/hgpo/test_bad_input.py checks its two terms apart.
# 3spo is not scale-free: its shaped reward adds terms that do not scale with the rewards
# (novelty and state-score difference, in [-0.5, 1]) to 0.5 r_t. It gets its own test below.
# g2po is not scale-free: a successful episode's last step leads to a node worth
# g2po_success_return (10), whatever the rewards' unit. It gets its own test below.
GROUP_ESTIMATORS = [name for name in ESTIMATORS if name not in ("gae", "graphgpo", "3spo", "g2po")]


def scaled(b: StepBatch, E: int) -> StepBatch:
    return StepBatch(b.group, b.traj, b.step, np.ldexp(b.reward, E), b.state, b.action, b.invalid)


@given(
    estimator=st.sampled_from(GROUP_ESTIMATORS),
    batch=step_batches(),
    cfg=configs(),
    # 2^-900 .. 2^1020: the strategy's rewards (|r| <= 10, <= 7 steps) stay normal numbers, and
    # from about 2^1015 up some returns or advantages pass float64's range.
    E=st.integers(-900, 1020),
)
def test_extreme_batches_give_a_named_error_or_the_scaled_down_advantages(estimator, batch, cfg, E):
    # A "raw" singleton episode group passes its return through, in reward units even under
    # "mean_std": not scale-free, so left out here (it is x / (1 + eps), nothing to overflow).
    # EMPG's future-clarity bonus zeta f(H) is in its own unit, not the rewards': left out.
    cfg = cfg.replace(eps=0.0, episode_singleton="zero", empg_zeta=0.0)
    big_cfg = cfg.replace(invalid_penalty=math.ldexp(cfg.invalid_penalty, E))
    inputs = default_inputs(estimator, batch)
    small = compute_advantages(estimator, batch, cfg, **inputs).advantages
    try:
        big = compute_advantages(estimator, scaled(batch, E), big_cfg, **inputs).advantages
    except ValueError as exc:
        assert "overflows float64" in str(exc) and "trajectory" in str(exc)
        # |returns| <= 70 and |advantages| <= 4 * 70 here: only 2^E >= 2^1014 can overflow
        assert E >= 1014
        return
    assert np.isfinite(big).all()
    if cfg.norm == "mean":
        big = np.ldexp(big, -E)  # back to the small batch's unit (exact: a power of two)
    np.testing.assert_allclose(big, small, rtol=1e-12, atol=1e-12)


@given(batch=step_batches(), cfg=configs(), E=st.integers(-900, 1020))
def test_3spo_over_the_float64_range_is_finite_or_a_named_error(batch, cfg, E):
    """Rewards (and the penalty) scaled by 2^E: finite advantages, or the named overflow
    error and only where a return can pass float64's range."""
    big_cfg = cfg.replace(invalid_penalty=math.ldexp(cfg.invalid_penalty, E))
    try:
        big = compute_advantages("3spo", scaled(batch, E), big_cfg).advantages
    except ValueError as exc:
        assert "overflows float64" in str(exc) and "trajectory" in str(exc)
        assert E >= 1014
        return
    assert np.isfinite(big).all()


@given(batch=step_batches(), cfg=configs(), E=st.integers(-900, 1020))
def test_g2po_over_the_float64_range_is_finite_or_a_named_error(batch, cfg, E):
    """Rewards (and the penalty) scaled by 2^E: finite advantages, or the named overflow
    error and only where a value can pass float64's range."""
    big_cfg = cfg.replace(invalid_penalty=math.ldexp(cfg.invalid_penalty, E))
    try:
        big = compute_advantages("g2po", scaled(batch, E), big_cfg).advantages
    except ValueError as exc:
        assert "overflows float64" in str(exc) and "trajectory" in str(exc)
        assert E >= 1014
        return
    assert np.isfinite(big).all()
