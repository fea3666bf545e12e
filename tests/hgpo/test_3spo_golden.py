"""The ``3spo`` estimator reproduces the 3SPO authors' code on frozen inputs (no torch needed).

``data/3spo_golden.json`` holds random batches (states revisited and shared across
trajectories and groups, singleton and tied step groups, successes and failures, counts past
the truncation threshold, several rollout groups, both count scopes and normalisations) and
what genalyu/3SPO's ``gigpo/core_3spo.py`` returned on them: the shaped step rewards of Eq. 2
(``compute_3spo_step_reward`` after ``update_statistics`` of every trajectory), the
allocations of Eq. 3 (``get_n_rollouts``) and the advantages (``compute_3spo_advantage``) with
float32 and with float64 step rewards. ``benchmarks/make_3spo_golden.py`` made it and says
which commit it ran and how.

The shaped rewards must equal ours to 1e-12 x max(1, |R|) and the allocations exactly; every
advantage must equal the float32 output to 1e-6 x max(1, |A|) or, where float32 rounding
throws that code off (a tied group, a near-tie, cancellation), the float64 output to
1e-7 x max(1, |A|); and the counts of each kind of agreement are those recorded.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.make_3spo_golden import case_batch, case_config, f32_causes, ours
from tests.hgpo.golden_replay import check_rows, load_golden

GOLDEN = load_golden("3spo")
CASES = GOLDEN["cases"]


def test_golden_file_is_described():
    assert GOLDEN["reference"] == "genalyu/3SPO@da38445778f859b0e7e3a740cc5afa92540b47c7"
    assert len(CASES) >= 24


@pytest.mark.parametrize("n", range(len(CASES)))
def test_3spo_reproduces_the_authors_code(n):
    case = CASES[n]
    a, shaped, alloc = ours(case)
    theirs = np.asarray(case["reference_shaped"])
    np.testing.assert_allclose(shaped, theirs, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(alloc, case["reference_n_rollouts"])
    cls = check_rows(a, case, f"case {n}")
    # the float32-only disagreements are float32's own: the float64 run agrees there
    for cause in f32_causes(case, theirs, np.flatnonzero(cls == 1)):
        assert cause in ("tied", "near-tie", "cancellation")
        assert not case["remove_std"]  # (x - mean alone is exact enough in float32)


def test_golden_covers_the_edge_cases():
    """The frozen inputs hold what the comparison is about."""
    assert {c["scope"] for c in CASES} == {"batch", "group"}
    assert {c["remove_std"] for c in CASES} == {True, False}
    # after the last step: new observations (no next_state), and next_state seen before
    assert any(c["terminal"] is None for c in CASES)
    assert any(c["terminal"] is not None and set(c["terminal"]) & set(c["state"]) for c in CASES)
    assert any(0 in c["reference_n_rollouts"] for c in CASES)  # truncated states
    assert any(1 in c["reference_n_rollouts"] for c in CASES)  # solved states
    assert any(8 in c["reference_n_rollouts"] for c in CASES)  # unsolved, not truncated
    assert any(c["classes"][1] > 0 for c in CASES)  # float32 rounding rows
    assert any(len(set(c["group"])) > 1 for c in CASES)
    # a state visited twice by one trajectory (counted once)
    assert any(len(set(zip(c["traj"], c["state"], strict=True))) < len(c["traj"]) for c in CASES)
    assert all(case_config(c).spo3_alpha == c["alpha"] for c in CASES)
    assert all(case_batch(c).n_steps == len(c["reward"]) for c in CASES)
