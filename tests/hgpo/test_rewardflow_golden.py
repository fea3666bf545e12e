"""The ``rewardflow`` estimator reproduces the RewardFlow authors' code on frozen inputs (no
torch needed).

``data/rewardflow_golden.json`` holds random batches (states revisited and shared across
trajectories, self-loops, cycles, negative and intermediate rewards, terminal observations
that are states of the group or new ones, invalid actions, several rollout groups, both
modes) and what tmlr-group/RewardFlow returned on them: the propagated step rewards of
``apply_rewardflow_propagation`` and the advantages of
``compute_rewardflow_outcome_advantage`` with float32 and with float64 tensors.
``benchmarks/make_rewardflow_golden.py`` made it and says which commit it ran and how.

The step rewards must equal ours to 1e-12 x max(1, |d|); every advantage must equal the
float32 output to 1e-6 x max(1, |A|) or, where float32 rounding throws that code off, the
float64 output to 1e-7 x max(1, |A|); and the counts of each kind of agreement are those
recorded.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.make_rewardflow_golden import case_batch, case_config, ours
from tests.hgpo.golden_replay import check_rows, load_golden

GOLDEN = load_golden("rewardflow")
CASES = GOLDEN["cases"]


def test_golden_file_is_described():
    assert GOLDEN["reference"] == "tmlr-group/RewardFlow@1cdead8ef1104fc56dbd8d6937de0b57c82cd047"
    assert len(CASES) >= 24


@pytest.mark.parametrize("n", range(len(CASES)))
def test_rewardflow_reproduces_the_authors_code(n):
    case = CASES[n]
    a, d = ours(case)
    theirs = np.asarray(case["reference_step"])
    np.testing.assert_allclose(d, theirs, rtol=1e-12, atol=1e-12)
    check_rows(a, case, f"case {n}")
    f64 = np.asarray(case["reference_f64"])
    assert np.abs(a - f64).max() < 1e-7 * max(1.0, np.abs(a).max())


def _has_self_loop(c: dict) -> bool:
    s, t = np.asarray(c["state"]), np.asarray(c["traj"])
    return bool(((s[1:] == s[:-1]) & (t[1:] == t[:-1])).any())


def test_golden_covers_the_edge_cases():
    """The frozen inputs hold what the comparison is about."""
    assert {c["mode"] for c in CASES} == {"mean_norm", "mean_std_norm"}
    assert any(c["terminal"] is None for c in CASES)  # each trajectory ends in its own state
    assert any(c["terminal"] is not None and set(c["terminal"]) & set(c["state"]) for c in CASES)
    assert any(c["invalid"] is not None and any(c["invalid"]) for c in CASES)
    assert any(len(set(c["group"])) > 1 for c in CASES)
    assert any(_has_self_loop(c) for c in CASES)
    assert any(min(c["reward"]) < 0 for c in CASES)
    assert {0.0, 1.0} <= {c["gamma"] for c in CASES}
    assert any(c["classes"][1] > 0 for c in CASES)  # float32 rounding rows
    # propagation reaches back: some step reward is neither 0 nor an env reward
    assert any(set(np.round(c["reference_step"], 9)) - set(c["reward"]) - {0.0} for c in CASES)
    assert all(case_config(c).rewardflow_gamma == c["gamma"] for c in CASES)
    assert all(case_batch(c).n_steps == len(c["reward"]) for c in CASES)
