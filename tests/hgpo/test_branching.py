"""Branched batches (hgpo/branched_batch.py): every estimator equals the slow reference, which reads
returns, episode returns and contexts straight off the virtual full trajectories."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hgpo import ESTIMATORS, EstimatorConfig, StepBatch, compute_advantages, context_keys
from hgpo.returns import episode_returns
from tests.hgpo.reference_impl import ref_context, ref_episode, ref_estimate, ref_levels
from tests.hgpo.strategies import REWARDS, configs, default_inputs, step_inputs

GROUP_ESTIMATORS = [name for name in ESTIMATORS if name != "gae"]


@st.composite
def branched_batches(draw, max_groups: int = 3, max_traj: int = 5, max_len: int = 6):
    """Groups of roots and branches (a branch picks an earlier trajectory of its group and a
    step 1..T_p - 1 of it, shares its state there and runs 1..max_len own steps)."""
    cols: dict[str, list] = {k: [] for k in ("group", "traj", "step", "r", "s", "a", "inv", "p")}
    virtual: list[dict[str, list]] = []  # per trajectory: its full virtual columns
    tid = 0
    for g in range(draw(st.integers(1, max_groups))):
        members: list[int] = []
        for _ in range(draw(st.integers(1, max_traj))):
            parents = [m for m in members if len(virtual[m]["s"]) >= 2]
            L = draw(st.integers(1, max_len))
            own = {
                "r": draw(st.lists(REWARDS, min_size=L, max_size=L)),
                "s": draw(st.lists(st.integers(0, 2), min_size=L, max_size=L)),
                "a": draw(st.lists(st.integers(0, 1), min_size=L, max_size=L)),
                "inv": draw(st.lists(st.booleans(), min_size=L, max_size=L)),
            }
            if parents and draw(st.booleans()):
                p = draw(st.sampled_from(parents))
                b = draw(st.integers(1, len(virtual[p]["s"]) - 1))
                own["s"][0] = virtual[p]["s"][b]
                virtual.append({k: virtual[p][k][:b] + own[k] for k in own})
                parent_id = p * 7 + 3
            else:
                b, parent_id = 0, -1
                virtual.append(own)
            for k in own:
                cols[k] += own[k]
            cols["group"] += [g * 5 - 2] * L
            cols["traj"] += [tid * 7 + 3] * L
            cols["step"] += list(range(b, b + L))
            cols["p"] += [parent_id] * L
            members.append(tid)
            tid += 1
    return StepBatch(
        cols["group"], cols["traj"], cols["step"], cols["r"], cols["s"], cols["a"],
        cols["inv"] if draw(st.booleans()) else None, cols["p"],
    )  # fmt: skip


@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
@given(batch=branched_batches(), cfg=configs(), data=st.data())
def test_branched_fast_equals_reference(estimator, batch, cfg, data):
    inputs = data.draw(step_inputs(estimator, batch))
    if "observations" in inputs:  # a branch's first observation is its parent's at that step
        inputs["observations"] = default_inputs(estimator, batch)["observations"]
    out = compute_advantages(estimator, batch, cfg, **inputs)
    fast = out.advantages
    ref = np.asarray(ref_estimate(estimator, batch, cfg, **inputs))
    if cfg.zero_rule == "value" and estimator in ("hgpo", "hgpo-uniform"):
        # as in test_equivalence: "A_k == 0.0" is decided by rounding near a group's mean
        A = np.vstack([out.level_advantages, np.asarray(ref_levels(batch, cfg, cfg.K)[0])])
        if cfg.base_group:
            A = np.vstack([A, ref_episode(batch, cfg)[0]])
        clear = ~((A != 0) & (np.abs(A) < 1e-9)).any(axis=0)
        fast, ref = fast[clear], ref[clear]
    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-12)


@given(batch=branched_batches(), cfg=configs())
def test_branched_context_keys_are_exact(batch, cfg):
    keys = context_keys(batch, cfg.K, cfg.include_actions, cfg.early)
    for k in range(cfg.K + 1):
        ctx = [ref_context(batch, row, k, cfg) for row in range(batch.n_steps)]
        for i in range(batch.n_steps):
            assert (keys[k, i] < 0) == (ctx[i] is None)
            for j in range(i + 1, batch.n_steps):
                if ctx[i] is not None and ctx[j] is not None:
                    assert (keys[k, i] == keys[k, j]) == (ctx[i] == ctx[j])


def _example() -> StepBatch:
    """Root 0: states 5 6 7 8, rewards 0 0 1 2. Branch 1 from root at step 2 (state 7):
    own rows steps 2..3, states 7 9, rewards 0 4. Branch 2 from branch 1 at step 3 (state 9)."""
    return StepBatch(
        group=[0, 0, 0, 0, 0, 0, 0],
        traj=[0, 0, 0, 0, 1, 1, 2],
        step=[0, 1, 2, 3, 2, 3, 3],
        reward=[0.0, 0.0, 1.0, 2.0, 0.0, 4.0, 10.0],
        state=[5, 6, 7, 8, 7, 9, 9],
        parent=[-1, -1, -1, -1, 0, 0, 1],
    )


def test_hand_worked_branch():
    b = _example()
    # episode returns over the virtual trajectories: 0+0+1+2 = 3; 0+0 (prefix) +0+4 = 4;
    # prefix of branch 2 is V(1)[0:3] = rows 0, 1, 4: rewards 0 0 0, then 10 -> 10.
    np.testing.assert_array_equal(episode_returns(b), [3.0, 4.0, 10.0])
    cfg = EstimatorConfig(K=2, gamma=1.0)
    keys = context_keys(b, 2)
    # step 2 of the root and the first row of branch 1 share (s0, s1, s2) = (5, 6, 7)
    assert keys[2, 2] == keys[2, 4]
    # step 3 of branch 1 and of branch 2: contexts (6, 7, 9) both: one level-2 group
    assert keys[2, 5] == keys[2, 6]
    assert keys[2, 3] != keys[2, 5]  # (6, 7, 8) vs (6, 7, 9)
    out = compute_advantages("oracle", b, cfg)
    # level-2 group {row 2: R = 1 + 2 = 3, row 4: R = 0 + 4 = 4}: +-1 after mean_std
    np.testing.assert_allclose(out.advantages[[2, 4]], [-1.0, 1.0], atol=1e-5)
    # group {row 5: R = 4, row 6: R = 10}
    np.testing.assert_allclose(out.advantages[[5, 6]], [-1.0, 1.0], atol=1e-5)
    # the prefix rows are samples once: 7 rows, utilisation of level 2 = 4 / 7
    assert out.diagnostics["levels"][2]["utilisation"] == pytest.approx(4 / 7)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parent": [-1, -1, -1, -1, 2, 2, 1]}, "listed earlier"),
        ({"parent": [-1, -1, -1, -1, 0, 0, 7]}, "listed earlier"),
        ({"state": [5, 6, 7, 8, 8, 9, 9]}, "differs from its parent's state"),
        ({"parent": [-1, -1, -1, -1, 0, -1, 1]}, "one parent"),
        ({"parent": [-1, -1, -1, -1, -1, -1, 1]}, "no parent"),
        ({"step": [0, 1, 2, 3, 4, 5, 3], "parent": [-1, -1, -1, -1, 0, 0, 1]}, "1..3"),
        ({"group": [0, 0, 0, 0, 1, 1, 1]}, "lies in group 0"),
        ({"parent": [-1, -1, -1, -1, 0, 0, -5]}, r"parent\[6\] is -5: a parent is a trajectory id"),
    ],
)
@pytest.mark.parametrize("ids", [(0, 1, 2), (30, 10, 20)])
def test_bad_branches_are_named(change, message, ids):
    """Also with trajectory ids that are not 0..n-1 in order (the checks' general path)."""
    b = _example()
    fields = {k: getattr(b, k) for k in ("group", "traj", "step", "reward", "state", "parent")}
    fields.update({k: np.asarray(v) for k, v in change.items()})
    relabel = {**dict(enumerate(ids)), -1: -1, -5: -5, 7: 7}
    fields["traj"] = np.array([relabel[int(i)] for i in fields["traj"]])
    fields["parent"] = np.array([relabel[int(i)] for i in fields["parent"]])
    with pytest.raises(ValueError, match=message):
        StepBatch(**fields)


def test_relabelled_trajectory_ids_give_the_same_layout():
    b = _example()
    fields = {k: getattr(b, k) for k in ("group", "step", "reward", "state")}
    relabel = {0: 30, 1: 10, 2: 20, -1: -1}
    c = StepBatch(
        traj=[relabel[int(i)] for i in b.traj], parent=[relabel[int(i)] for i in b.parent],
        **fields,
    )  # fmt: skip
    for name in ("parent", "branch_step", "virtual_len", "first", "virtual_rows"):
        np.testing.assert_array_equal(getattr(c.branches, name), getattr(b.branches, name))


@pytest.mark.parametrize(
    ("step", "traj", "message"),
    [
        ([1, 2, 0], [0, 0, 1], r"step\[0\] is 1; a trajectory must start at step 0"),
        ([0, 1, 2], [0, 0, 1], r"step\[2\] is 2 \(traj 1\) after step 1 \(traj 0\)"),
        ([0, 2, 0], [0, 0, 1], r"step\[1\] is 2 \(traj 0\) after step 0 \(traj 0\)"),
    ],
)
def test_a_batch_with_roots_only_names_what_an_unbranched_one_does(step, traj, message):
    """parent all -1: the same errors as without a parent column."""
    for parent in (None, [-1, -1, -1]):
        with pytest.raises(ValueError, match=message):
            StepBatch([0, 0, 0], traj, step, [0.0, 0.0, 0.0], [1, 2, 1], parent=parent)


def test_parents_all_minus_one_is_the_unbranched_batch():
    # (actions for ecpo, which reads them; no other estimator does here)
    b = StepBatch([0, 0, 0], [0, 0, 1], [0, 1, 0], [1.0, 0.0, 2.0], [1, 2, 1], [0, 1, 1],
                  parent=[-1] * 3)  # fmt: skip
    assert b.branches is None
    u = StepBatch([0, 0, 0], [0, 0, 1], [0, 1, 0], [1.0, 0.0, 2.0], [1, 2, 1], [0, 1, 1])
    for name in GROUP_ESTIMATORS:
        np.testing.assert_array_equal(
            compute_advantages(name, b, **default_inputs(name, b)).advantages,
            compute_advantages(name, u, **default_inputs(name, u)).advantages,
        )
