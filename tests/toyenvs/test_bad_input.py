"""Bad input to the toyenvs API below rollout(): named errors, never an out-of-bounds read (a
start state out of range used to segfault the kernels), a hang or a NaN policy."""

from __future__ import annotations

import numpy as np
import pytest

import toyenvs
from toyenvs.gym import POMDPEnv
from toyenvs.rollout import rollout_arrays

ENV = toyenvs.make("tmaze", length=2)


def _tab():
    return toyenvs.TabularPolicy(ENV, K=1)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: rollout_arrays(ENV, _tab(), np.array([10**7]), 1, 0), r"tasks must be start states in 0\.\."),
        (lambda: rollout_arrays(ENV, _tab(), np.array([1.5]), 1, 0), r"tasks must be a non-empty 1-d integer array"),
        (lambda: rollout_arrays(ENV, _tab(), np.array([0]), -1, 0), r"^n_rollouts: must be an integer >= 1, got -1$"),
        (lambda: rollout_arrays(ENV, _tab(), np.array([0]), 1, True), r"^seed: must be an integer in 0\.\."),
        (lambda: rollout_arrays(ENV, _tab(), np.array([0]), 1, 2**70), r"^seed: must be an integer in 0\.\."),
        (lambda: rollout_arrays(ENV, _tab(), np.array([0]), 1, 0, buffers={}), r"^buffers: must come from alloc_buffers, missing \['group'"),
        (lambda: _tab().cover(ENV, np.array([999])), r"tasks must be start states in 0\.\."),
        (lambda: POMDPEnv(ENV, tasks=[-1]), r"tasks must be start states in 0\.\."),
        (lambda: POMDPEnv(ENV, tasks=[True]), r"tasks must be a non-empty 1-d integer array"),
        (lambda: ENV.optimal_values(float("nan")), r"^gamma: must be a finite number in \[0\.0, 1\.0\], got nan$"),
        (lambda: toyenvs.context_radix(3, 2, 2**60), r"K=1152921504606846976 contexts .* the int64 context code holds 63"),
        (lambda: toyenvs.context_radix(3, 2, 1.5), r"^K: must be an integer >= 0, got 1\.5$"),
        (lambda: toyenvs.rollout(None, _tab()), r"^env: must be a toyenvs\.POMDP \(toyenvs\.make\), got 'NoneType'$"),
        (lambda: toyenvs.rollout(ENV, None), r"^pol: must be a toyenvs\.TabularPolicy or NeuralPolicy, got 'NoneType'$"),
        (lambda: toyenvs.exact_ground_truth(ENV, None), r"^pol: must be a toyenvs\.TabularPolicy or NeuralPolicy"),
        # rows, codes and histories are integers as given (1.5 was row 1, True row 1)
        (lambda: _tab().probs([1.5]), r"^context_ids: must be an array of integers, got \[1\.5\]$"),
        (lambda: _tab().probs([True]), r"^context_ids: must be an array of integers, got \[True\]$"),
        (lambda: _tab().index_of([0.7]), r"^codes: must be an array of integers, got \[0\.7\]$"),
        (lambda: _tab().encode([1.5], [0], 0), r"^past_obs\[0\]: must be an integer in 0\.\."),
        (lambda: _tab().decode(1.5), r"^code: must be an integer in 0\.\."),
        # a branch share that would change nothing is still checked; depths are ASCII digits
        (lambda: toyenvs.rollout(ENV, _tab(), branch_budget=float("nan")), r"^branch_budget: must be a finite number in \(0\.0, 1\.0\], got nan$"),
        (lambda: toyenvs.rollout(ENV, _tab(), scheme="tree:\uff11", steps=20), r"^scheme: must be tree:D with D comma-separated depths"),
    ],
)  # fmt: skip
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_network_policy_refuses_bad_tasks_and_non_finite_parameters():
    pol = toyenvs.NeuralPolicy(ENV, K=1, width=8, layers=1)
    with pytest.raises(ValueError, match=r"tasks must be start states in 0\.\."):
        pol.cover(ENV, np.array([999]))
    with pytest.raises(ValueError, match=r"NeuralPolicy\.seed: must be an integer in 0\.\."):
        toyenvs.NeuralPolicy(ENV, K=1, seed=2**70)
    vec = pol.flat_parameters()
    with pytest.raises(ValueError, match=r"set_flat_parameters: parameter 0: must be a finite"):
        pol.set_flat_parameters(np.full_like(vec, np.nan))
    with pytest.raises(ValueError, match=r"set_flat_parameters: must be a float vector of the"):
        pol.set_flat_parameters(vec[:-1])
    pol.set_flat_parameters(vec)  # the right vector is taken


def test_ground_truths_name_rollouts_of_another_env_or_a_bare_batch():
    other = toyenvs.make("keydoor", size=5)
    rb = toyenvs.rollout(other, toyenvs.TabularPolicy(other, K=1), n_rollouts=2)
    mc = toyenvs.mc_ground_truth(ENV, _tab(), n_rollouts=5)
    ex = toyenvs.exact_ground_truth(ENV, _tab())
    with pytest.raises(ValueError, match=r"rollouts hold hidden states outside 0\.\.\d+ of this"):
        mc.advantage(rb)  # (the kernel would read the env's tables out of bounds)
    with pytest.raises(ValueError, match=r"not reachable in this ground truth's chain"):
        ex.advantage(rb)
    for gt in (mc, ex):
        with pytest.raises(ValueError, match=r"^rollouts: must be a toyenvs\.Rollouts"):
            gt.advantage(rb.batch)
