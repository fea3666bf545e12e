"""mtgrpo (MT-GRPO per-turn-index normalisation, verl RFC #7244) on hand-worked batches.

No public code implements the RFC's variable-turn construction (MT-GRPO's code has two fixed
turns), so these small cases are worked by hand from the definition (hgpo/mtgrpo.py)."""

import numpy as np
import pytest

from hgpo import EstimatorConfig, StepBatch, compute_advantages

# One group: trajectory A takes 3 turns with rewards 1, 0, 2; trajectory B stops after one
# turn with reward 3. Returns-to-go: A 3, 2, 2; B 3.
TWO = StepBatch(group=[0, 0, 0, 0], traj=[0, 0, 0, 1], step=[0, 1, 2, 0],
                reward=[1.0, 0.0, 2.0, 3.0], state=[0, 1, 2, 0])  # fmt: skip


def _adv(batch, **opts):
    cfg = EstimatorConfig(norm="mean", gamma=1.0).replace(**opts)
    return compute_advantages("mtgrpo", batch, cfg).advantages


def test_own_turns_subtracts_the_means_of_its_own_turns_only():
    # turn 0: mean(1, 3) = 2 -> A: -1, B: +1; turns 1, 2: A alone -> 0
    np.testing.assert_allclose(_adv(TWO), [-1.0, 0.0, 0.0, 1.0])
    # leave-one-out: the other member's reward, n / (n - 1) = 2 times the centred value
    np.testing.assert_allclose(_adv(TWO, leave_one_out=True), [-2.0, 0.0, 0.0, 2.0])


def test_all_turns_is_the_return_to_go_less_the_groups_mean():
    # turn means with B's ended turns as 0: 2, 0, 1 -> A: 0, 1, 1; B: 3 - (2 + 0 + 1) = 0,
    # i.e. R_t - mean_j R_t^j with R_t^B = 0 for t >= 1 (means 3, 1, 1)
    np.testing.assert_allclose(_adv(TWO, mtgrpo_baseline="all_turns"), [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(
        _adv(TWO, mtgrpo_baseline="all_turns", leave_one_out=True), [0.0, 2.0, 2.0, 0.0]
    )


def test_std_normalisation_and_discount():
    # population std of (1, 3) and of (2, 0) is 1: the same values as the mean case
    a = _adv(TWO, mtgrpo_baseline="all_turns", norm="mean_std", eps=0.0)
    np.testing.assert_allclose(a, [0.0, 1.0, 1.0, 0.0])
    # gamma 0.5: A_0 = -1 + 0.5 * 0 + 0.25 * 1, B_0 = 1 + 0.5 * 0 + 0.25 * (-1)
    a = _adv(TWO, mtgrpo_baseline="all_turns", gamma=0.5)
    np.testing.assert_allclose(a, [-0.75, 0.5, 1.0, 0.75])


def test_invalid_penalty_is_a_turn_reward():
    b = StepBatch(group=[0, 0], traj=[0, 1], step=[0, 0], reward=[0.0, 0.0], state=[0, 0],
                  invalid=[True, False])  # fmt: skip
    np.testing.assert_allclose(_adv(b), [-0.05, 0.05])


def test_equal_lengths_make_both_baselines_agree():
    rng = np.random.default_rng(0)
    n_traj, T = 6, 4
    b = StepBatch(group=np.repeat([0, 1], 3 * T), traj=np.repeat(np.arange(n_traj), T),
                  step=np.tile(np.arange(T), n_traj), reward=rng.normal(size=n_traj * T),
                  state=np.zeros(n_traj * T, dtype=int))  # fmt: skip
    for opts in ({}, {"norm": "mean_std"}, {"leave_one_out": True}, {"gamma": 0.9}):
        np.testing.assert_allclose(
            _adv(b, **opts), _adv(b, mtgrpo_baseline="all_turns", **opts), atol=1e-12
        )


def test_bad_option_is_one_line():
    with pytest.raises(ValueError, match="mtgrpo_baseline"):
        EstimatorConfig(mtgrpo_baseline="own")


def test_two_turns_equal_mt_grpo_aae_assignment():
    """MT-GRPO's "aae" advantage (SiliangZeng/Multi-Turn-RL-Agent at 7860de6,
    verifiers/trainers/mt_grpo_env_trainer.py: _compute_normalized_advantages and
    _assign_advantages, turn_advantage_coef 1): each reward normalised in its group as
    (r - mean) / (sample std + 1e-4); the first turn's tokens get outcome + turn advantage,
    the second turn's the outcome advantage. Written here in numpy from that code (their
    trainer needs trl and vLLM; no outputs of it were recorded): mtgrpo with two turns per
    trajectory, norm mean_std, sample std, eps 1e-4, gamma 1, is the same."""
    rng = np.random.default_rng(1)
    G, groups = 4, 3
    turn = rng.choice([0.0, 0.5, 1.0], size=(groups, G))
    outcome = rng.choice([0.0, 1.0], size=(groups, G))

    def norm(x):
        return (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, ddof=1, keepdims=True) + 1e-4)

    first, second = norm(outcome) + norm(turn), norm(outcome)
    n = groups * G
    b = StepBatch(group=np.repeat(np.arange(groups), 2 * G), traj=np.repeat(np.arange(n), 2),
                  step=np.tile([0, 1], n), reward=np.stack([turn.ravel(), outcome.ravel()], 1).ravel(),
                  state=np.zeros(2 * n, dtype=int))  # fmt: skip
    for base in ("own_turns", "all_turns"):
        a = _adv(b, norm="mean_std", std="sample", eps=1e-4, mtgrpo_baseline=base)
        np.testing.assert_allclose(a[0::2], first.ravel(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a[1::2], second.ravel(), rtol=1e-12, atol=1e-12)
