"""The ``hiper`` estimator reproduces the HiPER authors' code on frozen inputs (no torch needed).

``data/hiper_golden.json`` holds random batches (one-step and longer trajectories, segments of
one step and of several, intermediate, negative and zero rewards, invalid actions, KEEP
penalties in both modes, gamma and both lambdas at 0, 1 and between, with and without the
batch whitening, one critic head and two equal ones, rows handed over shuffled) and what
JonP07/HiPER-agent's ``hiper_hae/core_hae.py`` (``compute_hae_advantage``) returned on them:
the low-level advantage of an action token, the segment-level one of a subgoal token, the sum
a token in both masks gets and the low-level returns, from the code run with float64 in place
of its float32 and as published (float32). ``benchmarks/make_hiper_golden.py`` made it and
says which commit it ran and how.

Every output must equal the float64 run to 1e-9 x max(1, |x|) and the published float32 run to
1e-4 x max(1, |x|) (float32 rounding, amplified by the whitening of near-tied advantages).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.make_hiper_golden import F32_TOL, F64_TOL, OUTPUTS, case_config, max_rel, ours
from hgpo.hiper import HIPER_SOURCE
from tests.hgpo.golden_replay import load_golden

GOLDEN = load_golden("hiper")
CASES = GOLDEN["cases"]


def test_golden_file_is_described():
    assert GOLDEN["reference"] == HIPER_SOURCE
    assert HIPER_SOURCE == "JonP07/HiPER-agent@9d3c118bb38a690d41ec43fee70451af28b3affa"
    assert len(CASES) >= 32


@pytest.mark.parametrize("n", range(len(CASES)))
def test_hiper_reproduces_the_authors_code(n):
    case = CASES[n]
    a = ours(case)
    for k in OUTPUTS:
        f64 = np.asarray(case[f"reference_f64_{k}"])
        f32 = np.asarray(case[f"reference_f32_{k}"])
        assert max_rel(a[k], f64) <= F64_TOL, f"case {n}: {k}: ours {a[k]}, theirs {f64}"
        assert max_rel(a[k], f32) <= F32_TOL, f"case {n}: {k}: ours {a[k]}, float32 {f32}"


def test_golden_covers_the_edge_cases():
    """The frozen inputs hold what the comparison is about."""
    assert {c["segments"] for c in CASES} == {"reward", "step", "trajectory"}
    assert {c["norm_adv"] for c in CASES} == {True, False}
    assert {c["two_heads"] for c in CASES} == {True, False}
    assert {c["keep_penalty_mode"] for c in CASES if c["keep_penalty"] != 0} == {
        "normalized",
        "fixed",
    }
    assert {0.0, 1.0} <= {c["gamma"] for c in CASES}
    assert {0.0, 1.0} <= {c["lam_turn"] for c in CASES}
    assert {0.0, 1.0} <= {c["lam_seg"] for c in CASES}
    assert any(c["invalid_penalty"] > 0 and any(c["invalid"]) for c in CASES)
    assert any(c["order"] != sorted(c["order"]) for c in CASES)  # shuffled rows
    # a one-step trajectory, and a segment-level advantage that is neither 0 nor the low one
    assert any(np.bincount(c["traj"]).min() == 1 for c in CASES)
    assert any(
        np.any(np.abs(np.asarray(c["reference_f64_high"])) > 1e-6)
        and not np.allclose(c["reference_f64_sum"], c["reference_f64_low"])
        for c in CASES
    )
    assert all(case_config(c).eps == 1e-8 and case_config(c).std == "population" for c in CASES)
