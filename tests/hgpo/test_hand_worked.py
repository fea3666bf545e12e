"""Hand-worked examples: the arithmetic is in the comments, the numbers are derived there."""

import numpy as np
import pytest

from hgpo import EstimatorConfig, StepBatch, compute_advantages

# One rollout group of five two-step trajectories, gamma = 1, norm = "mean" (exact arithmetic).
# States: 1 and 2 are two start rooms, 3 is the shared room ("You arrive at fridge 1").
#   tau1: s = [1, 3], r = [0, 10] -> R = [10, 10]
#   tau2: s = [2, 3], r = [0, 0]  -> R = [0, 0]
#   tau3: s = [2, 3], r = [0, 0]  -> R = [0, 0]
#   tau4: s = [1, 3], r = [0, 10] -> R = [10, 10]
#   tau5: s = [1, 3], r = [0, 0]  -> R = [0, 0]
# Level 0 at state 3 mixes the histories (1, 3) and (2, 3): GiGPO's step group
#   G_0(3) = {10, 0, 0, 10, 0}, mean 4 -> A_0 = [6, -4, -4, 6, -4].
# Level 1 splits it: G_1((1,3)) = {10, 10, 0}, mean 20/3 -> A_1 = [10/3, 10/3, -20/3] (tau1, 4, 5);
#   G_1((2,3)) = {0, 0}: tied -> A_1 = 0 (left out of Eq. 7's sums).
# HGPO, K = 1, alpha = 1, weights (k+1): w_0 = 1, w_1 = 2:
#   tau1 t=1: (1 * 6 + 2 * 10/3) / 3 = (18/3 + 20/3) / 3 = 38/9
#   tau5 t=1: (1 * -4 + 2 * -20/3) / 3 = (-12/3 - 40/3) / 3 = -52/9
#   tau2 t=1: level 1 is 0, so A^H = A_0 = -4
# t = 0: G_0(1) = {10, 10, 0} -> [10/3, 10/3, -20/3]; G_0(2) = {0, 0} -> 0. C_1(s_0) = (s_0), the
#   same sets, so A_1 = A_0 and A^H = (1 * A_0 + 2 * A_0) / 3 = A_0.
# GiGPO: episode returns E = [10, 0, 0, 10, 0], mean 4 -> [6, -4, -4, 6, -4] on every step, plus A_0:
#   tau1 t=1: 6 + 6 = 12;  tau5 t=1: -4 + -4 = -8;  tau1 t=0: 6 + 10/3 = 28/3.
BATCH = StepBatch.from_trajectories(
    groups=[0] * 5,
    rewards=[[0, 10], [0, 0], [0, 0], [0, 10], [0, 0]],
    states=[[1, 3], [2, 3], [2, 3], [1, 3], [1, 3]],
)
MEAN = EstimatorConfig(K=1, gamma=1.0, norm="mean")
# rows: tau1 = 0,1; tau2 = 2,3; tau3 = 4,5; tau4 = 6,7; tau5 = 8,9


def test_stepwise_mixes_histories():
    a = compute_advantages("stepwise", BATCH, MEAN).advantages
    np.testing.assert_allclose(a[[1, 3, 5, 7, 9]], [6, -4, -4, 6, -4])
    np.testing.assert_allclose(a[[0, 2, 4, 6, 8]], [10 / 3, 0, 0, 10 / 3, -20 / 3])


def test_hgpo_separates_histories():
    a = compute_advantages("hgpo", BATCH, MEAN).advantages
    np.testing.assert_allclose(a[[1, 3, 5, 7, 9]], [38 / 9, -4, -4, 38 / 9, -52 / 9])
    np.testing.assert_allclose(a[[0, 2, 4, 6, 8]], [10 / 3, 0, 0, 10 / 3, -20 / 3])


def test_gigpo_episode_plus_step():
    a = compute_advantages("gigpo", BATCH, MEAN).advantages
    np.testing.assert_allclose(a[[0, 1, 9]], [28 / 3, 12, -8])


def test_oracle_and_nohog2():
    # oracle = A_1 only: tau2's (2, 3) group is tied -> 0.
    a = compute_advantages("oracle", BATCH, MEAN).advantages
    np.testing.assert_allclose(a[[1, 3, 9]], [10 / 3, 0, -20 / 3])
    # w/o HoG-2: |G_1| >= 2 everywhere here, so it equals the oracle (tied (2,3) stays 0).
    b = compute_advantages("hgpo-nohog2", BATCH, MEAN).advantages
    np.testing.assert_allclose(b, a)


def test_reference_preset_weights_and_early_rule():
    # Public code: early="drop", weights (k+2): level 0 -> 2, level 1 -> 3, weight sum + 1e-6.
    #   tau1 t=1: (2 * 6 + 3 * 10/3) / (5 + 1e-6) = 22 / (5 + 1e-6)
    #   tau1 t=0: only level 0 (t < 1 is dropped from level 1): 2 * 10/3 / (2 + 1e-6)
    cfg = MEAN.replace(early="drop", weight_offset=2.0, weight_eps=1e-6)
    a = compute_advantages("hgpo", BATCH, cfg).advantages
    assert a[1] == pytest.approx(22 / (5 + 1e-6), rel=1e-15)
    assert a[0] == pytest.approx(2 * 10 / 3 / (2 + 1e-6), rel=1e-15)


def test_grpo_mean_std_and_singletons():
    # Episode returns [10, 0, 0, 10, 0]: mean 4, population std sqrt((36*2 + 16*3)/5) = sqrt(24).
    a = compute_advantages("grpo", BATCH, MEAN.replace(norm="mean_std")).advantages
    assert a[0] == pytest.approx(6 / (np.sqrt(24) + 1e-6), rel=1e-14)
    # Sample std: sqrt(120 / 4) = sqrt(30).
    a = compute_advantages(
        "grpo", BATCH, MEAN.replace(norm="mean_std", episode_std="sample")
    ).advantages
    assert a[0] == pytest.approx(6 / (np.sqrt(30) + 1e-6), rel=1e-14)
    # A group of one trajectory: 0 (paper) or its own return (GiGPO code: mean 0, std 1).
    one = StepBatch.from_trajectories([0], [[0, 10]], [[1, 2]])
    assert compute_advantages("grpo", one, MEAN).advantages.tolist() == [0.0, 0.0]
    raw = MEAN.replace(episode_singleton="raw")
    assert compute_advantages("grpo", one, raw).advantages.tolist() == [10.0, 10.0]


def test_rloo_leave_one_out():
    # tau1: 10 - mean(0, 0, 10, 0) = 10 - 2.5 = 7.5;  tau2: 0 - mean(10, 0, 10, 0) = -5.
    a = compute_advantages("rloo", BATCH, MEAN).advantages
    np.testing.assert_allclose(a[[0, 2]], [7.5, -5.0])


def test_discounting_and_penalty_semantics():
    # One trajectory r = [0, 0, 10], invalid at t = 0, gamma = 0.5, penalty 0.1:
    #   paper ("return"): r' = [-0.1, 0, 10] -> R = [-0.1 + 0.5*5, 0 + 0.5*10, 10] = [2.4, 5, 10]
    #   public code ("after_discount"): R = [2.5, 5, 10] - [0.1, 0, 0] = [2.4, 5, 10] here too,
    #   but with the invalid step at t = 1 they differ: paper [0.5*4.9, 4.9, 10] = [2.45, 4.9, 10],
    #   public code [2.5, 4.9, 10] (the penalty is not propagated to t = 0).
    from hgpo import step_returns

    b = StepBatch.from_trajectories([0], [[0, 0, 10]], [[1, 2, 3]], invalid=[[False, True, False]])
    cfg = EstimatorConfig(gamma=0.5)
    np.testing.assert_allclose(step_returns(b, cfg), [2.45, 4.9, 10])
    np.testing.assert_allclose(
        step_returns(b, cfg.replace(penalty_mode="after_discount")), [2.5, 4.9, 10]
    )


def test_near_tied_group_is_not_zero_and_exact_tie_is():
    # Returns [1.0, 1.0001]: mean 1.00005, population std 0.00005 ->
    #   A = +-0.00005 / (0.00005 + 1e-6) = +-0.98039...  (an exact tie gives exactly 0).
    b = StepBatch.from_trajectories([0, 0], [[1.0], [1.0001]], [[1], [1]])
    a = compute_advantages("stepwise", b, EstimatorConfig()).advantages
    d = (1.0001 - 1.0) / 2
    np.testing.assert_allclose(a, [-d / (d + 1e-6), d / (d + 1e-6)], rtol=1e-12)
    tied = StepBatch.from_trajectories([0, 0, 0], [[0.1], [0.1], [0.1]], [[1], [1], [1]])
    assert compute_advantages("stepwise", tied, EstimatorConfig()).advantages.tolist() == [0.0] * 3


def test_gae_special_cases():
    # lambda = 1, V = 0: A_t = R_t.  lambda = 0: A_t = delta_t = r_t + gamma V_{t+1} - V_t.
    b = StepBatch.from_trajectories([0], [[0, 0, 10]], [[1, 2, 3]])
    cfg = EstimatorConfig(gamma=0.5, gae_lambda=1.0)
    np.testing.assert_allclose(
        compute_advantages("gae", b, cfg, values=np.zeros(3)).advantages, [2.5, 5, 10]
    )
    V = np.array([1.0, 2.0, 4.0])
    # delta = [0 + 0.5*2 - 1, 0 + 0.5*4 - 2, 10 + 0 - 4] = [0, 0, 6]
    a = compute_advantages("gae", b, cfg.replace(gae_lambda=0.0), values=V).advantages
    np.testing.assert_allclose(a, [0, 0, 6])


# Leave-one-out levels (leave_one_out=True): a step's baseline is the mean of the *other*
# members of its group. Same BATCH, K = 1, gamma = 1, norm = "mean":
# Level 0 at state 3, returns {10, 0, 0, 10, 0}:
#   tau1 (10): 10 - mean(0, 0, 10, 0) = 10 - 2.5 = 7.5;  tau2 (0): 0 - mean(10, 0, 10, 0) = -5
#   (= 5/4 * the group-mean deviations 6 and -4: n / (n - 1) with n = 5).
# Level 1, G_1((1,3)) = {10, 10, 0} (tau1, tau4, tau5):
#   tau1: 10 - mean(10, 0) = 5;  tau5: 0 - mean(10, 10) = -10  (= 3/2 * [10/3, -20/3]).
#   G_1((2,3)) = {0, 0}: tied -> 0, left out of Eq. 7.
# HGPO (w_0 = 1, w_1 = 2):
#   tau1 t=1: (1 * 7.5 + 2 * 5) / 3 = 17.5 / 3 = 35/6
#   tau5 t=1: (1 * -5 + 2 * -10) / 3 = -25/3
#   tau2 t=1: only level 0 -> -5
# t = 0: G_0(1) = G_1 = {10, 10, 0} -> [5, 5, -10] on both levels, so A^H = [5, 5, -10].
# stepwise = level 0 alone: tau1 t=1 7.5, tau2 t=1 -5.
# mean_std: the std stays the group's: level 0 at state 3, population std sqrt(24), so
#   tau1 t=1 stepwise = 7.5 / (sqrt(24) + eps).
LOO = MEAN.replace(leave_one_out=True)


def test_leave_one_out_levels():
    a = compute_advantages("hgpo", BATCH, LOO).advantages
    np.testing.assert_allclose(a[[1, 3, 5, 7, 9]], [35 / 6, -5, -5, 35 / 6, -25 / 3])
    np.testing.assert_allclose(a[[0, 2, 4, 6, 8]], [5, 0, 0, 5, -10])
    s = compute_advantages("stepwise", BATCH, LOO).advantages
    np.testing.assert_allclose(s[[1, 3, 9]], [7.5, -5, -5])
    z = compute_advantages("stepwise", BATCH, LOO.replace(norm="mean_std")).advantages
    assert z[1] == pytest.approx(7.5 / (np.sqrt(24) + 1e-6), rel=1e-14)
    # GiGPO: the episode term is unchanged (6 for tau1), the step term leaves one out: 6 + 7.5
    g = compute_advantages("gigpo", BATCH, LOO).advantages
    assert g[1] == pytest.approx(13.5, rel=1e-14)


# GraphGPO: one rollout group of three trajectories, graph_gamma = 0.5, norm = "mean".
# States: 1 start, 2 hall, 3 fridge, 4 a corner where nothing happens, 5 a side room.
#   tau1: s = [1, 2, 3], r = [0, 0, 10]: succeeds -> its last step leads to the goal *.
#   tau2: s = [1, 4],    r = [0, 0], ends in 4 (next_state of its last row: 4).
#   tau3: s = [1, 5],    r = [0, 0], ends in 2 (back in the hall).
# Edges: 1->2, 2->3, 3->*; 1->4, 4->4; 1->5, 5->2. Distances to *: d(3) = 1, d(2) = 2,
#   d(1) = 3 (1->2->3->*), d(5) = 3 (5->2), 4 only reaches itself: D = 3 -> d(4) = D + 1 = 4.
# R = 10 * 0.5^d(s'): tau1 [d 2, 1, 0] -> [2.5, 5, 10]; tau2 [4, 4] -> [0.625, 0.625];
#   tau3 [3, 2] -> [1.25, 2.5].
# Same-state groups: state 1 = {2.5, 0.625, 1.25} = {60, 15, 30}/24, mean 35/24 ->
#   [25/24, -20/24, -5/24]; every other state is alone -> 0.
# Episode term: E = [10, 0, 0], mean 10/3 -> [20/3, -10/3, -10/3] = [160, -80, -80]/24.
# A = step + episode: tau1 [185/24, 20/3, 20/3], tau2 [-100/24, -10/3], tau3 [-85/24, -10/3].
GRAPH = StepBatch.from_trajectories(
    groups=[0, 0, 0],
    rewards=[[0, 0, 10], [0, 0], [0, 0]],
    states=[[1, 2, 3], [1, 4], [1, 5]],
    terminal_states=[9, 4, 2],  # tau1's 9 is never read: a successful episode ends at *
)
GRAPH_CFG = EstimatorConfig(graph_gamma=0.5, norm="mean")
# rows: tau1 = 0, 1, 2; tau2 = 3, 4; tau3 = 5, 6


def test_graphgpo_distances_returns_and_advantages():
    out = compute_advantages("graphgpo", GRAPH, GRAPH_CFG)
    np.testing.assert_array_equal(out.returns, [2.5, 5, 10, 0.625, 0.625, 1.25, 2.5])
    np.testing.assert_allclose(
        out.advantages,
        [185 / 24, 20 / 3, 20 / 3, -100 / 24, -10 / 3, -85 / 24, -10 / 3],
        rtol=1e-15,
    )
    np.testing.assert_allclose(out.level_advantages[0, [0, 3, 5]], [25 / 24, -20 / 24, -5 / 24])
    assert out.diagnostics["graph"]["terminal"] == "next_state"


def test_graphgpo_without_next_state_ends_failures_in_dead_ends():
    # Without next_state tau3 no longer returns to the hall: 5 has no way out, so
    # d(5) = D + 1 = 4 like d(4), and tau3's first step scores 10 * 0.5^4 = 0.625 like tau2's.
    # State 1 = {2.5, 0.625, 0.625}, mean 1.25 -> [1.25, -0.625, -0.625].
    b = StepBatch(GRAPH.group, GRAPH.traj, GRAPH.step, GRAPH.reward, GRAPH.state)
    out = compute_advantages("graphgpo", b, GRAPH_CFG)
    np.testing.assert_array_equal(out.returns, [2.5, 5, 10, 0.625, 0.625, 0.625, 0.625])
    np.testing.assert_allclose(out.level_advantages[0, [0, 3, 5]], [1.25, -0.625, -0.625])
    assert out.diagnostics["graph"]["terminal"] == "dead_end"


def test_graphgpo_progress_penalty_and_success_threshold():
    # graph_normalize_distance: R = 10 * 0.5^(d(s') - d(s) + 1):
    #   tau1: 1->2 (3 -> 2), 2->3 (2 -> 1), 3->* (1 -> 0): exponent 0 each -> [10, 10, 10];
    #   tau2: 1->4 (3 -> 4): 2 -> 2.5; 4->4: 1 -> 5;  tau3: 1->5 (3 -> 3): 1 -> 5; 5->2: 0 -> 10.
    #   State 1 = {10, 2.5, 5}, mean 35/6 -> [25/6, -20/6, -5/6].
    out = compute_advantages("graphgpo", GRAPH, GRAPH_CFG.replace(graph_normalize_distance=True))
    np.testing.assert_array_equal(out.returns, [10, 10, 10, 2.5, 5, 5, 10])
    np.testing.assert_allclose(out.level_advantages[0, [0, 3, 5]], [25 / 6, -20 / 6, -5 / 6])
    # An invalid first step of tau2 loses invalid_penalty = 0.1 from its own return only:
    # 0.625 - 0.1 = 0.525 (the return is not a sum of rewards to carry it back).
    inv = StepBatch(GRAPH.group, GRAPH.traj, GRAPH.step, GRAPH.reward, GRAPH.state,
                    invalid=[0, 0, 0, 1, 0, 0, 0], next_state=GRAPH.next_state)  # fmt: skip
    out = compute_advantages("graphgpo", inv, GRAPH_CFG)
    np.testing.assert_allclose(out.returns, [2.5, 5, 10, 0.525, 0.625, 1.25, 2.5], rtol=1e-15)
    # graph_success_return = 10: tau1's return 10 does not exceed it, so no episode reaches
    # the goal: D = 0, every node is at D + 1 = 1, every R = 5 and the step term is 0.
    out = compute_advantages("graphgpo", GRAPH, GRAPH_CFG.replace(graph_success_return=10.0))
    np.testing.assert_array_equal(out.returns, [5.0] * 7)
    np.testing.assert_array_equal(out.level_advantages[0], 0.0)
    # The weights: graph_episode_weight = 0 leaves the step term alone, scaled by its weight.
    only = GRAPH_CFG.replace(graph_step_weight=2.0, graph_episode_weight=0.0)
    a = compute_advantages("graphgpo", GRAPH, only).advantages
    np.testing.assert_allclose(a[[0, 3, 5]], [50 / 24, -40 / 24, -10 / 24], rtol=1e-15)


# --------------------------------------------------------------------------- empg
# One group: tau1 = 2 steps, r = [0, 1]; tau2 = 1 step, r = [0]. gamma = 1, norm = "mean".
# Episode returns E = [1, 0], mean 1/2 -> A(tau) = +1/2 on tau1's rows, -1/2 on tau2's.
# Rows: 0 = tau1 t0, 1 = tau1 t1, 2 = tau2 t0. Entropy H = [0, 2, 1], eps = 0:
#   H_norm = (H - 0) / (2 - 0) = [0, 1, 1/2].
# k = 2 ln 2: exp(-k H_norm) = 4^-H_norm = [1, 1/4, 1/2], mean 7/12 -> g = [12/7, 3/7, 6/7].
# k' = ln 2: f = 2^-H_norm; row 0's next step is row 1: bonus = zeta f[1] = 0.2 x 1/2 = 1/10;
#   rows 1 and 2 are last steps: no bonus.
# A_mod = g A + bonus = [6/7 + 1/10, 3/14, -3/7]; its mean = (9/14 + 1/10) / 3 = 3/14 + 1/30.
# A = A_mod - mean = [9/14 + 1/15, -1/30, -9/14 - 1/30].
EMPG_BATCH = StepBatch.from_trajectories(groups=[0, 0], rewards=[[0, 1], [0]], states=[[1, 2], [1]])
EMPG_CFG = EstimatorConfig(
    gamma=1.0, norm="mean", empg_k=2 * np.log(2), empg_k_future=np.log(2), empg_zeta=0.2,
    empg_eps=0.0,
)  # fmt: skip


def test_empg_scales_by_confidence_and_adds_the_next_steps_clarity():
    out = compute_advantages("empg", EMPG_BATCH, EMPG_CFG, entropy=[0.0, 2.0, 1.0])
    np.testing.assert_allclose(
        out.advantages, [9 / 14 + 1 / 15, -1 / 30, -9 / 14 - 1 / 30], rtol=1e-14
    )
    np.testing.assert_allclose(out.diagnostics["scale"], [12 / 7, 3 / 7, 6 / 7], rtol=1e-14)
    np.testing.assert_allclose(out.diagnostics["bonus"], [0.1, 0.0, 0.0], rtol=1e-14)
    # without the final normalisation: A_mod itself
    raw = compute_advantages(
        "empg", EMPG_BATCH, EMPG_CFG.replace(empg_final_norm="none"), entropy=[0.0, 2.0, 1.0]
    )
    np.testing.assert_allclose(raw.advantages, [6 / 7 + 0.1, 3 / 14, -3 / 7], rtol=1e-14)


def test_empg_with_equal_entropies_is_grpo_plus_a_constant_bonus_less_its_mean():
    # H all equal: H_norm = 0 (also with eps = 0), g = 1, f = 1: A_mod = A + zeta on rows with a
    # next step (row 0 only) -> [1/2 + 0.2, 1/2, -1/2], mean 7/30 -> minus 7/30.
    out = compute_advantages("empg", EMPG_BATCH, EMPG_CFG, entropy=[0.7, 0.7, 0.7])
    np.testing.assert_allclose(
        out.advantages, [0.7 - 7 / 30, 0.5 - 7 / 30, -0.5 - 7 / 30], rtol=1e-14
    )


# --------------------------------------------------------------------------- gigpo_similarity
# One group: tau1 observes ["kitchen", "you see a fridge 1"], r = [0, 1] -> R = [1, 1];
# tau2 observes ["kitchen", "you see a fridge 2"], r = [0, 0] -> R = [0, 0]. gamma = 1, "mean".
# difflib: "you see a fridge 1" vs "... 2": longest match "you see a fridge " (17 of 18 chars),
# ratio = 2 x 17 / 36 = 0.944.
# Episode term: E = [1, 0] -> +1/2 on tau1, -1/2 on tau2.
# thresh 0.9: the fridge texts share a step group: {R = 1, R = 0} -> +1/2, -1/2; the kitchen
#   group likewise -> A = tau1 [1, 1], tau2 [-1, -1].
# thresh 0.95: the fridge texts are apart (singletons -> step term 0) -> tau1 [1, 1/2],
#   tau2 [-1, -1/2]; that is GiGPO with exact anchor states.
SIM_BATCH = StepBatch.from_trajectories(
    groups=[0, 0], rewards=[[0, 1], [0, 0]], states=[[0, 1], [0, 2]]
)
SIM_OBS = ["kitchen", "you see a fridge 1", "kitchen", "you see a fridge 2"]
SIM_CFG = EstimatorConfig(gamma=1.0, norm="mean")


def test_gigpo_similarity_groups_near_copies():
    a = compute_advantages(
        "gigpo_similarity", SIM_BATCH, SIM_CFG.replace(gigpo_similarity_thresh=0.9),
        observations=SIM_OBS,
    ).advantages  # fmt: skip
    np.testing.assert_allclose(a, [1, 1, -1, -1])
    b = compute_advantages("gigpo_similarity", SIM_BATCH, SIM_CFG, observations=SIM_OBS)
    np.testing.assert_allclose(b.advantages, [1, 0.5, -1, -0.5])
    np.testing.assert_allclose(
        b.advantages, compute_advantages("gigpo", SIM_BATCH, SIM_CFG).advantages
    )


def test_similarity_clusters_compare_with_the_representative_only():
    # thresh 0.7: "aaab" joins "aaaa" (ratio 2 x 3 / 8 = 0.75); "aabb" is 0.75 from "aaab" but
    # 0.5 from the representative "aaaa": a cluster of its own (the authors' greedy rule).
    from hgpo.gigpo_variants import similarity_clusters

    b = StepBatch.from_trajectories(
        groups=[0, 0, 0], rewards=[[0], [0], [0]], states=[[0], [1], [2]]
    )
    ids = similarity_clusters(b, ["aaaa", "aaab", "aabb"], 0.7)
    assert ids[0] == ids[1] != ids[2]


# --------------------------------------------------------------------------- gigpo_dynamic
# Group 0: tau1 r = [0, 1], tau2 r = [1, 0]: both episode rewards 1 -> dynamic sampling drops
# the group, although with gamma = 1/2 their step returns differ (R = [1/2, 1] and [1, 0]) and
# GiGPO's step term is not 0 there (state 1: {1/2, 1} -> -1/4, +1/4; state 2: {1, 0} ->
# +1/2, -1/2; episode term 0).
# Group 1: tau3 r = [1], tau4 r = [0], same state: episode +-1/2, step +-1/2 -> A = +-1.
DYN_BATCH = StepBatch.from_trajectories(
    groups=[0, 0, 1, 1], rewards=[[0, 1], [1, 0], [1], [0]], states=[[1, 2], [1, 2], [3], [3]]
)
DYN_CFG = EstimatorConfig(gamma=0.5, norm="mean")


def test_gigpo_dynamic_drops_groups_of_equal_episode_rewards():
    np.testing.assert_allclose(
        compute_advantages("gigpo", DYN_BATCH, DYN_CFG).advantages,
        [-0.25, 0.5, 0.25, -0.5, 1, -1],
    )
    out = compute_advantages("gigpo_dynamic", DYN_BATCH, DYN_CFG)
    np.testing.assert_allclose(out.advantages, [0, 0, 0, 0, 1, -1])
    assert out.diagnostics["kept"].tolist() == [False] * 4 + [True] * 2
    assert out.diagnostics["kept_share"] == pytest.approx(2 / 6)
    # rescaled by n / n_kept = 6 / 2
    a = compute_advantages("gigpo_dynamic", DYN_BATCH, DYN_CFG.replace(gigpo_dynamic_rescale=True))
    np.testing.assert_allclose(a.advantages, [0, 0, 0, 0, 3, -3])


# --------------------------------------------------------------------------- ecpo
# ECPO (arXiv 2606.05885; no public code, so this example is worked from the paper's
# definitions, hgpo/ecpo.py). norm = "mean", gamma = 1, kappa = 2, tau = 4, omega = 1.
# Group 0: four one-step trajectories from state 1 (one anchor s, n_s = 4):
#   tau1: action 0, G = 1;  tau2: action 0, G = 0;  tau3: action 0, G = 0;  tau4: action 1, G = 1
#   mu_s = 1/2; action 0: n = 3, Gbar = 1/3; action 1 (the rare, lucky one): n = 1, Gbar = 1.
#   Shrinkage: mu~ - mu_s = n / (n + 2) (Gbar - mu_s): action 0: 3/5 (-1/6) = -1/10;
#   action 1: 1/3 (1/2) = 1/6 (GiGPO's step term would give tau4 the full 1 - 1/2 = 1/2).
#   Gate: B = (3 (1/6)^2 + 1 (1/2)^2) / 4 = (1/12 + 3/12) / 4 = 1/12;
#         W = ((2/3)^2 + 2 (1/3)^2 + 0) / 4 = (6/9) / 4 = 1/6;  B + W = 1/4, the anchor's variance;
#         rho = tanh(4 / 4) (1/12) / (1/4) = tanh(1) / 3.
#   Episode term: E - mean = [1/2, -1/2, -1/2, 1/2].
#   A = [1/2 - tanh(1)/30, -1/2 - tanh(1)/30, -1/2 - tanh(1)/30, 1/2 + tanh(1)/18].
# Group 1: tau5 (action 0, G = 1), tau6 (action 0, G = 0) from state 1: its own anchor (not
#   group 0's), one action: B = 0, rho = 0: A = the episode term [1/2, -1/2].
ECPO_BATCH = StepBatch.from_trajectories(
    groups=[0, 0, 0, 0, 1, 1],
    rewards=[[1.0], [0.0], [0.0], [1.0], [1.0], [0.0]],
    states=[[1]] * 6,
    actions=[[0], [0], [0], [1], [0], [0]],
)
ECPO_CFG = EstimatorConfig(gamma=1.0, norm="mean")
TANH1 = np.tanh(1.0)


def test_ecpo_shrinks_the_rare_lucky_action_and_gates_the_anchor():
    out = compute_advantages("ecpo", ECPO_BATCH, ECPO_CFG)
    d = out.diagnostics["ecpo"]
    np.testing.assert_allclose(d["step_advantage"], [-0.1, -0.1, -0.1, 1 / 6, 0, 0], atol=1e-15)
    np.testing.assert_allclose(d["between"][:4], 1 / 12, rtol=1e-15)
    np.testing.assert_allclose(d["within"][:4], 1 / 6, rtol=1e-15)
    np.testing.assert_allclose(d["gate"], [TANH1 / 3] * 4 + [0, 0], rtol=1e-15)
    np.testing.assert_allclose(
        out.advantages,
        [0.5 - TANH1 / 30, -0.5 - TANH1 / 30, -0.5 - TANH1 / 30, 0.5 + TANH1 / 18, 0.5, -0.5],
        rtol=1e-15,
    )
    assert d["n_anchor"].tolist() == [4, 4, 4, 4, 2, 2]
    assert d["n_action"].tolist() == [3, 3, 3, 1, 2, 2]
    # GiGPO gives tau4 1/2 + 1/2: ECPO credits the single lucky occurrence far less
    assert compute_advantages("gigpo", ECPO_BATCH, ECPO_CFG).advantages[3] == 1.0


def test_ecpo_options_on_the_hand_worked_batch():
    # kappa = 0 and no gate: GiGPO's step term averaged per action: action 0 -> 1/3 - 1/2
    a = compute_advantages("ecpo", ECPO_BATCH, ECPO_CFG, ecpo_kappa=0.0, ecpo_gate="none")
    np.testing.assert_allclose(a.advantages[:4], [1 / 3, -2 / 3, -2 / 3, 1.0], rtol=1e-15)
    # tau = 1: rho = tanh(4) / 3;  eps_g = 1/4: rho = tanh(1) (1/12) / (1/4 + 1/4) = tanh(1) / 6
    g = compute_advantages("ecpo", ECPO_BATCH, ECPO_CFG, ecpo_tau=1.0).diagnostics["ecpo"]["gate"]
    assert g[0] == pytest.approx(np.tanh(4.0) / 3, rel=1e-15)
    g = compute_advantages("ecpo", ECPO_BATCH, ECPO_CFG, ecpo_gate_eps=0.25)
    assert g.diagnostics["ecpo"]["gate"][0] == pytest.approx(TANH1 / 6, rel=1e-15)
    # omega = 0: the episode term alone
    a = compute_advantages("ecpo", ECPO_BATCH, ECPO_CFG, ecpo_omega=0.0).advantages
    np.testing.assert_array_equal(a, [0.5, -0.5, -0.5, 0.5, 0.5, -0.5])
    # mean_std, eps = 0: sigma_s = 1/2 (population) -> A_act = [-1/5, 1/3]; episode +-1
    a = compute_advantages("ecpo", ECPO_BATCH, ECPO_CFG, norm="mean_std", eps=0.0).advantages
    np.testing.assert_allclose(
        a, [1 - TANH1 / 15, -1 - TANH1 / 15, -1 - TANH1 / 15, 1 + TANH1 / 9, 1, -1], rtol=1e-15
    )
