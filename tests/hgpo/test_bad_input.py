"""Bad input gets a ValueError that names the field and the value: one table per entry point."""

import math

import numpy as np
import pytest

from hgpo import (
    ESTIMATORS,
    EstimatorConfig,
    StepBatch,
    compute_advantages,
    context_keys,
    state_ids,
)
from hgpo.estimators import hgpo as hgpo_fn
from hgpo.keys import hierarchy
from hgpo.options import parse_name_values
from hgpo.returns import discounted_returns, episode_returns, penalised_rewards
from tests.hgpo.strategies import default_inputs


def batch(**over):
    kw = dict(
        group=[0, 0, 0], traj=[0, 0, 1], step=[0, 1, 0], reward=[0.0, 1.0, 0.0], state=[1, 2, 1]
    )
    kw.update(over)
    return StepBatch(**kw)


def pair(reward):
    """Two one-step trajectories in one group, same state, two actions (ecpo's canonical
    actions; no other estimator reads them here): every group estimator compares them."""
    return StepBatch(group=[0, 0], traj=[0, 1], step=[0, 0], reward=reward, state=[0, 0],
                     action=[0, 1])  # fmt: skip


# --------------------------------------------------------------------------- StepBatch(...)

HINT = r"hgpo\.state_ids"


BATCH_TABLE = [
        (dict(reward=[0.0, np.nan, 0.0]), r"reward\[1\] is nan"),
        (dict(reward=[0.0, np.inf, 0.0]), r"reward\[1\] is inf"),
        (dict(state=[1, 2]), r"state has length 2, expected 3"),
        (dict(step=[0, 2, 0]), r"step\[1\] is 2"),
        (dict(step=[1, 2, 0]), r"step\[0\] is 1"),
        (dict(traj=[0, 1, 1]), r"step\[1\] is 1 \(traj 1\)"),
        (dict(traj=[0, 0, 0]), r"traj value 0 labels two separate runs"),
        (dict(group=[0, 1, 0]), r"group\[1\] is 1"),
        (dict(step=[0, -1, 0]), r"step\[1\] is -1"),
        (dict(state=[1.5, 2, 1]), r"state must hold integers, got 1\.5"),
        (dict(reward=["a", "b", "c"]), r"reward must be numeric"),
        (dict(group=[], traj=[], step=[], reward=[], state=[]), r"empty"),
        # strings, None and ints past int64 name the field and point to state_ids
        (dict(state=["kitchen", "hall", "kitchen"]), r"StepBatch\.state must hold integers, got <U7 values such as 'kitchen'.*" + HINT),
        (dict(state=[None, None, None]), r"StepBatch\.state must hold integers, got None at \[0\].*" + HINT),
        (dict(state=[1, 2**70, 1]), r"StepBatch\.state\[1\] is 1180591620717411303424, outside the int64 range.*" + HINT),
        (dict(state=np.array([1, 2**64 - 1, 1], dtype=np.uint64)), r"state\[1\] is 18446744073709551615, outside the int64"),
        (dict(state=[1.0, np.nan, 1.0]), r"state must hold integers, got nan"),
        (dict(action=["go", "go", "go"]), r"StepBatch\.action must hold integers.*state_ids"),
        (dict(traj=[0, 0, 2**70]), r"StepBatch\.traj\[2\] is 1180591620717411303424, outside the int64 range$"),
        (dict(group=[True, True, True]), r"group must hold integers, got dtype bool"),
        (dict(state=[[1], [2, 3], [1]]), r"StepBatch\.state: must be a sequence of integers"),
        (dict(invalid=[0, 2, 0]), r"invalid must be boolean, got 2"),
        (dict(invalid=[None, 0, 0]), r"invalid must be boolean, got None"),
        (dict(invalid=[2**70, 0, 0]), r"invalid must be boolean, got 1180591620717411303424"),
        (dict(invalid=["1", 0, 0]), r"invalid must be boolean, got '1'"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "match"), BATCH_TABLE)
def test_step_batch_table(over, match):
    with pytest.raises(ValueError, match=match):
        batch(**over)


@pytest.mark.parametrize(("over", "match"), BATCH_TABLE)
def test_step_batch_table_with_a_parent_column_of_roots(over, match):
    """parent all -1 (a branching rollout that drew no branch): the same errors."""
    with pytest.raises(ValueError, match=match):
        batch(parent=[-1] * len(over.get("group", [0, 0, 0])), **over)


def test_step_batch_accepts_integer_valued_input_of_any_int_or_float_dtype():
    for state in ([1, 2, 1], np.array([1, 2, 1], np.int32), [1.0, 2.0, 1.0], [1, 2.0, np.int64(1)]):
        assert batch(state=state).state.tolist() == [1, 2, 1]
    assert batch(state=[-(2**63), 0, 2**63 - 1]).state.dtype == np.int64


def test_trajectory_ids_need_not_rise_only_be_unique():
    """Uniqueness has a fast path for rising ids; falling or gapped unique ids are fine too, and
    a duplicate among non-rising ids is still found."""
    b = StepBatch(group=[0, 0, 1, 1], traj=[7, 7, 3, 9], step=[0, 1, 0, 0], reward=[0.0] * 4,
                  state=[0] * 4)  # fmt: skip
    assert b.traj_start.tolist() == [0, 2, 3] and b.traj_index.tolist() == [0, 0, 1, 2]
    assert b.traj_len.tolist() == [2, 1, 1]
    with pytest.raises(ValueError, match="traj value 7 labels two separate runs"):
        StepBatch(group=[0, 0, 0], traj=[7, 3, 7], step=[0, 0, 0], reward=[0.0] * 3, state=[0] * 3)


# --------------------------------------------------------------------------- from_trajectories


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([], [], []), r"from_trajectories: no trajectories"),
        (([0, 0], [[1.0]], [[0]]), r"groups \(2\), rewards \(1\) and states \(1\)"),
        (([0], [[1.0, 2.0]], [[0]]), r"trajectory 0 has 2 rewards but 1 states"),
        (([0], [[]], [[]]), r"trajectory 0 is empty"),
        (([0], [["x"]], [[0]]), r"trajectory 0 has a reward 'x'"),
        (([0], [[None]], [[0]]), r"trajectory 0 has a reward None"),
        (([0], [[1.0]], [["kitchen"]]), r"StepBatch\.state must hold integers.*state_ids"),
        # groups are integers as given (numpy would read 1.5 and True as 1)
        (([1.5], [[1.0]], [[0]]), r"from_trajectories: groups\[0\] must be an integer, got 1\.5"),
        (([True], [[1.0]], [[0]]), r"from_trajectories: groups\[0\] must be an integer, got True"),
        # actions / invalid: one sequence per trajectory, of its length (else rows shift)
        (([0, 0], [[0.0], [1.0]], [[0], [0]], [[0, 1], []]), r"trajectory 0 has 2 actions but 1 rewards"),
        (([0, 0], [[0.0], [1.0]], [[0], [0]], [[0, 1]]), r"actions lists 1 trajectories, expected 2"),
        (([0], [[0.0]], [[0]], None, [None]), r"from_trajectories: invalid\[0\] must be a sequence, got None"),
    ],
)  # fmt: skip
def test_from_trajectories_table(args, match):
    with pytest.raises(ValueError, match=match):
        StepBatch.from_trajectories(*args)


# --------------------------------------------------------------------------- EstimatorConfig

NUMERIC = ("alpha", "gamma", "eps", "weight_offset", "weight_eps", "base_weight",
           "invalid_penalty", "omega", "gae_lambda")  # fmt: skip


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (dict(K=-1), r"^EstimatorConfig\.K: must be an integer in 0\.\.256, got -1 \(each level"),
        (dict(K=1.5), r"EstimatorConfig\.K: must be an integer in 0\.\.256, got 1\.5"),
        (dict(K=True), r"EstimatorConfig\.K: must be an integer"),
        # K is bounded before anything is allocated, with the reason in the message
        (dict(K=2**40), r"K: must be an integer in 0\.\.256, got 1099511627776 \(each level is a pass over the batch"),
        (dict(K=10**5), r"K: must be an integer in 0\.\.256, got 100000"),
        (dict(alpha=-1.0), r"^EstimatorConfig\.alpha: must be a finite number >= 0\.0, got -1\.0$"),
        (dict(gamma=1.5), r"EstimatorConfig\.gamma: must be a finite number in \[0\.0, 1\.0\], got 1\.5"),
        (dict(alpha=math.nan), r"EstimatorConfig\.alpha: must be a finite number >= 0\.0, got nan"),
        (dict(norm="zscore"), r"EstimatorConfig\.norm: must be one of 'mean_std', 'mean', got 'zscore'"),
        (dict(early="late"), r"EstimatorConfig\.early: must be one of"),
        (dict(weight_offset=0), r"EstimatorConfig\.weight_offset: must be a finite number > 0\.0, got 0"),
        (dict(omega="x"), r"EstimatorConfig\.omega: must be a finite number >= 0\.0, got 'x'"),
        (dict(omega=None), r"EstimatorConfig\.omega: must be a finite number"),
        (dict(base_group="yes"), r"EstimatorConfig\.base_group: must be true or false, got 'yes'"),
        (dict(leave_one_out=1), r"EstimatorConfig\.leave_one_out: must be true or false, got 1"),
        # finite options whose level weights over- or underflow float64
        (dict(alpha=1000.0, weight_offset=10.0), r"level weights .* must be finite and non-zero in float64.* give inf at k = 0 and inf at k = 2"),
        (dict(alpha=2000.0, weight_offset=0.5), r"level weights .* give 0\.0 at k = 0 and .* at k = 2"),
        (dict(K=6, alpha=380.0), r"give 1\.0 at k = 0 and inf at k = 6"),
        (dict(base_group=True, base_weight=1.7e308, weight_offset=1e308), r"must be finite and non-zero in float64, with their sum"),
    ]
    + [(dict([(name, v)]), rf"^EstimatorConfig\.{name}: must be a finite number")
       for name in NUMERIC for v in (math.inf, -math.inf, math.nan, "1", True)],
)  # fmt: skip
def test_config_table(opts, match):
    with pytest.raises(ValueError, match=match):
        EstimatorConfig(**opts)


def test_config_accepts_numpy_scalars_and_stores_python_numbers():
    cfg = EstimatorConfig(K=np.int64(2), alpha=np.float32(1.0), gamma=np.float64(0.5),
                          base_group=np.bool_(True))  # fmt: skip
    assert (cfg.K, cfg.alpha, cfg.gamma, cfg.base_group) == (2, 1.0, 0.5, True)
    assert type(cfg.K) is int and type(cfg.alpha) is float and type(cfg.base_group) is bool
    assert cfg == EstimatorConfig(K=2, alpha=1.0, gamma=0.5, base_group=True)
    out = compute_advantages("hgpo", batch(), K=np.int64(2), alpha=np.float32(1.0))
    assert np.isfinite(out.advantages).all()


# --------------------------------------------------------------------------- compute_advantages


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: compute_advantages("ppo", batch()), r"unknown estimator 'ppo'; known estimators: grpo, rloo"),
        (lambda: compute_advantages("hgpo", batch(), KK=2), r"unknown estimator option 'KK'"),
        (lambda: compute_advantages("hgpo", {"reward": [1.0]}), r"estimator 'hgpo': batch must be a StepBatch .*got dict"),
        (lambda: compute_advantages("grpo", None), r"batch must be a StepBatch .*got NoneType"),
        (lambda: compute_advantages("hgpo", batch(), {"K": 2}), r"config must be an EstimatorConfig .*got dict"),
        (lambda: hgpo_fn(batch(), None), r"estimator 'hgpo': config must be an EstimatorConfig .*got NoneType"),
        (lambda: hgpo_fn({}, EstimatorConfig()), r"batch must be a StepBatch .*got dict"),
        (lambda: compute_advantages("hgpo", batch(), alpha=math.inf), r"EstimatorConfig\.alpha: must be a finite number"),
        (lambda: compute_advantages("grpo", batch(), eps=math.inf), r"EstimatorConfig\.eps: must be a finite number"),
        (lambda: compute_advantages("gae", batch()), r"gae' needs values"),
        (lambda: compute_advantages("gae", batch(), values=np.zeros(2)), r"gae: values: must be one value per step, shape \(3,\), got shape \(2,\)"),
        (lambda: compute_advantages("gae", batch(), values=np.ones(3, dtype=bool)), r"gae: values: must be 3 real numbers, one per step, got dtype bool"),
        (lambda: compute_advantages("gae", batch(), values=np.ones(3, dtype=complex)), r"gae: values: must be 3 real numbers, one per step, got dtype complex128"),
        (lambda: compute_advantages("gae", batch(), values=["1", "2", "3"]), r"gae: values: must be 3 real numbers, one per step, got dtype <U1"),
        (lambda: compute_advantages("grpo", batch(), values=np.zeros(3)), r"values: estimator 'grpo' does not read state values \(only gae does\); leave values out"),
        (lambda: compute_advantages("gae", batch(), values=[0.0, math.nan, 0.0]), r"values\[1\] is nan"),
        # finite rewards whose return overflows: the trajectory is named
        (lambda: compute_advantages("hgpo", StepBatch.from_trajectories([0, 0], [[1e308, 1e308], [0.0, 0.0]], [[0, 1], [0, 1]]), gamma=1.0),
         r"the return of step 0 of trajectory 0 \(row 0\) overflows float64 \(inf\).*scale them down"),
        (lambda: compute_advantages("grpo", StepBatch.from_trajectories([0, 0], [[0.0], [-1.7e308]], [[0], [0]], invalid=[[False], [True]]), invalid_penalty=1e308),
         r"penalised reward of step 0 of trajectory 1 \(row 1\) overflows"),
        (lambda: compute_advantages("gigpo", StepBatch.from_trajectories([0, 0], [[0.0], [-1.7e308]], [[0], [0]], invalid=[[False], [True]]), invalid_penalty=1e308, penalty_mode="after_discount"),
         r"return of step 0 of trajectory 1 \(row 1\) overflows"),
        # finite returns whose advantage overflows (rloo's n / (n - 1), in reward units)
        (lambda: compute_advantages("rloo", pair([1.7e308, -1.7e308]), norm="mean"),
         r"estimator 'rloo': the advantage of step 0 of trajectory 0 \(row 0\) overflows float64"),
    ],
)  # fmt: skip
def test_compute_advantages_table(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- context_keys


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(K=-2), r"^K: must be an integer in 0\.\.256, got -2"),
        (dict(K=2**40), r"^K: must be an integer in 0\.\.256, got 1099511627776 \(each level"),
        (dict(K="2"), r"^K: must be an integer"),
        (dict(K=1, include_actions=True), r"include_actions=True needs StepBatch\.action"),
        (dict(K=1, early="late"), r"^early: must be one of 'paper', 'drop', got 'late'$"),
        (dict(K=1, include_actions="x"), r"^include_actions: must be true or false, got 'x'$"),
    ],
)
def test_context_keys_table(kw, match):
    with pytest.raises(ValueError, match=match):
        context_keys(batch(), **kw)


R3 = np.array([1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: hierarchy(batch(), 1, R3, norm="x"), r"^norm: must be one of 'mean_std', 'mean', got 'x'$"),
        (lambda: hierarchy(batch(), 1, R3, std="x"), r"^std: must be one of 'population', 'sample'"),
        (lambda: hierarchy(batch(), 1, R3, eps=math.nan), r"^eps: must be a finite number >= 0\.0, got nan$"),
        (lambda: hierarchy(batch(), 1, R3, eps=-1.0), r"^eps: must be a finite number >= 0\.0, got -1\.0$"),
        (lambda: hierarchy(batch(), 1, R3, leave_one_out=2), r"^leave_one_out: must be true or false, got 2$"),
        (lambda: hierarchy(batch(), 1, R3, chunk_rows=0), r"^chunk_rows: must be an integer >= 1, got 0$"),
        (lambda: hierarchy(batch(), 1, np.zeros(10)), r"^returns: must be one value per step, shape \(3,\), got shape \(10,\)$"),
        (lambda: hierarchy(batch(), 1, np.array([1.0, math.nan, 1.0])), r"^returns\[1\] is nan; every value must be finite$"),
        (lambda: hierarchy(None, 1), r"^batch: must be a StepBatch, got NoneType$"),
        (lambda: discounted_returns(batch(), 0.9, np.zeros(10)), r"^rewards: must be one value per step, shape \(3,\)"),
        (lambda: discounted_returns(batch(), 0.9, np.full(3, math.inf)), r"^rewards\[0\] is inf; every value must be finite$"),
        (lambda: episode_returns(batch(), np.ones(3, dtype=bool)), r"^rewards: must be 3 real numbers, one per step, got dtype bool$"),
        (lambda: penalised_rewards(batch(), math.nan), r"^invalid_penalty: must be a finite number >= 0\.0, got nan$"),
    ],
)  # fmt: skip
def test_hierarchy_and_returns_table(call, match):
    """The lower-level functions check what compute_advantages checks through its config."""
    with pytest.raises(ValueError, match=match):
        call()


def test_state_ids_refuses_one_string_and_config_choices_refuse_arrays():
    with pytest.raises(
        ValueError, match=r"state_ids: observations must be a sequence of observations, got one str"
    ):
        state_ids("abc")
    with pytest.raises(
        ValueError, match=r"EstimatorConfig\.norm: must be one of 'mean_std', 'mean', got array"
    ):
        EstimatorConfig(norm=np.array(["mean"]))
    assert type(EstimatorConfig(norm=np.str_("mean")).norm) is str
    with pytest.raises(
        ValueError, match=r"options: 'alpha' has no value in 'alpha='; give alpha=VALUE"
    ):
        parse_name_values("alpha=")


def test_state_ids():
    ids = state_ids(
        ["You arrive at fridge 1.", "b", "You arrive at fridge 1.", np.ones(2), np.ones(2)]
    )
    assert ids.tolist() == [0, 1, 0, 2, 2]
    with pytest.raises(ValueError, match="observation of type set is not hashable"):
        state_ids([{1}])


# --------------------------------------------------------------------------- the whole float64 range


@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e != "gae"])
@pytest.mark.parametrize("big", [1e154, 1e155, 1e300, 1.7e308, 1e-170, 1e-300])
def test_group_estimators_are_right_over_the_whole_float64_range(estimator, big):
    """The issue's case: with norm="mean_std" a reward of 1e155 or more gave [0, -0] (dev * dev
    overflowed); every group estimator now gives what it gives at reward 1. With eps = 0 the
    standardised advantages are scale-free; "mean" ones scale with the reward."""
    kw = default_inputs(estimator, pair([1.0, 0.0]))  # (one-step trajectories: no EMPG bonus)
    want = compute_advantages(estimator, pair([1.0, 0.0]), eps=0.0, **kw).advantages
    got = compute_advantages(estimator, pair([big, 0.0]), eps=0.0, **kw).advantages
    if estimator == "3spo" and big < 1.0:
        # 3SPO adds reward-free terms (novelty, score difference: here 0.5 - w(2) and the same
        # for both) to 0.5 r_t: a reward of 1e-170 is lost in their rounding, the pair ties.
        np.testing.assert_array_equal(got, [0.0, 0.0])
        return
    np.testing.assert_allclose(got, want, rtol=1e-15)
    if estimator in ("grpo", "hgpo", "stepwise", "oracle", "hgpo-nohog2", "hgpo-uniform"):
        np.testing.assert_array_equal(want, [1.0, -1.0])
    mean = compute_advantages(estimator, pair([big, 0.0]), norm="mean", **kw)
    if big < 1e308:  # rloo and gigpo double 1.7e308's deviation past float64
        ref = compute_advantages(estimator, pair([1.0, 0.0]), norm="mean", **kw)
        if estimator == "graphgpo":  # its step term reads graph distances, not reward sizes
            np.testing.assert_array_equal(mean.level_advantages[0], ref.level_advantages[0])
            np.testing.assert_allclose(
                mean.level_advantages[1], ref.level_advantages[1] * big, rtol=1e-15
            )
        else:
            np.testing.assert_allclose(mean.advantages, ref.advantages * big, rtol=1e-15)


def test_the_issue_case_with_the_default_eps():
    for estimator in ("grpo", "rloo", "stepwise", "gigpo", "oracle", "hgpo"):
        a = compute_advantages(estimator, pair([1e155, 0.0])).advantages
        b = compute_advantages(estimator, pair([1e154, 0.0])).advantages
        np.testing.assert_array_equal(a, b)
        assert a[0] > 0.99 and a[1] < -0.99


# --------------------------------------------------------------------------- graphgpo

NEXT_STATE_TABLE = [
        # batch(): trajectory 0 = rows 0, 1 (states 1, 2), trajectory 1 = row 2
        (dict(next_state=[3, 5, 1]), r"^StepBatch\.next_state\[0\] is 3 but the next step of trajectory 0 \(row 1\) has state 2"),
        (dict(next_state=[2, 5]), r"^StepBatch\.next_state has length 2, expected 3"),
        (dict(next_state=["hall", "x", "y"]), r"^StepBatch\.next_state must hold integers, got <U4 values such as 'hall'.*StateIndexer"),
        (dict(next_state=[2, 1.5, 0]), r"^StepBatch\.next_state must hold integers, got 1\.5"),
        (dict(next_state=[2, None, 0]), r"^StepBatch\.next_state must hold integers, got None at \[1\]"),
        (dict(next_state=[[2], [5], [1]]), r"^StepBatch\.next_state must be one-dimensional"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "match"), NEXT_STATE_TABLE)
def test_next_state_table(over, match):
    with pytest.raises(ValueError, match=match):
        batch(**over)
    with pytest.raises(ValueError, match=match):
        batch(parent=[-1, -1, -1], **over)


def test_next_state_may_be_anything_after_a_last_step():
    assert batch(next_state=[2, -7, 2**62]).next_state.tolist() == [2, -7, 2**62]


@pytest.mark.parametrize(
    ("terminal", "match"),
    [
        ([1], r"from_trajectories: terminal_states lists 1 states, expected 2 \(one per trajectory\)"),
        ([1, "hall"], r"from_trajectories: terminal_states: StepBatch\.next_state must hold integers"),
        ([1, 2.5], r"from_trajectories: terminal_states: StepBatch\.next_state must hold integers, got 2\.5"),
    ],
)  # fmt: skip
def test_from_trajectories_terminal_states(terminal, match):
    with pytest.raises(ValueError, match=match):
        StepBatch.from_trajectories([0, 0], [[0.0, 1.0], [0.0]], [[1, 2], [1]],
                                    terminal_states=terminal)  # fmt: skip


GRAPH_NUMERIC = ("graph_gamma", "graph_success_return", "graph_step_weight",
                 "graph_episode_weight")  # fmt: skip


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (dict(graph_gamma=1.5), r"^EstimatorConfig\.graph_gamma: must be a finite number in \[0\.0, 1\.0\], got 1\.5$"),
        (dict(graph_gamma=-0.1), r"^EstimatorConfig\.graph_gamma: must be a finite number in \[0\.0, 1\.0\], got -0\.1$"),
        (dict(graph_step_weight=-1.0), r"^EstimatorConfig\.graph_step_weight: must be a finite number in \[0\.0, 1000000\.0\], got -1\.0$"),
        (dict(graph_episode_weight=1e7), r"^EstimatorConfig\.graph_episode_weight: must be a finite number in \[0\.0, 1000000\.0\], got 10000000\.0$"),
        (dict(graph_success_return=1e13), r"^EstimatorConfig\.graph_success_return: must be a finite number in \[-1000000000000\.0, 1000000000000\.0\], got 10000000000000\.0$"),
        (dict(graph_normalize_distance="no"), r"^EstimatorConfig\.graph_normalize_distance: must be true or false, got 'no'$"),
    ]
    + [(dict([(name, v)]), rf"^EstimatorConfig\.{name}: must be a finite number")
       for name in GRAPH_NUMERIC for v in (math.inf, -math.inf, math.nan, "1", True)],
)  # fmt: skip
def test_graph_config_table(opts, match):
    with pytest.raises(ValueError, match=match):
        EstimatorConfig(**opts)


def test_graphgpo_refuses_two_zero_weights_before_any_work():
    with pytest.raises(
        ValueError, match=r"^graphgpo: graph_step_weight and graph_episode_weight are both 0"
    ):
        compute_advantages("graphgpo", batch(), graph_step_weight=0.0, graph_episode_weight=0.0)
    with pytest.raises(ValueError, match=r"estimator 'graphgpo': batch must be a StepBatch"):
        compute_advantages("graphgpo", {"reward": [1.0]})


# --------------------------------------------------------------------------- empg / gigpo variants


def _new_estimator_cases():
    from hgpo.empg import empg
    from hgpo.gigpo_variants import gigpo_similarity

    b, cfg = batch(), EstimatorConfig()
    return [
        (lambda: compute_advantages("empg", b), r"^estimator 'empg' needs entropy: float64\[n\] >= 0"),
        (lambda: empg(b, cfg), r"^estimator 'empg' needs entropy"),
        (lambda: compute_advantages("empg", b, entropy=[0.0, -0.5, 1.0]), r"^empg: entropy\[1\] is -0\.5; an entropy is >= 0$"),
        (lambda: empg(b, cfg, entropy=[0.0, -1.0, 0.0]), r"^empg: entropy\[1\] is -1\.0; an entropy is >= 0$"),
        (lambda: compute_advantages("empg", b, entropy=[0.0, 1.0]), r"^empg: entropy: must be one value per step, shape \(3,\), got shape \(2,\)$"),
        (lambda: compute_advantages("empg", b, entropy=[math.nan, 1.0, 1.0]), r"^empg: entropy\[0\] is nan; every value must be finite$"),
        (lambda: compute_advantages("empg", b, entropy=["a", "b", "c"]), r"^empg: entropy: must be 3 real numbers, one per step, got dtype <U1$"),
        (lambda: compute_advantages("gigpo_similarity", b), r"^estimator 'gigpo_similarity' needs observations: a sequence of n str"),
        (lambda: gigpo_similarity(b, cfg), r"^estimator 'gigpo_similarity' needs observations: a sequence of 3 str"),
        (lambda: compute_advantages("gigpo_similarity", b, observations=["a", "b"]), r"^gigpo_similarity: observations: must be one str per step, 3, got 2$"),
        (lambda: compute_advantages("gigpo_similarity", b, observations=["a", 3, "c"]), r"^gigpo_similarity: observations\[1\] is 3; every observation must be a str$"),
        (lambda: gigpo_similarity(b, cfg, observations=["a", None, "c"]), r"^gigpo_similarity: observations\[1\] is None; every observation must be a str$"),
        (lambda: compute_advantages("gigpo_similarity", b, observations="abc"), r"^gigpo_similarity: observations: must be a sequence of 3 str, one per step, got str$"),
        (lambda: compute_advantages("grpo", b, entropy=[0.0, 0.0, 0.0]), r"^entropy: estimator 'grpo' does not read the policy's entropy \(only empg does\); leave entropy out$"),
        (lambda: compute_advantages("gigpo", b, observations=["a", "b", "c"]), r"^observations: estimator 'gigpo' does not read observations \(only gigpo_similarity does\)"),
        (lambda: EstimatorConfig(gigpo_similarity_thresh=1.0), r"^EstimatorConfig\.gigpo_similarity_thresh: must be a finite number in \(0\.0, 1\.0\), got 1\.0$"),
        (lambda: EstimatorConfig(gigpo_similarity_thresh=0.0), r"gigpo_similarity_thresh: must be a finite number in \(0\.0, 1\.0\), got 0\.0$"),
        (lambda: EstimatorConfig(empg_k=math.inf), r"^EstimatorConfig\.empg_k: must be a finite number in \[0\.0, 50\.0\], got inf$"),
        (lambda: EstimatorConfig(empg_k_future=-1.0), r"^EstimatorConfig\.empg_k_future: must be a finite number in \[0\.0, 50\.0\], got -1\.0$"),
        (lambda: EstimatorConfig(empg_zeta=1e9), r"^EstimatorConfig\.empg_zeta: must be a finite number in \[0\.0, 100\.0\]"),
        (lambda: EstimatorConfig(empg_eps=2.0), r"^EstimatorConfig\.empg_eps: must be a finite number in \[0\.0, 1\.0\], got 2\.0$"),
        (lambda: EstimatorConfig(empg_final_norm="std"), r"^EstimatorConfig\.empg_final_norm: must be one of 'mean', 'none', got 'std'$"),
        (lambda: EstimatorConfig(gigpo_dynamic_rescale="yes"), r"^EstimatorConfig\.gigpo_dynamic_rescale: must be true or false, got 'yes'$"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(len(_new_estimator_cases())))
def test_empg_and_gigpo_variants_name_bad_input(case):
    fn, message = _new_estimator_cases()[case]
    with pytest.raises(ValueError, match=message):
        fn()


# --------------------------------------------------------------------------- ecpo

ECPO_NUMERIC = ("ecpo_kappa", "ecpo_tau", "ecpo_omega", "ecpo_gate_eps")


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (dict(ecpo_kappa=-1.0), r"^EstimatorConfig\.ecpo_kappa: must be a finite number in \[0\.0, 1000000\.0\], got -1\.0$"),
        (dict(ecpo_kappa=1e7), r"^EstimatorConfig\.ecpo_kappa: must be a finite number in \[0\.0, 1000000\.0\], got 10000000\.0$"),
        (dict(ecpo_tau=0.0), r"^EstimatorConfig\.ecpo_tau: must be a finite number in \(0\.0, 1000000\.0\], got 0\.0$"),
        (dict(ecpo_omega=-0.5), r"^EstimatorConfig\.ecpo_omega: must be a finite number in \[0\.0, 1000000\.0\], got -0\.5$"),
        (dict(ecpo_gate_eps=-1e-9), r"^EstimatorConfig\.ecpo_gate_eps: must be a finite number in \[0\.0, 1000000\.0\], got -1e-09$"),
        (dict(ecpo_gate="off"), r"^EstimatorConfig\.ecpo_gate: must be one of 'variance', 'none', got 'off'$"),
    ]
    + [(dict([(name, v)]), rf"^EstimatorConfig\.{name}: must be a finite number")
       for name in ECPO_NUMERIC for v in (math.inf, -math.inf, math.nan, "1", True)],
)  # fmt: skip
def test_ecpo_config_table(opts, match):
    with pytest.raises(ValueError, match=match):
        EstimatorConfig(**opts)
    with pytest.raises(ValueError, match=match):
        compute_advantages("ecpo", pair([1.0, 0.0]), **opts)


def test_ecpo_needs_the_action_column_before_any_work(monkeypatch):
    """A batch without StepBatch.action (the canonical actions) is a named error, raised
    before the returns are computed (step_returns is made to fail here: it is never reached)."""
    import hgpo.ecpo

    def boom(*args, **kwargs):
        raise AssertionError("step_returns was called")

    monkeypatch.setattr(hgpo.ecpo, "step_returns", boom)
    no_actions = StepBatch(group=[0, 0], traj=[0, 1], step=[0, 0], reward=[1.0, 0.0],
                           state=[0, 0])  # fmt: skip
    with pytest.raises(ValueError, match=r"^estimator 'ecpo' needs StepBatch\.action: the "
                       r"canonical action key of every step"):  # fmt: skip
        compute_advantages("ecpo", no_actions)
    with pytest.raises(ValueError, match=r"estimator 'ecpo': batch must be a StepBatch"):
        compute_advantages("ecpo", {"reward": [1.0]})
    with pytest.raises(ValueError, match=r"^values: estimator 'ecpo' does not read state values"):
        compute_advantages("ecpo", pair([1.0, 0.0]), values=[0.0, 0.0])
