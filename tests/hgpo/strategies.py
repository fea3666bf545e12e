"""Hypothesis strategies for step batches that stress the estimators' edge cases."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from hgpo import EstimatorConfig, StepBatch

# Tied and near-tied rewards (1.0 vs 1.0001, 0.1 whose sums round) are the point of the set.
REWARDS = st.sampled_from([0.0, 0.0, 0.0, 1.0, 1.0001, 0.1, 10.0, -0.5, 3.0])


@st.composite
def step_batches(draw, max_groups: int = 3, max_traj: int = 4, max_len: int = 7, n_states: int = 3):
    """Batches with singleton groups, single-trajectory groups, revisited states within one
    trajectory, trajectories shorter than K, and tied / near-tied returns."""
    n_groups = draw(st.integers(1, max_groups))
    groups, rewards, states, actions, invalid = [], [], [], [], []
    group_ids = draw(
        st.lists(st.integers(-5, 50), min_size=n_groups, max_size=n_groups, unique=True)
    )
    for g in group_ids:
        for _ in range(draw(st.integers(1, max_traj))):
            T = draw(st.integers(1, max_len))
            groups.append(g)
            rewards.append(draw(st.lists(REWARDS, min_size=T, max_size=T)))
            states.append(draw(st.lists(st.integers(0, n_states - 1), min_size=T, max_size=T)))
            actions.append(draw(st.lists(st.integers(0, 1), min_size=T, max_size=T)))
            invalid.append(draw(st.lists(st.booleans(), min_size=T, max_size=T)))
    with_invalid = draw(st.booleans())
    b = StepBatch.from_trajectories(
        groups, rewards, states, actions, invalid if with_invalid else None
    )
    if draw(st.booleans()):  # arbitrary (non-dense, shuffled) trajectory ids
        perm = draw(st.permutations(list(range(b.n_traj))))
        ids = np.asarray(perm, dtype=np.int64)[b.traj_index] * 7 + 3
        b = StepBatch(b.group, ids, b.step, b.reward, b.state, b.action, b.invalid)
    return b


@st.composite
def configs(draw) -> EstimatorConfig:
    return EstimatorConfig(
        K=draw(st.integers(0, 4)),
        alpha=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
        gamma=draw(st.sampled_from([0.95, 1.0, 0.5, 0.0])),
        norm=draw(st.sampled_from(["mean_std", "mean"])),
        std=draw(st.sampled_from(["population", "sample"])),
        episode_std=draw(st.sampled_from(["population", "sample"])),
        early=draw(st.sampled_from(["paper", "drop"])),
        weight_offset=draw(st.sampled_from([1.0, 2.0])),
        weight_eps=draw(st.sampled_from([0.0, 1e-6])),
        zero_rule=draw(st.sampled_from(["degenerate", "value", "none"])),
        base_group=draw(st.booleans()),
        include_actions=draw(st.booleans()),
        penalty_mode=draw(st.sampled_from(["return", "after_discount"])),
        episode_pooling=draw(st.sampled_from(["trajectory", "steps"])),
        episode_singleton=draw(st.sampled_from(["zero", "raw"])),
        omega=draw(st.sampled_from([1.0, 0.5])),
        leave_one_out=draw(st.booleans()),
    )


@st.composite
def spo3_options(draw) -> dict:
    """3SPO's own options (EstimatorConfig's spo3_* fields), edge values included."""
    return dict(
        spo3_alpha=draw(st.sampled_from([0.0, 0.5, 1.0, 50.0])),
        spo3_xi=draw(st.sampled_from([0.0, 1.0, 2.0, 10.0])),
        spo3_zeta=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        spo3_omega_k=draw(st.sampled_from([0.0, 0.1, 1.0])),
        spo3_eps=draw(st.sampled_from([0.0, 1e-6])),
        spo3_count_scope=draw(st.sampled_from(["batch", "group"])),
        spo3_target=draw(st.sampled_from(["reward", "return"])),
        spo3_terminal_score=draw(st.sampled_from([1.0, 0.0, 0.5])),
    )
