"""3SPO (hgpo/threespo.py): a hand-worked batch, the counts on a branched batch, the allocation,
and named errors for bad options."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hgpo import EstimatorConfig, StepBatch, compute_advantages
from hgpo.options import OptionError
from hgpo.threespo import rollout_allocation, state_score, state_visits, threespo

# One rollout group of three two-step trajectories; alpha = 1, eps' = 0, omega_k = ln 2 (so
# w(N) = 0.5 * 2^-N), xi = 10, zeta = 0.1, norm = "mean".
#   tau1: s = [0, 1], r = [0, 10]  (success: last reward 10 > 0)
#   tau2: s = [0, 2], r = [0, 0]
#   tau3: s = [0, 0], r = [0, 0]   (stays in 0: R_novel = 0 at its step 0)
# Counts (each trajectory counts a state once): N(0) = 3, W(0) = 1; N(1) = 1, W(1) = 1;
#   N(2) = 1, W(2) = 0; t = 1 + 3 = 4, lambda = ln 4. N_fail < 10 everywhere: no truncation.
#   S(0) = exp(-ln4 / 3) = 4^(-1/3) = 0.6299605;  S(1) = exp(-ln 4) = 1/4;  S(2) = exp(0) = 1.
#   w(3) = 1/16, w(1) = 1/4. After a last step: R_novel = 1, S = 1 (a never-counted state).
# R_3SPO = w R_novel + (0.5 - w)(S(s_t) - S(s_t+1)) + 0.5 r_t:
#   tau1 t=0: 1/16 + 7/16 (S0 - 1/4)            = 0.2287327
#   tau1 t=1: 1/4 + 1/4 (1/4 - 1) + 0.5 * 10      = 5.0625
#   tau2 t=0: 1/16 + 7/16 (S0 - 1)              = -0.0993923
#   tau2 t=1: 1/4 + 1/4 (1 - 1)                   = 0.25
#   tau3 t=0: 0 + 7/16 (S0 - S0)                  = 0
#   tau3 t=1: 1/16 + 7/16 (S0 - 1)              = -0.0993923
# Groups (group, s_t): state 0 = {tau1 t0, tau2 t0, tau3 t0, tau3 t1}, mean m = (R10 + 2 R20) / 4;
#   states 1 and 2 are singletons -> 0.
S0 = 4 ** (-1 / 3)
R10 = 1 / 16 + 7 / 16 * (S0 - 0.25)
R20 = 1 / 16 + 7 / 16 * (S0 - 1.0)
M = (R10 + 0.0 + 2 * R20) / 4
BATCH = StepBatch.from_trajectories(
    groups=[0, 0, 0], rewards=[[0, 10], [0, 0], [0, 0]], states=[[0, 1], [0, 2], [0, 0]]
)
CFG = EstimatorConfig(
    norm="mean", spo3_alpha=1.0, spo3_eps=0.0, spo3_omega_k=math.log(2.0), spo3_xi=10.0
)


def test_hand_worked_shaped_rewards_and_advantages():
    out = compute_advantages("3spo", BATCH, CFG)
    np.testing.assert_allclose(
        out.returns, [R10, 5.0625, R20, 0.25, 0.0, R20], rtol=1e-14, atol=1e-15
    )
    np.testing.assert_allclose(
        out.advantages, [R10 - M, 0.0, R20 - M, 0.0, 0.0 - M, R20 - M], rtol=1e-13, atol=1e-15
    )
    spo3 = out.diagnostics["spo3"]
    np.testing.assert_allclose(spo3["state_score"], [S0, 0.25, S0, 1.0, S0, S0], rtol=1e-15)
    assert spo3["n_total"].tolist() == [3, 1, 3, 1, 3, 3]
    assert spo3["n_success"].tolist() == [1, 1, 1, 0, 1, 1]
    assert spo3["t"].tolist() == [4] * 6


def test_next_state_after_the_last_step():
    # The same batch with next_state: tau1 ends in a new observation 9 (never counted: S = 1, as
    # without the column), tau2 in observation 0 (counted: S(0) = S0, R_novel = 1), tau3 stays
    # in 0 (R_novel = 0, S(0) - S(0) = 0):
    #   tau2 t=1: 1/4 + 1/4 (S(2) - S0) = 1/4 + 1/4 (1 - S0);   tau3 t=1: 0 + 7/16 * 0 = 0.
    ns = np.array([1, 9, 2, 0, 0, 0])
    b = StepBatch(BATCH.group, BATCH.traj, BATCH.step, BATCH.reward, BATCH.state, next_state=ns)
    out = compute_advantages("3spo", b, CFG)
    np.testing.assert_allclose(
        out.returns, [R10, 5.0625, R20, 0.25 + 0.25 * (1 - S0), 0.0, 0.0], rtol=1e-14, atol=1e-15
    )
    # spo3_terminal_score only for a never-counted observation (tau1's 9)
    out0 = compute_advantages("3spo", b, CFG.replace(spo3_terminal_score=0.0))
    assert out0.returns[1] == 0.25 + 0.25 * 0.25 + 5.0 and out0.returns[3] == out.returns[3]


def test_truncation_and_scope():
    # xi = 2: state 0 has N_fail = 2 >= 2 and rate 1/3 > 0.1 -> kept; zeta = 0.5: 1/3 <= 0.5
    # and N_fail = 2 >= 2 -> S(0) = 0 (the authors' "too hard: truncated").
    S = compute_advantages("3spo", BATCH, CFG.replace(spo3_xi=2.0)).diagnostics["spo3"]
    assert S["state_score"][0] == pytest.approx(S0)
    S = compute_advantages("3spo", BATCH, CFG.replace(spo3_xi=2.0, spo3_zeta=0.5))
    assert S.diagnostics["spo3"]["state_score"][0] == 0.0
    # group scope: a second group's visits of state 0 do not count for the first group
    two = StepBatch.from_trajectories(
        groups=[0, 0, 0, 1], rewards=[[0, 10], [0, 0], [0, 0], [0, 10]],
        states=[[0, 1], [0, 2], [0, 0], [0, 1]],
    )  # fmt: skip
    batch = state_visits(two, "batch")
    group = state_visits(two, "group")
    assert batch.n_total[:6].tolist() == [4, 2, 4, 1, 4, 4] and batch.t.tolist() == [5] * 8
    assert group.n_total.tolist() == [3, 1, 3, 1, 3, 3, 1, 1]
    assert group.t.tolist() == [4] * 6 + [2] * 2


def test_branch_counts_its_parents_prefix():
    # tau0: s = [5, 6, 7] (fails); its branch at step 2 (state 7) plays [7, 8] and wins.
    # V(branch) = [5, 6, 7, 8]: states 5 and 6 are visited by both trajectories.
    b = StepBatch(
        group=[0] * 5, traj=[0, 0, 0, 1, 1], step=[0, 1, 2, 2, 3], reward=[0, 0, 0, 0, 10],
        state=[5, 6, 7, 7, 8], parent=[-1, -1, -1, 0, 0],
    )  # fmt: skip
    v = state_visits(b)
    assert v.n_total.tolist() == [2, 2, 2, 2, 1]
    assert v.n_success.tolist() == [1, 1, 1, 1, 1]
    # only finished trajectories, e.g. the root: the branch's rows keep their states' counts
    v = state_visits(b, counted=np.array([True, False]))
    assert v.n_total.tolist() == [1, 1, 1, 1, 0] and v.t.tolist() == [2] * 5


def test_allocation_is_ceil_g_max_score():
    cfg = EstimatorConfig()  # alpha = 50, xi = 10, zeta = 0.1
    S = state_score(np.array([0, 1, 1, 10, 12, 4]), np.array([0, 0, 1, 0, 1, 2]), 5, cfg)
    # unseen -> 1; never won -> exp(0) = 1; won once in one visit -> exp(-50 ln5 / (1 + 1e-6))
    # (> 0: n = 1); 10 failures, rate 0 <= 0.1 -> 0; 11 failures, rate 1/12 <= 0.1 -> 0;
    # rate 1/2 > 0.1 -> exp(-50 ln5 / 2 (1 - 2.5e-7)) (tiny, n = 1).
    assert S[0] == S[1] == 1.0 and S[3] == S[4] == 0.0 and 0 < S[2] < 1e-30 and 0 < S[5] < 1e-10
    assert rollout_allocation(S, 8).tolist() == [8, 8, 1, 0, 0, 1]
    assert rollout_allocation(np.array([0.5, 0.51, 1 / 8]), 8).tolist() == [4, 5, 1]


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"spo3_alpha": -1.0}, r"EstimatorConfig.spo3_alpha: must be a finite number in \[0.0, "),
        ({"spo3_alpha": float("inf")}, r"spo3_alpha: must be a finite number"),
        ({"spo3_xi": float("nan")}, r"spo3_xi: must be a finite number"),
        ({"spo3_zeta": 1.5}, r"spo3_zeta: must be a finite number in \[0.0, 1.0\], got 1.5"),
        ({"spo3_omega_k": -0.1}, r"spo3_omega_k: must be"),
        ({"spo3_eps": 2.0}, r"spo3_eps: must be a finite number in \[0.0, 1.0\], got 2.0"),
        ({"spo3_g_max": 0}, r"spo3_g_max: must be an integer in 1..4096, got 0"),
        ({"spo3_count_scope": "task"}, r"spo3_count_scope: must be one of 'batch', 'group'"),
        ({"spo3_target": "advantage"}, r"spo3_target: must be one of 'reward', 'return'"),
        ({"spo3_terminal_score": 2.0}, r"spo3_terminal_score: must be a finite number in"),
        ({"spo3_alpa": 1.0}, r"unknown estimator option 'spo3_alpa'"),
    ],
)
def test_bad_options_are_named_errors(opts, message):
    with pytest.raises(ValueError, match=message):
        compute_advantages("3spo", BATCH, **opts)


def test_bad_calls_are_named_errors():
    with pytest.raises(ValueError, match=r"estimator '3spo': batch must be a StepBatch"):
        threespo({"reward": [1.0]}, EstimatorConfig())
    with pytest.raises(ValueError, match=r"estimator '3spo': config must be an EstimatorConfig"):
        threespo(BATCH, {"spo3_alpha": 1.0})
    with pytest.raises(ValueError, match=r"values: estimator '3spo' does not read state values"):
        compute_advantages("3spo", BATCH, values=np.zeros(6))
    with pytest.raises(ValueError, match=r"counted: must be bool\[3\], one flag per trajectory"):
        state_visits(BATCH, counted=np.ones(2, dtype=bool))
    with pytest.raises(OptionError, match=r"spo3_count_scope: must be one of 'batch', 'group'"):
        state_visits(BATCH, "task")
    with pytest.raises(OptionError, match=r"spo3_g_max: must be an integer in 1..4096, got 0"):
        rollout_allocation(np.ones(2), 0)
    with pytest.raises(
        OptionError, match=r"score\[1\]: must be a state score in \[0, 1\], got 1.5"
    ):
        rollout_allocation(np.array([0.5, 1.5]), 8)
