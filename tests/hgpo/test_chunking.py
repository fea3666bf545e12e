"""Chunks of whole rollout groups give the same hierarchy as one pass over the batch."""

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hgpo.keys
import hgpo.returns
from hgpo import StepBatch, compute_advantages, discounted_returns
from hgpo.keys import hierarchy
from tests.hgpo.reference_impl import ref_estimate
from tests.hgpo.strategies import configs, step_batches


def _canonical(ids: np.ndarray) -> np.ndarray:
    """Relabel group ids by first appearance, so that equal partitions compare equal."""
    out = np.full_like(ids, -1)
    seen: dict[int, int] = {}
    for i, v in enumerate(ids.tolist()):
        if v >= 0:
            out[i] = seen.setdefault(v, len(seen))
    return out


def _interleaved(batch: StepBatch, perm: list[int]) -> StepBatch:
    rows = np.concatenate(
        [np.arange(batch.traj_start[i], batch.traj_start[i] + batch.traj_len[i]) for i in perm]
    )
    inv = None if batch.invalid is None else batch.invalid[rows]
    return StepBatch(
        batch.group[rows], batch.traj[rows], batch.step[rows], batch.reward[rows],
        batch.state[rows], batch.action[rows], inv,
    )  # fmt: skip


@given(batch=step_batches(max_groups=5), cfg=configs(), data=st.data())
def test_chunked_hierarchy_equals_one_pass(batch, cfg, data):
    """Any chunk size, with rollout groups contiguous or interleaved in the batch."""
    if data.draw(st.booleans()):
        batch = _interleaved(batch, data.draw(st.permutations(list(range(batch.n_traj)))))
    R = np.arange(batch.n_steps, dtype=np.float64) % 3 + batch.reward
    opts = dict(include_actions=cfg.include_actions, early=cfg.early, norm=cfg.norm, std=cfg.std)
    whole = hierarchy(batch, cfg.K, R, chunk_rows=batch.n_steps, **opts)
    chunk_rows = data.draw(st.integers(1, max(1, batch.n_steps - 1)))
    parts = hierarchy(batch, cfg.K, R, chunk_rows=chunk_rows, **opts)
    for k in range(cfg.K + 1):
        np.testing.assert_array_equal(_canonical(parts.ids[k]), _canonical(whole.ids[k]))
        np.testing.assert_array_equal(parts.size_of_row(k), whole.size_of_row(k))
    np.testing.assert_array_equal(parts.advantages, whole.advantages)
    np.testing.assert_array_equal(parts.informative, whole.informative)


@contextmanager
def _chunk_rows(rows: int):
    """Every estimator call in the block works in chunks of at most ``rows`` rows."""
    saved = hgpo.keys.CHUNK_ROWS
    hgpo.keys.CHUNK_ROWS = rows
    try:
        yield
    finally:
        hgpo.keys.CHUNK_ROWS = saved


@given(batch=step_batches(max_groups=5), cfg=configs(), data=st.data())
def test_estimators_in_tiny_chunks(batch, cfg, data):
    """Chunks of 1-3 rows: the estimators still equal the reference and their one-pass selves."""
    if data.draw(st.booleans()):
        batch = _interleaved(batch, data.draw(st.permutations(list(range(batch.n_traj)))))
    names = ("stepwise", "oracle", "hgpo-nohog2", "gigpo", "hgpo", "hgpo-uniform")
    whole = [compute_advantages(name, batch, cfg).advantages for name in names]
    with _chunk_rows(data.draw(st.integers(1, 3))):
        parts = [compute_advantages(name, batch, cfg).advantages for name in names]
    for name, a, b in zip(names, parts, whole, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
        if name in ("stepwise", "oracle", "hgpo-nohog2"):
            np.testing.assert_allclose(a, ref_estimate(name, batch, cfg), rtol=1e-12, atol=1e-12)


@given(batch=step_batches(max_groups=5), cfg=configs(), data=st.data())
def test_diagnostics_match_the_groups(batch, cfg, data):
    """The per-level diagnostics, accumulated chunk by chunk, describe ``level_groups``."""
    with _chunk_rows(data.draw(st.integers(1, 4))):
        out = compute_advantages("hgpo", batch, cfg)
    n = batch.n_steps
    for k in range(cfg.K + 1):
        ids = out.level_groups[k]
        d = out.diagnostics["levels"][k]
        sizes = np.bincount(ids[ids >= 0]) if (ids >= 0).any() else np.zeros(0, np.int64)
        assert (sizes > 0).all() and d["n_groups"] == sizes.size
        hist = np.bincount(sizes, weights=sizes).astype(np.int64) if sizes.size else []
        np.testing.assert_array_equal(d["step_size_hist"], np.trim_zeros(np.asarray(hist), "b"))
        assert d["utilisation"] == sizes[sizes >= 2].sum() / n
        assert d["left_out"] == 1.0 - sizes.sum() / n
        assert d["mean_group_size"] == (sizes.mean() if sizes.size else 0.0)


@pytest.mark.parametrize("block_rows", [1, 7, 1 << 16])
@pytest.mark.parametrize("lengths", [[3, 5, 4, 5], [1] * 40 + [60] + [2] * 9])
def test_returns_in_blocks_are_the_exact_recursion(block_rows, lengths, monkeypatch):
    """Both vectorisations (table by step index, rows by distance to the end), any block
    size, give bit for bit the recursion R_t = r_t + gamma R_{t+1} from the last step."""
    monkeypatch.setattr(hgpo.returns, "_BLOCK_ROWS", block_rows)
    rng = np.random.default_rng(len(lengths))
    rewards = [rng.choice([0.0, 0.1, 1.0001, -0.5, 10.0], T) for T in lengths]
    batch = StepBatch.from_trajectories(
        [i % 3 for i in range(len(lengths))], rewards, [np.zeros(T, int) for T in lengths]
    )
    for gamma in (0.95, 1.0, 0.5):
        expect = []
        for r in rewards:
            running, R = None, []
            for x in r[::-1]:
                running = x if running is None else x + gamma * running
                R.append(running)
            expect.extend(R[::-1])
        np.testing.assert_array_equal(discounted_returns(batch, gamma), expect)
