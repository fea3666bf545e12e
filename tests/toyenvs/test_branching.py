"""Branching rollout schemes (toyenvs/branched_rollout.py): env dynamics from every snapshot, budgets,
the rules' choices, determinism, and named errors for bad schemes and budgets."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_small

import toyenvs
from hgpo import EstimatorConfig, context_keys
from hgpo.options import OptionError
from tests.toyenvs import reference_branching
from toyenvs.branched_rollout import branch_arrays, branch_kernel, parse_scheme

SCHEMES = [
    "branch:uniform", "branch:singleton", "branch:hard", "branch:3spo", "tree:2,4", "independent",
]  # fmt: skip


def _run(key: str, scheme: str, steps: int = 40, budget: float = 0.5, seed: int = 3, K: int = 2):
    env = make_small(key)
    pol = toyenvs.TabularPolicy(env, K=K, init="random", seed=1)
    return env, toyenvs.rollout(env, pol, seed=seed, scheme=scheme, steps=steps,
                                branch_budget=budget)  # fmt: skip


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("key", ["keydoor_slip", "household", "random"])
def test_every_step_follows_the_env_from_its_snapshot(key: str, scheme: str) -> None:
    env, rb = _run(key, scheme)
    b = rb.batch
    n = b.n_steps
    np.testing.assert_array_equal(b.state, env.obs_of_state[rb.hidden])
    np.testing.assert_array_equal(b.invalid, env.invalid[rb.hidden, b.action])
    # the successor of each step but a trajectory's last is its next own row
    last = np.zeros(n, dtype=bool)
    last[b.traj_start + b.traj_len - 1] = True
    for r in np.flatnonzero(~last):
        s, a, s2 = rb.hidden[r], b.action[r], rb.hidden[r + 1]
        if env.invalid[s, a]:
            assert s2 == s
        else:
            assert env.next_prob[s, a][env.next_state[s, a] == s2].sum() > 0
        assert b.reward[r] == env.reward_enter[s2]
        assert not env.terminal[s2]
    lay = b.branches
    if lay is None:
        assert scheme == "independent"
        return
    # a branch restarts from its parent's hidden state and full context at its branch step
    for j in np.flatnonzero(lay.parent >= 0):
        first, p_row = b.traj_start[j], lay.virtual_rows[lay.parent[j], lay.branch_step[j]]
        assert rb.hidden[first] == rb.hidden[p_row]
        assert rb.code[first] == rb.code[p_row]
    # the toy's context codes and hgpo's keys on the virtual trajectories are the same partition
    keys = context_keys(b, rb.K, include_actions=True)
    for k in range(rb.K + 1):
        for g in np.unique(b.group):
            m = b.group == g
            pairs = np.unique(np.stack([rb.context_keys[k, m], keys[k, m]]), axis=1)
            assert np.unique(pairs[0]).size == np.unique(pairs[1]).size == pairs.shape[1]


def test_roots_are_todays_trajectories() -> None:
    """With one task, root j draws from stream (seed, j) like today's trajectory j."""
    env = make_small("keydoor_slip")
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=1)
    rb = toyenvs.rollout(env, pol, tasks=env.tasks[:1], seed=5, scheme="independent", steps=30)
    old = toyenvs.rollout(env, pol, tasks=env.tasks[:1], n_rollouts=rb.batch.n_traj, seed=5)
    for name in ("step", "reward", "state", "action", "invalid"):
        np.testing.assert_array_equal(getattr(rb.batch, name), getattr(old.batch, name))
    np.testing.assert_array_equal(rb.hidden, old.hidden)


@pytest.mark.parametrize("budget", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_budgets_are_respected(scheme: str, budget: float) -> None:
    _env, rb = _run("household", scheme, steps=50, budget=budget)
    b = rb.batch
    root_steps = 50 if scheme == "independent" else int(np.ceil((1 - budget) * 50))
    for g in np.unique(b.group):
        trajs = np.flatnonzero(b.group[b.traj_start] == g)
        lens = b.traj_len[trajs]
        assert lens.sum() - lens[-1] < 50 <= lens.sum()  # stop once the budget is used
        roots = b.branches is None or (b.branches.parent[trajs] < 0)
        roots = np.broadcast_to(roots, lens.shape)
        n_roots = int(np.flatnonzero(roots).max()) + 1
        assert roots[:n_roots].all()  # roots first, then branches
        root_rows = lens[:n_roots].sum()
        assert n_roots == 1 or root_rows - lens[n_roots - 1] < root_steps
        assert root_rows >= min(root_steps, lens.sum())


def _level_k_counts_before(b, keys_K, traj_j):
    """Level-K group sizes among the rows of the trajectories listed before ``traj_j``."""
    g = b.group[b.traj_start[traj_j]]
    rows = np.flatnonzero((b.traj_index < traj_j) & (b.group == g))
    vals, counts = np.unique(keys_K[rows], return_counts=True)
    return rows, dict(zip(vals.tolist(), counts.tolist(), strict=True))


def test_singleton_rule_branches_from_singletons() -> None:
    _env, rb = _run("household", "branch:singleton", steps=80, budget=0.75)
    b, lay = rb.batch, rb.batch.branches
    checked = 0
    for j in np.flatnonzero(lay.parent >= 0):
        rows, count = _level_k_counts_before(b, rb.code, j)
        p_row = lay.virtual_rows[lay.parent[j], lay.branch_step[j]]
        if any(count[rb.code[r]] == 1 for r in rows if b.step[r] >= 1):
            assert count[rb.code[p_row]] == 1
            checked += 1
    assert checked > 0


def test_hard_rule_branches_from_the_most_varied_group() -> None:
    """At each branch, the chosen step's level-K group has the largest variance of the
    return-to-go (true reward, undiscounted) among the group's earlier steps with t >= 1."""
    _env, rb = _run("household", "branch:hard", steps=80, budget=0.75)
    b, lay = rb.batch, rb.batch.branches
    togo = np.empty(b.n_steps)
    for j in range(b.n_traj):  # own rows only: a branch's future is its own
        rows = np.arange(b.traj_start[j], b.traj_start[j] + b.traj_len[j])
        togo[rows] = np.cumsum(rb.true_reward[rows][::-1])[::-1]
    checked = 0
    for j in np.flatnonzero(lay.parent >= 0):
        rows, _ = _level_k_counts_before(b, rb.code, j)
        var = {c: np.var(togo[rows][rb.code[rows] == c]) for c in np.unique(rb.code[rows])}
        best = max(var[rb.code[r]] for r in rows if b.step[r] >= 1)
        if best > 1e-9:
            p_row = lay.virtual_rows[lay.parent[j], lay.branch_step[j]]
            assert var[rb.code[p_row]] == pytest.approx(best, abs=1e-9)
            checked += 1
    assert checked > 0


def _spo3_before(b, rb, traj_j, cfg):
    """3SPO's S(o) and rollouts left n(o) - 1 - B(o) of every observation at the start of
    trajectory ``traj_j``: counts over the group's earlier trajectories (hgpo.threespo on them:
    a branch counts its parent's prefix), B(o) the earlier branches from o."""
    from hgpo import StepBatch
    from hgpo.threespo import rollout_allocation, state_score, state_visits

    g = b.group[b.traj_start[traj_j]]
    rows = np.flatnonzero((b.traj_index < traj_j) & (b.group == g))
    sub = StepBatch(b.group[rows], b.traj[rows], b.step[rows], b.reward[rows], b.state[rows],
                    parent=b.parent[rows])  # fmt: skip
    v = state_visits(sub)
    S = state_score(v.n_total, v.n_success, v.t, cfg)
    n = rollout_allocation(S, cfg.spo3_g_max)
    lay = b.branches
    branched = [j for j in range(traj_j) if lay.parent[j] >= 0 and b.group[b.traj_start[j]] == g]
    B = {}
    for j in branched:
        o = int(b.state[b.traj_start[j]])  # its first state is its branch point's
        B[o] = B.get(o, 0) + 1
    score = {int(o): s for o, s in zip(sub.state, S, strict=True)}
    left = {int(o): int(k) - 1 - B.get(int(o), 0) for o, k in zip(sub.state, n, strict=True)}
    return rows, score, left


@pytest.mark.parametrize("alpha", [50.0, 1.0])
def test_3spo_rule_branches_by_the_allocation(alpha: float) -> None:
    """At each branch, when some earlier step (t >= 1) has rollouts left at its observation,
    the chosen step is one of them with the highest score S(o); else the fallback (uniform)."""
    from hgpo import EstimatorConfig

    cfg = EstimatorConfig(spo3_alpha=alpha, spo3_xi=3.0)
    env = make_small("keydoor_slip")
    pol = toyenvs.TabularPolicy(env, K=1, init="random", seed=1)
    rb = toyenvs.rollout(env, pol, seed=4, scheme="branch:3spo", steps=120, branch_budget=0.8,
                         spo3_config=cfg)  # fmt: skip
    b, lay = rb.batch, rb.batch.branches
    ruled = fell_back = 0
    for j in np.flatnonzero(lay.parent >= 0):
        rows, score, left = _spo3_before(b, rb, j, cfg)
        ok = [r for r in rows if b.step[r] >= 1 and left[int(b.state[r])] >= 1]
        o = int(b.state[b.traj_start[j]])
        if ok:
            assert left[o] >= 1
            assert score[o] == max(score[int(b.state[r])] for r in ok)
            ruled += 1
        else:
            fell_back += 1
    assert ruled > 0 and fell_back > 0


def test_tree_rule_branches_at_its_depths() -> None:
    _env, rb = _run("household", "tree:2,4", steps=60, budget=0.5)
    lay = rb.batch.branches
    assert set(lay.branch_step[lay.parent >= 0].tolist()) <= {2, 4}


def test_same_seed_same_branched_batch() -> None:
    a = _run("keydoor_slip", "branch:hard", seed=9)[1]
    b = _run("keydoor_slip", "branch:hard", seed=9)[1]
    for name in ("traj", "parent", "step", "action", "reward"):
        np.testing.assert_array_equal(getattr(a.batch, name), getattr(b.batch, name))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(scheme="branch:deep", steps=10), "scheme: must be one of"),
        (dict(scheme="tree:0", steps=10), "depth: must be an integer in 1.."),
        (dict(scheme="tree:2,x", steps=10), "tree:D with D"),
        (dict(scheme="tree:99", steps=10), "depth: must be an integer in 1.."),
        (dict(scheme="branch:uniform", steps=10, branch_budget=0.0), "branch_budget: must be"),
        (dict(scheme="branch:uniform", steps=10, branch_budget=1.5), "branch_budget: must be"),
        (dict(scheme="branch:uniform", steps=10, branch_budget=float("nan")), "branch_budget"),
        (dict(scheme="branch:uniform"), r"steps \(scheme 'branch:uniform'\): must be"),
        (dict(scheme="branch:uniform", steps=0), "steps: must be an integer >= 1"),
        (
            dict(scheme="branch:hard", steps=10, spo3_config=EstimatorConfig()),
            r"spo3_config: must be None with scheme 'branch:hard' \(only branch:3spo reads it\)",
        ),
        (
            dict(scheme="branch:3spo", steps=10, spo3_config={"spo3_alpha": 1.0}),
            "spo3_config: must be an hgpo.EstimatorConfig, got 'dict'",
        ),
    ],
)
def test_bad_scheme_or_budget_is_named(kwargs: dict, message: str) -> None:
    env = make_small("household")
    pol = toyenvs.TabularPolicy(env, K=2)
    with pytest.raises(OptionError, match=message):
        toyenvs.rollout(env, pol, **kwargs)
    assert pol.n_contexts == 0  # no work done


def _arrays(kernel, key: str, scheme: str, K: int, budget: float = 0.5) -> dict:
    env = make_small(key)
    pol = toyenvs.TabularPolicy(env, K=K, init="random", seed=1)
    tasks = np.resize(env.tasks, 11)  # more groups than lanes, some lanes run two or more
    res = branch_arrays(env, pol, tasks, 4, parse_scheme(scheme, env.horizon), 37, budget,
                        kernel=kernel)  # fmt: skip
    res["codes"] = pol.codes[res.pop("context")]  # dense rows are numbered in meeting order
    return res


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("K", [0, 1, 3])
@pytest.mark.parametrize("key", ["keydoor_slip", "household", "random", "tmaze"])
def test_lanes_kernel_equals_the_one_at_a_time_reference(key: str, K: int, scheme: str) -> None:
    """Groups in lanes and maintained branch-point structures draw the same batch as the
    reference that runs one trajectory at a time and scans the group's rows for each branch
    point: every column, bit for bit."""
    ref = _arrays(reference_branching.branch_kernel, key, scheme, K, budget=0.75)
    fast = _arrays(None, key, scheme, K, budget=0.75)
    assert ref.keys() == fast.keys()
    for name in ref:
        np.testing.assert_array_equal(fast[name], ref[name], err_msg=name)


@pytest.mark.parametrize("scheme", ["branch:singleton", "branch:hard", "branch:3spo", "tree:2,4"])
def test_branch_kernel_compiled_equals_python(scheme: str) -> None:
    a = _arrays(None, "keydoor_slip", scheme, K=2)
    with np.errstate(over="ignore"):  # splitmix64 wraps around on purpose
        b = _arrays(branch_kernel.py_func, "keydoor_slip", scheme, K=2)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_neural_policy_branches_without_an_earlier_rollout() -> None:
    """The branched rollout covers a NeuralPolicy's table itself (as rollout_arrays does)."""
    env = make_small("keydoor_slip")
    pol = toyenvs.NeuralPolicy(env, K=2, arch="mlp", width=8)
    rb = toyenvs.rollout(env, pol, seed=2, scheme="branch:hard", steps=30)
    assert rb.batch.branches is not None and rb.batch.branches.n_branches > 0
    np.testing.assert_array_equal(pol.codes[rb.context], rb.code)
