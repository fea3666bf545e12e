"""The fast estimators equal the slow reference implementation (to 1e-12) on generated batches."""

import dataclasses
from difflib import SequenceMatcher

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hgpo import ESTIMATORS, compute_advantages, context_keys, step_returns
from hgpo.gigpo_variants import lcs_bounds, similarity_clusters
from hgpo.graphgpo import graph_distances
from tests.hgpo.reference_impl import (
    ref_context,
    ref_ecpo_terms,
    ref_episode,
    ref_estimate,
    ref_graph_distances,
    ref_graphgpo,
    ref_levels,
    ref_returns,
    ref_similarity_clusters,
)
from tests.hgpo.strategies import (
    OBSERVATIONS,
    configs,
    default_inputs,
    ecpo_options,
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


@pytest.mark.parametrize("estimator", ["ecpo"])  # (so HGPO_ESTIMATOR selects it)
@given(batch=step_batches(n_states=2), cfg=configs(), ecpo=ecpo_options(), data=st.data())
def test_ecpo_equals_reference_over_its_options(estimator, batch, cfg, ecpo, data):
    """ECPO with its own options drawn too (the generic test runs its defaults), on batches
    with two states so that anchors gather many occurrences, actions from 1 to 3 values (one
    action per anchor: the gate's B_s = 0; many: shrinkage of single occurrences)."""
    n_actions = data.draw(st.integers(1, 3))
    actions = np.asarray(
        data.draw(
            st.lists(st.integers(0, n_actions - 1), min_size=batch.n_steps, max_size=batch.n_steps)
        )
    )
    batch = dataclasses.replace(batch, action=actions)
    cfg = cfg.replace(**ecpo)
    out = compute_advantages(estimator, batch, cfg)
    A_act, rho = ref_ecpo_terms(batch, cfg)
    np.testing.assert_allclose(out.diagnostics["ecpo"]["gate"], rho, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        out.diagnostics["ecpo"]["step_advantage"], A_act, rtol=1e-12, atol=1e-12
    )
    ref = np.asarray(ref_estimate(estimator, batch, cfg))
    np.testing.assert_allclose(out.advantages, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "estimator", [name for name in ESTIMATORS if name not in ("graphgpo", "3spo")]
)
@settings(max_examples=25)
@given(batch=step_batches(), cfg=configs(), data=st.data())
def test_next_state_changes_no_estimator_but_graphgpo(estimator, batch, cfg, data):
    """StepBatch.next_state is graphgpo's and 3spo's column: every other estimator gives the same result,
    bit for bit, with it (terminal states drawn among the batch's states and new ones)."""
    last = batch.traj_start + batch.traj_len - 1
    ns = np.empty_like(batch.state)
    ns[:-1] = batch.state[1:]
    ns[last] = data.draw(st.lists(st.integers(0, 5), min_size=batch.n_traj, max_size=batch.n_traj))
    with_next = dataclasses.replace(batch, next_state=ns)
    inputs = default_inputs(estimator, batch)
    a = compute_advantages(estimator, batch, cfg, **inputs)
    b = compute_advantages(estimator, with_next, cfg, **inputs)
    np.testing.assert_array_equal(a.advantages, b.advantages)
    np.testing.assert_array_equal(a.returns, b.returns)


# Texts past 200 characters whose most common characters difflib's autojunk leaves out (each
# fills more than 1% + 1 of the text), so that its ratio is far below the LCS ratio.
_TEXTS = st.text(alphabet="ab c", max_size=30) | st.sampled_from(OBSERVATIONS) | st.builds(
    lambda x, k: (x * k)[:400], st.text(alphabet="abcde ", min_size=1, max_size=12),
    st.integers(10, 60),
)  # fmt: skip


@given(a=_TEXTS, b=_TEXTS)
def test_lcs_bound_is_an_upper_bound_of_difflibs_ratio(a, b):
    """lcs_bounds (rapidfuzz's Indel distance) >= difflib's ratio in both argument orders,
    autojunk included, and equal to it computed as difflib computes 2.0 * M / S with M the
    LCS: the pre-filter of gigpo_similarity may skip a pair only when difflib cannot match."""
    bound = lcs_bounds([a, b])
    assert bound[0, 1] == bound[1, 0]
    assert bound[0, 0] == bound[1, 1] == 1.0
    assert SequenceMatcher(None, a, b).ratio() <= bound[0, 1]
    assert SequenceMatcher(None, b, a).ratio() <= bound[1, 0]
    lcs = _lcs(a, b)
    assert bound[0, 1] == (2.0 * lcs / (len(a) + len(b)) if a or b else 1.0)


def _lcs(a: str, b: str) -> int:
    """The longest common subsequence's length, by the textbook dynamic programme."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


@given(texts=st.lists(_TEXTS, min_size=2, max_size=8), pick=st.data())
def test_similarity_clusters_at_a_threshold_equal_to_a_pairs_ratio(texts, pick):
    """The threshold set to a pair's own difflib ratio: that pair sits exactly on it, so
    the pre-filter must let it through; the clusters equal the literal loop's."""
    i, j = pick.draw(st.integers(0, len(texts) - 1)), pick.draw(st.integers(0, len(texts) - 1))
    thresh = SequenceMatcher(None, texts[i], texts[j]).ratio()
    if not 0.0 < thresh < 1.0:
        thresh = 0.5
    n = len(texts)
    from hgpo import StepBatch

    batch = StepBatch(np.zeros(n, np.int64), np.arange(n), np.zeros(n, np.int64), np.zeros(n),
                      np.zeros(n, np.int64))  # fmt: skip
    got = similarity_clusters(batch, texts, thresh)
    want = [c for _, c in ref_similarity_clusters(batch, texts, thresh)]
    np.testing.assert_array_equal(got, want)


def test_similarity_clusters_keep_to_the_memory_budget(monkeypatch):
    """Issue 38 item 12: the pairwise bounds of a rollout group's D distinct observations were
    one D x D matrix (12,000 texts: a MemoryError after 3.4 GB); now they come block by block
    of rows against the representatives, under SIMILARITY_BLOCK_BYTES (here 32 KiB, so 200
    texts take many blocks), and the clusters are still the literal loop's."""
    import tracemalloc

    from hgpo import StepBatch
    from hgpo import gigpo_variants as gv

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefgh "))
    templates = ["".join(rng.choice(letters, 60)) for _ in range(20)]
    texts = []
    for _ in range(200):  # a template with 0..11 characters changed
        t = np.array(list(templates[rng.integers(20)]))
        t[rng.integers(0, 60, rng.integers(0, 12))] = rng.choice(letters)
        texts.append("".join(t))
    n = len(texts)
    batch = StepBatch(np.zeros(n, np.int64), np.arange(n), np.zeros(n, np.int64), np.zeros(n),
                      np.zeros(n, np.int64))  # fmt: skip
    monkeypatch.setattr(gv, "SIMILARITY_BLOCK_BYTES", 32 << 10, raising=False)
    gv.lcs_bounds(["a"])  # (rapidfuzz imported before the count)
    tracemalloc.start()
    try:
        got = similarity_clusters(batch, texts, 0.7)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, f"peak {peak} bytes"  # one 200 x 200 array of bounds: 320 KB
    want = [c for _, c in ref_similarity_clusters(batch, texts, 0.7)]
    np.testing.assert_array_equal(got, want)
    assert 10 < max(want) < 50  # the texts do cluster (and not all into one)
