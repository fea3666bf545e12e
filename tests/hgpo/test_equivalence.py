"""The fast estimators equal the slow reference implementation (to 1e-12) on generated batches."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hgpo import ESTIMATORS, compute_advantages, context_keys, step_returns
from hgpo.graphgpo import graph_distances
from tests.hgpo.reference_impl import (
    ref_context,
    ref_episode,
    ref_estimate,
    ref_graph_distances,
    ref_graphgpo,
    ref_levels,
    ref_returns,
)
from tests.hgpo.strategies import (
    configs,
    graph_batches,
    graph_configs,
    spo3_options,
    step_batches,
    step_inputs,
)

GROUP_ESTIMATORS = [name for name in ESTIMATORS if name != "gae"]


@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
@given(batch=step_batches(), cfg=configs(), data=st.data())
def test_fast_equals_reference(estimator, batch, cfg, data):
    name = estimator
    inputs = data.draw(step_inputs(name, batch))
    out = compute_advantages(name, batch, cfg, **inputs)
    fast = out.advantages
    ref = np.asarray(ref_estimate(name, batch, cfg, **inputs))
    assert np.isfinite(fast).all()
    if cfg.zero_rule == "value" and name in ("hgpo", "hgpo-uniform"):
        # The public code's test A_k == 0.0 is decided by rounding when a step sits at its
        # group's mean: compare only steps where neither side has a level value near 0.
        A = np.vstack([out.level_advantages, np.asarray(ref_levels(batch, cfg, cfg.K)[0])])
        if cfg.base_group:
            A = np.vstack([A, ref_episode(batch, cfg)[0]])
        clear = ~((A != 0) & (np.abs(A) < 1e-9)).any(axis=0)
        fast, ref = fast[clear], ref[clear]
    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-12)


@given(batch=step_batches(), cfg=configs())
def test_returns_equal_reference(batch, cfg):
    np.testing.assert_allclose(
        step_returns(batch, cfg), ref_returns(batch, cfg), rtol=1e-13, atol=1e-13
    )


@given(batch=step_batches(max_len=9), cfg=configs())
def test_context_keys_are_exact(batch, cfg):
    """Two steps share a level-k key iff their C_k tuples (with group) are equal."""
    keys = context_keys(batch, cfg.K, cfg.include_actions, cfg.early)
    for k in range(cfg.K + 1):
        ctx = [ref_context(batch, row, k, cfg) for row in range(batch.n_steps)]
        for i in range(batch.n_steps):
            assert (keys[k, i] < 0) == (ctx[i] is None)
            for j in range(i + 1, batch.n_steps):
                if ctx[i] is None or ctx[j] is None:
                    continue
                assert (keys[k, i] == keys[k, j]) == (ctx[i] == ctx[j])


@pytest.mark.parametrize("estimator", ["graphgpo"])  # (so HGPO_ESTIMATOR selects it)
@given(batch=graph_batches(), cfg=graph_configs())
def test_graphgpo_equals_reference(estimator, batch, cfg):
    """GraphGPO's own options and the terminal states of next_state, on top of the generic
    test above (which runs it with its default graph options on batches without next_state)."""
    out = compute_advantages(estimator, batch, cfg)
    R, adv = ref_graphgpo(batch, cfg)
    np.testing.assert_allclose(out.returns, R, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(out.advantages, adv, rtol=1e-12, atol=1e-12)
    d_state, d_next = ref_graph_distances(batch, cfg)
    gd = graph_distances(batch, cfg.graph_success_return)
    np.testing.assert_array_equal(gd.d_state, d_state)
    np.testing.assert_array_equal(gd.d_next, d_next)


@pytest.mark.parametrize("estimator", ["3spo"])  # (so HGPO_ESTIMATOR selects it)
@given(batch=graph_batches(), cfg=configs(), spo3=spo3_options(), many=st.booleans())
def test_3spo_equals_reference_over_its_options(estimator, batch, cfg, spo3, many):
    """3SPO with its own options drawn too (the test above runs its defaults), on batches
    with and without next_state (a terminal observation seen before or new); ``many`` repeats
    the batch's states so that counts pass xi and the truncation test bites."""
    if many:
        ns = None if batch.next_state is None else batch.next_state % 2
        batch = type(batch)(batch.group, batch.traj, batch.step, batch.reward, batch.state % 2,
                            batch.action, batch.invalid, next_state=ns)  # fmt: skip
    cfg = cfg.replace(**spo3)
    fast = compute_advantages(estimator, batch, cfg).advantages
    ref = np.asarray(ref_estimate(estimator, batch, cfg))
    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-12)
