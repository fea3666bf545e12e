"""Bad input gets a ValueError that names the field and the value."""

import numpy as np
import pytest

from hgpo import EstimatorConfig, StepBatch, compute_advantages, context_keys, state_ids


def batch(**over):
    kw = dict(
        group=[0, 0, 0], traj=[0, 0, 1], step=[0, 1, 0], reward=[0.0, 1.0, 0.0], state=[1, 2, 1]
    )
    kw.update(over)
    return StepBatch(**kw)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        (dict(reward=[0.0, np.nan, 0.0]), r"reward\[1\] is nan"),
        (dict(reward=[0.0, np.inf, 0.0]), r"reward\[1\] is inf"),
        (dict(state=[1, 2]), r"state has length 2, expected 3"),
        (dict(step=[0, 2, 0]), r"step\[1\] is 2"),
        (dict(step=[1, 2, 0]), r"step\[0\] is 1"),
        (dict(traj=[0, 1, 1]), r"step\[1\] is 1 \(traj 1\)"),
        (dict(traj=[0, 0, 0]), r"traj value 0 labels two separate runs"),
        (dict(group=[0, 1, 0]), r"group\[1\] is 1"),
        (dict(step=[0, -1, 0]), r"step\[1\] is -1"),
        (dict(state=[1.5, 2, 1]), r"state must hold integers, got 1.5"),
        (dict(reward=["a", "b", "c"]), r"reward must be numeric"),
        (dict(group=[], traj=[], step=[], reward=[], state=[]), r"empty"),
    ],
)
def test_step_batch_validation(over, match):
    with pytest.raises(ValueError, match=match):
        batch(**over)


def test_trajectory_ids_need_not_rise_only_be_unique():
    """Uniqueness has a fast path for rising ids; falling or gapped unique ids are fine too, and
    a duplicate among non-rising ids is still found."""
    b = StepBatch(group=[0, 0, 1, 1], traj=[7, 7, 3, 9], step=[0, 1, 0, 0], reward=[0.0] * 4,
                  state=[0] * 4)  # fmt: skip
    assert b.traj_start.tolist() == [0, 2, 3] and b.traj_index.tolist() == [0, 0, 1, 2]
    assert b.traj_len.tolist() == [2, 1, 1]
    with pytest.raises(ValueError, match="traj value 7 labels two separate runs"):
        StepBatch(group=[0, 0, 0], traj=[7, 3, 7], step=[0, 0, 0], reward=[0.0] * 3, state=[0] * 3)


def test_unknown_estimator_and_option():
    with pytest.raises(ValueError, match=r"unknown estimator 'ppo'; known estimators: grpo, rloo"):
        compute_advantages("ppo", batch())
    with pytest.raises(ValueError, match=r"unknown estimator option 'KK'"):
        compute_advantages("hgpo", batch(), KK=2)


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (dict(K=-1), r"K must be a non-negative integer, got -1"),
        (dict(K=1.5), r"K must be a non-negative integer, got 1.5"),
        (dict(alpha=-1.0), r"alpha must be a number >= 0, got -1.0"),
        (dict(gamma=1.5), r"gamma must be a number in \[0, 1\], got 1.5"),
        (dict(alpha=float("nan")), r"alpha must be a number >= 0, got nan"),
        (dict(norm="zscore"), r"norm must be one of \('mean_std', 'mean'\), got 'zscore'"),
        (dict(early="late"), r"early must be one of"),
        (dict(weight_offset=0), r"weight_offset must be a number > 0, got 0"),
    ],
)
def test_config_validation(opts, match):
    with pytest.raises(ValueError, match=match):
        EstimatorConfig(**opts)


def test_keys_and_gae_errors():
    with pytest.raises(ValueError, match="K must be a non-negative integer, got -2"):
        context_keys(batch(), -2)
    with pytest.raises(ValueError, match=r"include_actions=True needs StepBatch\.action"):
        context_keys(batch(), 1, include_actions=True)
    with pytest.raises(ValueError, match="gae' needs values"):
        compute_advantages("gae", batch())
    with pytest.raises(ValueError, match=r"values has shape \(2,\), expected \(3,\)"):
        compute_advantages("gae", batch(), values=np.zeros(2))


def test_state_ids():
    ids = state_ids(
        ["You arrive at fridge 1.", "b", "You arrive at fridge 1.", np.ones(2), np.ones(2)]
    )
    assert ids.tolist() == [0, 1, 0, 2, 2]
    with pytest.raises(ValueError, match="observation of type set is not hashable"):
        state_ids([{1}])
