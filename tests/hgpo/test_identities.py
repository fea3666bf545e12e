"""Identities between estimators and structural properties of the groups."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hgpo import StepBatch, compute_advantages, context_keys
from tests.hgpo.strategies import configs, step_batches


@given(batch=step_batches(), cfg=configs())
def test_hgpo_with_k0_is_stepwise(batch, cfg):
    cfg = cfg.replace(K=0, base_group=False, weight_eps=0.0)
    np.testing.assert_allclose(
        compute_advantages("hgpo", batch, cfg).advantages,
        compute_advantages("stepwise", batch, cfg).advantages,
        rtol=1e-14,
        atol=1e-14,
    )


@given(batch=step_batches(), cfg=configs())
def test_uniform_is_alpha_zero(batch, cfg):
    np.testing.assert_array_equal(
        compute_advantages("hgpo-uniform", batch, cfg).advantages,
        compute_advantages("hgpo", batch, cfg.replace(alpha=0.0)).advantages,
    )


@given(batch=step_batches(), cfg=configs())
def test_gigpo_is_grpo_plus_omega_stepwise(batch, cfg):
    g = compute_advantages("grpo", batch, cfg).advantages
    s = compute_advantages("stepwise", batch, cfg).advantages
    np.testing.assert_allclose(
        compute_advantages("gigpo", batch, cfg).advantages, g + cfg.omega * s
    )


@given(batch=step_batches(max_len=9), cfg=configs())
def test_groups_nested_and_within_rollout_group(batch, cfg):
    """Eq. (5): same level-k key implies same level-(k-1) key; keys never span rollout groups."""
    keys = context_keys(batch, cfg.K, cfg.include_actions, cfg.early)
    for k in range(cfg.K + 1):
        for key in np.unique(keys[k][keys[k] >= 0]):
            rows = keys[k] == key
            assert np.unique(batch.group[rows]).size == 1
            if k > 0:
                assert np.unique(keys[k - 1][rows]).size == 1
    # Group sizes never grow with k (nesting).
    sizes = [np.bincount(kk[kk >= 0])[kk[kk >= 0]] for kk in keys]
    for k in range(1, cfg.K + 1):
        member = keys[k] >= 0
        prev = np.bincount(keys[k - 1][keys[k - 1] >= 0])[keys[k - 1][member]]
        assert (sizes[k] <= prev).all()


@given(batch=step_batches(), cfg=configs(), data=st.data())
def test_trajectory_order_does_not_matter(batch, cfg, data):
    """Shuffling whole trajectories in the batch permutes the advantages with them."""
    perm = data.draw(st.permutations(list(range(batch.n_traj))))
    rows = np.concatenate(
        [np.arange(batch.traj_start[i], batch.traj_start[i] + batch.traj_len[i]) for i in perm]
    )
    shuffled = StepBatch(
        batch.group[rows],
        batch.traj[rows],
        batch.step[rows],
        batch.reward[rows],
        batch.state[rows],
        batch.action[rows],
        None if batch.invalid is None else batch.invalid[rows],
    )
    for name in ("grpo", "rloo", "gigpo", "hgpo", "hgpo-nohog2", "oracle", "g2po", "gagpo"):
        a = compute_advantages(name, batch, cfg).advantages[rows]
        b = compute_advantages(name, shuffled, cfg).advantages
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@given(batch=step_batches(), cfg=configs())
def test_hgpo_is_a_convex_combination_of_levels(batch, cfg):
    """With the paper's options A^H lies between the smallest and largest nonzero A_k."""
    cfg = cfg.replace(base_group=False, weight_eps=0.0, zero_rule="degenerate")
    out = compute_advantages("hgpo", batch, cfg)
    A = out.level_advantages
    used = out.diagnostics["used"]
    for i in range(batch.n_steps):
        vals = A[:, i][used[:, i]]
        if vals.size == 0:
            assert out.advantages[i] == 0
        else:
            assert vals.min() - 1e-12 <= out.advantages[i] <= vals.max() + 1e-12


def test_rloo_is_scaled_grpo_in_mean_mode():
    b = StepBatch.from_trajectories([0, 0, 0, 1, 1], [[1], [2], [6], [0], [5]], [[0]] * 5)
    g = compute_advantages("grpo", b, norm="mean").advantages
    r = compute_advantages("rloo", b, norm="mean").advantages
    np.testing.assert_allclose(r, g * np.array([1.5, 1.5, 1.5, 2, 2]))


def test_diagnostics_utilisation():
    # Group 0: three trajectories over states [0, 1], [0, 2], [0, 1]. Level 0 groups: {0 x3},
    # {1 x2}, {2 x1}: 5 of 6 steps in groups of >= 2 -> utilisation 5/6.
    b = StepBatch.from_trajectories([0, 0, 0], [[0, 1], [0, 0], [0, 1]], [[0, 1], [0, 2], [0, 1]])
    d = compute_advantages("hgpo", b, K=1).diagnostics["levels"]
    assert d[0]["utilisation"] == 5 / 6
    assert d[0]["step_size_hist"].tolist() == [0, 1, 2, 3]
    # Level 1 (paper rule): (0) x3 at t=0, (0,1) x2, (0,2) x1: also 5/6.
    assert d[1]["utilisation"] == 5 / 6
