"""Ground truth: a hand-solved POMDP, exact vs Monte Carlo, exact vs finite-difference gradient."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL, make_small, tiny_pomdp

import toyenvs
from toyenvs import _kernels as kn

GAMMA = 0.9


def test_hand_solved_values(tiny: toyenvs.POMDP) -> None:
    # Uniform reactive policy (K = 0): pi(a0) = pi(a1) = 1/2 in every context. gamma = 0.9,
    # horizon 3 (t = 0, 1, 2). True reward = entering reward - 0.1 for the invalid a1 at s0.
    # t = 2 (last step, no future):
    #   Q2(s1,a0) = 10, Q2(s1,a1) = 0            -> V2(s1) = 5
    #   Q2(s0,a0) = 0,  Q2(s0,a1) = -0.1         -> V2(s0) = -0.05
    # t = 1:
    #   Q1(s1,a0) = 10, Q1(s1,a1) = 0.9 V2(s0) = -0.045          -> V1(s1) = 4.9775
    #   Q1(s0,a0) = 0.9 V2(s1) = 4.5, Q1(s0,a1) = -0.1 + 0.9 V2(s0) = -0.145 -> V1(s0) = 2.1775
    # t = 0 (start s0):
    #   Q0(s0,a0) = 0.9 V1(s1) = 4.47975, Q0(s0,a1) = -0.1 + 0.9 V1(s0) = 1.85975
    #   V0(s0) = J = 3.16975
    # Occupancy: d0(s0) = 1; d1(s1) = d1(s0) = 1/2; at t = 2, s0 is reached from s1 by a1
    # (1/4) and from s0 by a1 (1/4): d2(s0) = 1/2; s1 from s0 by a0: d2(s1) = 1/4 (the other
    # 1/4 reached the goal).
    pol = toyenvs.TabularPolicy(tiny, K=0)
    gt = toyenvs.exact_ground_truth(tiny, pol, gamma=GAMMA)
    expect = {  # (t, s): (V, Q(a0), Q(a1), d)
        (0, 0): (3.16975, 4.47975, 1.85975, 1.0),
        (1, 1): (4.9775, 10.0, -0.045, 0.5),
        (1, 0): (2.1775, 4.5, -0.145, 0.5),
        (2, 0): (-0.05, 0.0, -0.1, 0.5),
        (2, 1): (5.0, 10.0, 0.0, 0.25),
    }
    assert gt.n_nodes == len(expect)
    for i in range(gt.n_nodes):
        v, q0, q1, d = expect[(int(gt.node_t[i]), int(gt.node_hidden[i]))]
        np.testing.assert_allclose([gt.V[i], *gt.Q[i], gt.occupancy[i]], [v, q0, q1, d])
    assert pytest.approx(3.16975) == gt.J
    # Both hidden states share the single context (obs 0): the gradient pools them, weighted by
    # gamma^t d_t(z) pi(b) A(z, b): sum over the 4 nodes at obs 0.
    A = gt.Q - gt.V[:, None]
    w = GAMMA**gt.node_t * gt.occupancy * 0.5
    row = pol.index_of(np.array([0]))[0]
    np.testing.assert_allclose(gt.policy_gradient[row], (w[:, None] * A).sum(axis=0))


def test_hand_solved_rollout_lookup(tiny: toyenvs.POMDP) -> None:
    pol = toyenvs.TabularPolicy(tiny, K=1)
    rb = toyenvs.rollout(tiny, pol, n_rollouts=50, seed=3)
    gt = toyenvs.exact_ground_truth(tiny, pol, gamma=GAMMA)
    adv = gt.advantage(rb)
    # Under the uniform policy values do not depend on K: A* of (t=0, s0, a0) = 4.47975 - 3.16975.
    first = (rb.batch.step == 0) & (rb.batch.action == 0)
    np.testing.assert_allclose(adv[first], 1.31)
    np.testing.assert_allclose(gt.q(rb) - gt.value(rb), adv)
    assert (gt.occupancy_of(rb) > 0).all()


@pytest.mark.parametrize("key", sorted(SMALL))
def test_exact_matches_monte_carlo(key: str) -> None:
    env = make_small(key)
    pol = toyenvs.TabularPolicy(env, K=1, init="random", seed=4)
    gt = toyenvs.exact_ground_truth(env, pol, gamma=0.95)
    mc = toyenvs.mc_ground_truth(env, pol, gamma=0.95, n_rollouts=4000, seed=11)
    assert abs(gt.J - mc.J) <= 4.5 * mc.J_stderr + 1e-9
    rb = toyenvs.rollout(env, pol, n_rollouts=2, seed=5)
    # Per step quantities of the distinct z of a small batch, 2000 continuations per action.
    mc_z = toyenvs.mc_ground_truth(env, pol, gamma=0.95, n_rollouts=2000, seed=12)
    for exact, est, se in (
        (gt.advantage(rb), mc_z.advantage(rb), mc_z.advantage_stderr(rb)),
        (gt.value(rb), mc_z.value(rb), mc_z.value_stderr(rb)),
        (gt.q(rb), mc_z.q(rb), mc_z.q_stderr(rb)),
    ):
        z = np.abs(exact - est) / np.maximum(se, 1e-12)
        ok = (np.abs(exact - est) < 1e-9) | (z < 5.5)
        assert ok.all(), (key, np.max(z))
    # The gradients: REINFORCE means agree within 5.5 standard errors on every entry above 5%
    # of the largest (entries of rarely met contexts are too skewed for a normal error bar),
    # and in squared norm overall: E||est - exact||^2 = sum se^2.
    n = pol.n_contexts
    for exact, est, se in (
        (gt.policy_gradient, mc.policy_gradient, mc.policy_gradient_stderr),
        (gt.policy_gradient_undiscounted, mc.policy_gradient_undiscounted,
         mc.policy_gradient_undiscounted_stderr),
    ):  # fmt: skip
        e = exact[: est.shape[0]]
        z = np.abs(e - est) / np.maximum(se, 1e-12)
        big = np.abs(e) > 0.05 * np.abs(e).max()
        assert (z[big] < 5.5).all(), (key, z[big].max())
        assert ((e - est) ** 2).sum() <= 1.5 * (se**2).sum() + 1e-10
        assert est.shape[0] <= n
    occ_se = mc.occupancy_stderr(rb)
    z = np.abs(gt.occupancy_of(rb) - mc.occupancy_of(rb)) / np.maximum(occ_se, 1e-3)
    assert (z < 5.5).all()


@pytest.mark.parametrize("key", ["keydoor_slip", "tmaze", "household", "random"])
def test_policy_gradient_matches_finite_differences(key: str) -> None:
    env = make_small(key)
    pol = toyenvs.TabularPolicy(env, K=1, init="random", seed=7, temperature=0.8)
    gt = toyenvs.exact_ground_truth(env, pol, gamma=0.95)
    g = gt.policy_gradient
    rng = np.random.default_rng(0)
    flat = np.argsort(-np.abs(g).ravel())[:4].tolist() + rng.choice(g.size, 4).tolist()
    eps = 1e-5
    for f in flat:
        c, b = divmod(int(f), g.shape[1])
        Js = []
        for sign in (1, -1):
            p = pol.copy()
            p.logits[c, b] += sign * eps
            Js.append(toyenvs.exact_ground_truth(env, p, gamma=0.95).J)
        fd = (Js[0] - Js[1]) / (2 * eps)
        assert fd == pytest.approx(g[c, b], rel=1e-5, abs=1e-8)


def test_undiscounted_gradient_equals_discounted_at_gamma_one() -> None:
    env = make_small("tmaze")
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=1)
    gt = toyenvs.exact_ground_truth(env, pol, gamma=1.0)
    np.testing.assert_allclose(gt.policy_gradient, gt.policy_gradient_undiscounted)


def test_occupancy_is_the_survival_probability() -> None:
    env = make_small("keydoor_slip")
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=2)
    gt = toyenvs.exact_ground_truth(env, pol)
    mass = np.bincount(gt.node_t, weights=gt.occupancy)
    assert mass[0] == pytest.approx(1.0)
    assert (np.diff(mass) <= 1e-12).all()
    rb = toyenvs.rollout(env, pol, n_rollouts=2000, seed=1)
    alive = np.bincount(rb.batch.step) / (env.tasks.size * 2000)
    np.testing.assert_allclose(alive, mass, atol=0.02)


def test_tmaze_value_of_memory() -> None:
    # A policy that goes forward and turns by the cue succeeds iff the cue is in its context.
    env = toyenvs.make("tmaze", length=2)
    for K, expect in ((3, 10 * 0.95**3), (2, 0.5 * 10 * 0.95**3)):
        pol = toyenvs.TabularPolicy(env, K=K)
        gt0 = toyenvs.exact_ground_truth(env, pol)  # registers every reachable context
        for row, code in enumerate(pol.codes):
            past_obs, _, obs = pol.decode(int(code))
            # junction (obs 3): turn "up" (2) if the cue-up observation is in context
            best = (3 if 1 in past_obs else 2) if obs == 3 else 0
            pol.logits[row] = -1e3
            pol.logits[row, best] = 0.0
        gt = toyenvs.exact_ground_truth(env, pol)
        assert pytest.approx(expect, rel=1e-9) == gt.J, (K, gt0.J)


def test_chain_too_large_is_a_clear_error() -> None:
    env = toyenvs.make("keydoor", size=6)
    pol = toyenvs.TabularPolicy(env, K=2)
    with pytest.raises(toyenvs.ChainTooLarge, match="mc_ground_truth"):
        toyenvs.exact_ground_truth(env, pol, max_nodes=1000)


def test_bad_inputs() -> None:
    env = tiny_pomdp()
    pol = toyenvs.TabularPolicy(env, K=1)
    for gamma in (1.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"^gamma: must be a finite number in \[0\.0, 1\.0\]"):
            toyenvs.exact_ground_truth(env, pol, gamma=gamma)
    with pytest.raises(ValueError, match=r"^max_nodes: must be an integer >= 1, got 0$"):
        toyenvs.exact_ground_truth(env, pol, max_nodes=0)
    with pytest.raises(ValueError, match="tasks"):
        toyenvs.exact_ground_truth(env, pol, tasks=np.array([2]))
    other = toyenvs.TabularPolicy(toyenvs.make("tmaze"), K=1)
    with pytest.raises(ValueError, match="n_obs"):
        toyenvs.exact_ground_truth(env, other)
    gt = toyenvs.exact_ground_truth(env, pol)
    rb = toyenvs.rollout(env, toyenvs.TabularPolicy(env, K=2), n_rollouts=2)
    with pytest.raises(ValueError, match="K=2"):
        gt.advantage(rb)


def test_solver_kernels_compiled_and_python() -> None:
    env = make_small("keydoor_slip")
    pol = toyenvs.TabularPolicy(env, K=1)
    s = env.tasks[:3].copy()
    P = np.full(3, pol.powM[1] - 1, dtype=np.int64)
    args = (s, P, False, 1, env.n_obs, pol.powM, env.obs_of_state, env.next_state,
            env.next_prob, env.terminal)  # fmt: skip
    fast, slow = kn.expand_layer(*args), kn.expand_layer.py_func(*args)
    for x, y in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(x, y)
    succ, ns, _ = fast
    pi = np.full((3, env.n_actions), 1 / env.n_actions)
    V = np.linspace(0, 1, ns.size)
    bargs = (s, succ, pi, V, 0.95, env.next_state, env.next_prob, env.invalid, env.reward_enter)
    for x, y in zip(kn.backward_layer(*bargs), kn.backward_layer.py_func(*bargs), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-15)
    d = np.ones(3) / 3
    fargs = (s, d, pi, succ, env.next_prob, ns.size)
    np.testing.assert_allclose(kn.forward_layer(*fargs), kn.forward_layer.py_func(*fargs),
                               atol=1e-15)  # fmt: skip
